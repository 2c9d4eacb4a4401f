"""The conclusions of notebook 06 ("does it matter"), written from the noise and training results.

Each function returns Markdown that starts with :data:`analysis.conclusions.MARKER` and ends with the
inputs and limits it rests on, like :mod:`analysis.conclusions`.
"""

from __future__ import annotations

import pandas as pd

from .conclusions import _conclusion, _join, _missing, _range, count_range
from .decision import BIAS_LIMIT, ERROR_LIMIT, checkpoint_bias, peer_table, rule_lines, rule_table, study_rows
from .studies.noise import NOISE_SHAPE
from .studies.training import ARMS, final_losses

__all__ = ["emulation_agreement", "torch_claim", "error_against_noise", "training", "rule", "SOURCE_WORDS"]

SOURCE_WORDS = {"cuda": "on one H200 (cuBLAS, torch 2.11)", "cuda-emulated": "on the CUDA layouts emulated on CPU"}
NO_DATA = "No noise-study results yet (`python -m analysis noise`)."


def _policy_at(rows: pd.DataFrame, policy: str, chunks: int, column: str) -> pd.Series:
    """Per (family, dtype): the seed median of ``column`` for ``policy`` at ``chunks``."""
    picked = rows[(rows["policy"] == policy) & (rows["num_chunks"] == chunks) & (rows["layout"] == "cuda")]
    return picked.groupby(["family", "dtype"])[column].median()


def _best_source(noise: pd.DataFrame) -> tuple[str, pd.DataFrame]:
    rows = study_rows(noise)
    device = "cuda" if (rows["device"] == "cuda").any() else "cuda-emulated"
    return device, rows[(rows["device"] == device) & rows["dtype"].isin(["bfloat16", "float16"])]


def emulation_agreement(noise: pd.DataFrame) -> tuple[float, float, str] | None:
    """How closely the CPU emulation of the CUDA layouts reproduces the H200: the median and the largest relative
    difference of the seed-median weight-gradient floors over the (dtype, family, policy, chunk count) both
    measured on the same seeds, and where the largest is; None without both."""
    rows = study_rows(noise)
    rows = rows[rows["layout"] == "cuda"]
    seeds = set(rows[rows["device"] == "cuda"]["seed"]) & set(rows[rows["device"] == "cuda-emulated"]["seed"])
    if not seeds:
        return None
    rows = rows[rows["seed"].isin(seeds)]
    medians = rows.groupby(["dtype", "family", "policy", "num_chunks", "device"])["grad_weight_floors"].median()
    both = medians.unstack("device").dropna()
    if both.empty:
        return None
    difference = (both["cuda-emulated"] - both["cuda"]).abs() / both["cuda"]
    dtype, family, policy, chunks = difference.idxmax()
    return float(difference.median()), float(difference.max()), f"{policy} at {chunks} chunks, {family}, {dtype}"


def torch_claim(noise: pd.DataFrame) -> str:
    """06: does compact match balanced on CUDA (torch's reason to drop balanced)?"""
    if noise.empty:
        return _missing(NO_DATA)
    device, rows = _best_source(noise)
    most = int(rows["num_chunks"].max())
    compact = _policy_at(rows, "compact", most, "grad_weight_floors")
    balanced = _policy_at(rows, "balanced", most, "grad_weight_floors")
    one = _policy_at(rows, "compact", 1, "grad_weight_floors")
    bullets = []
    for dtype in ("bfloat16", "float16"):
        c, b = compact.xs(dtype, level="dtype"), balanced.xs(dtype, level="dtype")
        bullets.append(f"{dtype}: compact {_range(one.xs(dtype, level='dtype'))} floors at 1 chunk, "
                       f"{_range(c)} at {most} chunks (per family); balanced {_range(b)} at {most} chunks")
    agreement = emulation_agreement(noise)
    if agreement is not None:
        typical, largest, where = agreement
        bullets.append(f"the CPU emulation of the CUDA layouts (`noise.csv`) reproduces the H200's floors: median "
                       f"relative difference {100 * typical:.2g}% over every policy, chunk count, family and dtype "
                       f"(seed medians, the seeds both ran), largest {100 * largest:.0f}% ({where})")
    if (compact / balanced).min() > 1.5:
        finding = (f"No: {SOURCE_WORDS[device]}, compact's per-chunk `addmm_` into the bf16/fp16 gradient rounds "
                   f"the running sum once per chunk whatever cuBLAS accumulates inside one product, and its "
                   f"weight-gradient error grows with the chunk count to {_range(compact)} floors at {most} chunks, "
                   f"while balanced stays at {_range(balanced)} floors. Torch's premise (compact's bulk precision "
                   f"matches balanced) holds only for a single chunk.")
    else:
        finding = (f"{SOURCE_WORDS[device]}, compact at {most} chunks is {_range(compact)} floors against balanced's "
                   f"{_range(balanced)}: within 1.5x on some family, as torch's premise says.")
    return _conclusion(finding, bullets,
                       inputs=f"families {_join(sorted(rows['family'].unique()))} at N={NOISE_SHAPE.N}, "
                              f"D={NOISE_SHAPE.D}, C={NOISE_SHAPE.C}, {rows['seed'].nunique()} seeds (medians), lce "
                              f"with fp32 acc_dtype and explicit chunk sizes (`python -m analysis noise"
                              f"{' --device cuda' if device == 'cuda' else ''}`).",
                       limits="one shape (D=128; at LLM shapes aspect_ratio:2 gives 64–256 chunks, the range "
                              "measured here); torch's own op was not run on the GPU (torch 2.11 there has none): "
                              "compact is lce's layout with the arithmetic torch documents.")


def error_against_noise(noise: pd.DataFrame) -> str:
    """06: how each policy's error compares with the sampling noise of the same batch."""
    if noise.empty:
        return _missing(NO_DATA)
    device, rows = _best_source(noise)
    most = int(rows["num_chunks"].max())
    bias = {policy: _policy_at(rows, policy, most, "weight_bias_over_noise")
            for policy in ("accurate", "balanced", "compact")}
    error = {policy: _policy_at(rows, policy, most, "weight_error_over_noise")
             for policy in ("accurate", "balanced", "compact")}
    unfused = rows[rows["policy"] == "unfused"].groupby(["family", "dtype"])["weight_bias_over_noise"].median()
    def steps(policy: str) -> str:
        return _range(bias[policy] ** -2, ".2g")

    worst_error = max(s.max() for s in error.values())
    per_step = (f"Per step every policy's error hides in the sampling noise (whole-error/noise at most "
                f"{worst_error:.2g})" if worst_error < 1 else
                f"Some policy's error exceeds one step's sampling noise (whole-error/noise up to {worst_error:.2g})")
    finding = (f"{per_step}; what separates the policies is the error's component along the gradient, a bias: "
               f"compact's is {_range(bias['compact'], '.2g')} times the noise along it at {most} chunks (seed "
               f"medians per family and dtype), so it stands out of the averaged noise after {steps('compact')} "
               f"steps; balanced's is {_range(bias['balanced'], '.2g')} ({steps('balanced')} steps) and "
               f"accurate's {_range(bias['accurate'], '.2g')} ({steps('accurate')} steps); the unfused op in the "
               f"input dtype {_range(unfused, '.2g')}.")
    bullets = [f"{policy} at {most} chunks: bias/noise {_range(bias[policy], '.2g')}, error/noise "
               f"{_range(error[policy], '.2g')}" for policy in ("accurate", "balanced", "compact")]
    return _conclusion(finding, bullets,
                       inputs=f"{SOURCE_WORDS[device]}; families {_join(sorted(rows['family'].unique()))}, bf16 "
                              f"and fp16, N={NOISE_SHAPE.N} rows per batch, {rows['seed'].nunique()} seeds.",
                       limits="the noise is that of one batch of 1024 rows (it shrinks as 1/sqrt(batch): a 16x "
                              "larger batch makes every ratio 4x larger); the input gradient's ratio treats the layers "
                              "below as the identity; the bias→steps reading assumes a steady bias and independent "
                              "noise from step to step.")


def training(table: pd.DataFrame, noise: pd.DataFrame, device: str) -> str:
    """06: the final held-out loss gap of each arm to the fp32 head, beside the seed-to-seed spread."""
    rows = table[(table["device"] == device) & (table["setting"] == "full")]
    if rows.empty:
        return _missing(f"No full training results on {device} yet (`python -m analysis train`).")
    last = final_losses(rows)
    fp32 = last[last["arm"] == ARMS[0].name]["loss"]
    spread = fp32.max() - fp32.min() if len(fp32) > 1 else float("nan")
    gaps = last[(last["arm"] != ARMS[0].name) & last["gap"].notna()]
    if gaps.empty:
        return _missing(f"No finished pair of runs (an arm and the fp32 head of the same seed) on {device} yet.")
    widest = gaps.loc[gaps["gap"].abs().idxmax()]
    bullets = []
    for arm in [a.name for a in ARMS[1:]]:
        arm_gaps = gaps[gaps["arm"] == arm]["gap"]
        if len(arm_gaps):
            bullets.append(f"{arm}: {arm_gaps.mean():+.3f} nats (seeds: {_range(arm_gaps, '+.3f')}; "
                           f"{len(arm_gaps)} seed{'s' if len(arm_gaps) > 1 else ''})")
    compact_bias = checkpoint_bias(noise)
    compact_bias = compact_bias[compact_bias["device"] == ("cuda" if device == "cuda" else "cuda-emulated")]
    steps = int(rows["steps"].max())
    during = (f" Compact's bias/noise (256 chunks, bf16) on the fp32 run's snapshots was "
              f"{_range(compact_bias['median'], '.2g')} (steps {_join([str(int(s)) for s in compact_bias['step']])}), "
              f"above the 1/sqrt(steps) = {steps ** -0.5:.2g} at which a steady bias would stand out by the end of "
              f"the run: the r**-2 reading is conservative at this scale." if not compact_bias.empty else "")
    where = "one H200" if device == "cuda" else f"CPU ({rows['cpu_model'].iloc[0]}, CUDA layouts emulated)"
    spread_text = (f"the fp32 head alone varies by {spread:.3f} nats between seeds" if spread == spread
                   else "one finished fp32 seed, so no seed-to-seed spread yet")
    if spread == spread and abs(widest["gap"]) <= spread:
        finding = (f"No arm can be told from the fp32 head after {steps} steps on {where}: the largest final held-out "
                   f"gap is {widest['gap']:+.3f} nats ({widest['arm']}) while {spread_text}; arms of the same seed "
                   f"drift apart by a few hundredths as soon as any rounding differs.{during}")
    else:
        finding = (f"After {steps} steps on {where} the largest final held-out gap to the fp32 head is "
                   f"{widest['gap']:+.3f} nats ({widest['arm']}); {spread_text}.{during}")
    seeds = rows.groupby("arm")["seed"].nunique()
    return _conclusion(finding, bullets,
                       inputs=f"TinyLM (D=128, 4 layers, C=16384), {int(rows['batch_rows'].max())} tokens per step, "
                              f"{count_range(seeds)} seeds per arm, same initialisation and batches per seed, "
                              f"held-out loss on 2048 tokens in fp32 (`python -m analysis train"
                              f"{' --device cuda' if device == 'cuda' else ''}`).",
                       limits="a small model, a few hundred steps and one vocabulary: a gap below the arm-to-arm "
                              "drift is all such runs can resolve; they say nothing about 10⁴–10⁶ steps at "
                              "128k–256k classes, where compact's bias has far longer to act.")


def rule(noise: pd.DataFrame) -> str:
    """06: the decision rule, each "auto" entry against it, and the peers' picks."""
    if noise.empty:
        return _missing(NO_DATA)
    table = rule_table(noise)
    peers = peer_table(noise)
    failing = peers[~peers["passes"]]
    peer_text = _join([f"{row.rule} in {row.dtype} ({row.policy}, {row.num_chunks} chunks: bias/noise "
                       f"{row.weight_bias_over_noise:.2g} on {row.worst_family})" for row in failing.itertuples()])
    finding = (f"Every \"auto\" entry meets the rule ({int(table['passes'].sum())} of {len(table)}): bias/noise at "
               f"most {BIAS_LIMIT} and error/noise at most {ERROR_LIMIT} on the worst input family. "
               if table["passes"].all() else
               f"{int((~table['passes']).sum())} \"auto\" entries fail the rule. ")
    finding += (f"The peers' CUDA picks that fail it: {peer_text}." if peer_text else "Every peer pick meets it too.")
    return _conclusion(finding, rule_lines(noise),
                       inputs="the noise-study results (real-GPU rows for the CUDA entries where committed, the "
                              "CPU's for the CPU entries), worst family, seed medians.",
                       limits="the limits extrapolate the training study's reading of a bias (r**-2 steps to stand "
                              "out) from 300 to 10⁴ steps; the ratios are at N=1024 rows per batch.")
