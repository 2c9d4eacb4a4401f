"""When a gradient error matters: the error/noise rule every "auto" pick must meet, and its evidence.

The rule's conditions are stated once, in :mod:`lce.decide` (the decision procedure "auto" and ``lce.recommend``
come from); this module checks them on measured data. Lying on an error-memory front
(:mod:`analysis.judge.pareto`) is not a condition: the fronts show the trade, the procedure's objective
(:data:`lce.decide.OBJECTIVE`) makes it. On the committed noise-study data (:mod:`analysis.studies.noise`) a pick
must keep

* its weight-gradient **bias** below :data:`BIAS_LIMIT` of the sampling noise along the gradient
  (``weight_bias_over_noise``): a systematic error does not average out, and a bias ``r`` times the
  per-step noise needs about ``r**-2`` steps of averaging before it stands out of the noise, so
  ``r <= 0.01`` means 10^4 steps, the length of a short LLM fine-tune;
* its Frobenius errors below :data:`ERROR_LIMIT` of the sampling noise (``weight_error_over_noise``,
  ``input_error_over_noise``): an independent error ``r`` times the noise adds ``r**2`` to the
  gradient's variance, 1% at 0.1, the variance of a batch 1% smaller.

Ratios are medians over seeds; the worst input family decides. CUDA picks are judged on real-GPU
data when the results hold it (``device == "cuda"``), else on the CPU emulation of the layouts.

Why these limits. The 300-step training study (:mod:`analysis.studies.training`) cannot tell any arm from
the fp32 head, compact included, so it only shows the ``r**-2`` reading to be conservative at that length.
The bias limit rests on the head-only study (:mod:`analysis.studies.head_training`, notebook 10), which
trains the head alone for 10^4 steps per arm, 3 seeds, and measures each arm's bias ratio along the run.
Counting a held-out gap to the fp32 head when it exceeds the fp32 head's own spread over seeds
(:mod:`analysis.judge.horizon`), its bf16 arms bracket the threshold for 10^4 steps
(:func:`~analysis.judge.horizon.bias_bracket`); scaled by the ``r**-2`` reading to 10^5 steps, the bracket
holds :data:`BIAS_LIMIT` (a claims test keeps it there). The ratio is not sufficient: fp16 compact passes it
and changes the rare classes' loss most (its tiny per-chunk products are lost in fp16, and Adam stops moving
those coordinates). So an auto pick must also pass the **training condition**: the head-only arm standing
for it counts in no bucket (:func:`analysis.judge.horizon.rule_verdicts`, checked by
``tests/claims/test_nb10_long_horizon.py``).
"""

from __future__ import annotations

import pandas as pd
import torch

import lce
from analysis.core.problem import LLM_SHAPES, Shape
from analysis.judge.pareto import seed_interval
from analysis.studies.noise import AUTO_CPU, NOISE_SHAPE, chunk_rules, study_rows
from lce import decide
from lce.planning.policies import AUTO_TABLE
from lce.testing import emulate_device_kind

__all__ = ["BIAS_LIMIT", "ERROR_LIMIT", "LLM_SHAPES", "RATIO_COLUMNS", "study_rows", "pick_rows", "rule_table",
           "rule_lines", "rule_checks", "peer_table", "checkpoint_bias", "memory_at_llm_shapes", "policy_costs"]

BIAS_LIMIT = decide.BIAS_LIMIT
ERROR_LIMIT = decide.NOISE_ERROR_LIMIT
RATIO_COLUMNS = ("weight_bias_over_noise", "weight_error_over_noise", "input_error_over_noise")
LIMITS = {"weight_bias_over_noise": BIAS_LIMIT, "weight_error_over_noise": ERROR_LIMIT,
          "input_error_over_noise": ERROR_LIMIT}


def _source(rows: pd.DataFrame, kind: str) -> tuple[str, pd.DataFrame]:
    if kind == "cuda" and (rows["device"] == "cuda").any():
        return "cuda", rows[rows["device"] == "cuda"]
    return "cuda-emulated", rows[rows["device"] == "cuda-emulated"]


def pick_rows(noise: pd.DataFrame, kind: str, dtype: torch.dtype) -> tuple[str, pd.DataFrame]:
    """``(source, rows)`` of the "auto" pick for ``(kind, dtype)`` in the noise study: on CUDA the policy and
    chunk count "auto" resolves to at the study's shape (source "cuda" on a GPU, else "cuda-emulated"), on
    the CPU the CPU table's own run (source "cpu")."""
    from lce.planning.options import dtype_name

    source, rows = _source(study_rows(noise), kind)
    rows = rows[rows["dtype"] == dtype_name(dtype)]
    if kind == "cpu":
        return "cpu", rows[rows["impl"] == AUTO_CPU]
    policy, chunks = chunk_rules(NOISE_SHAPE, dtype)["lce auto"]
    return source, rows[(rows["policy"] == policy) & (rows["num_chunks"] == chunks) & (rows["layout"] == "cuda")]


def _ratios(rows: pd.DataFrame) -> pd.DataFrame:
    """Per family: the median of each ratio over seeds, with its interval
    (:func:`analysis.judge.pareto.seed_interval`)."""
    return seed_interval(rows, list(RATIO_COLUMNS), by=["family"]).set_index("family")


def _worst(per_family: pd.DataFrame, label: dict[str, object]) -> dict[str, object]:
    family = per_family["weight_bias_over_noise"].idxmax()
    row = {**label, "worst_family": family, "families": len(per_family), "seeds": int(per_family["seeds"].min())}
    for column in RATIO_COLUMNS:
        row[column] = per_family[column].max()
        row[f"{column}_high"] = per_family[f"{column}_high"].max()
    row["passes"] = all(row[column] <= limit for column, limit in LIMITS.items())
    return row


def rule_table(noise: pd.DataFrame) -> pd.DataFrame:
    """One row per "auto" entry: the pick, where its ratios were measured, the worst family's medians, pass/fail."""
    from lce.planning.options import dtype_name

    rows = []
    for (kind, dtype), pick in AUTO_TABLE.items():
        source, picked = pick_rows(noise, kind, dtype)
        label = {"device": kind, "dtype": dtype_name(dtype), "pick": f"{pick.acc_policy} {pick.chunking_method}",
                 "source": source}
        if picked.empty:
            rows.append({**label, "passes": False, "worst_family": "(no data)"})
            continue
        rows.append(_worst(_ratios(picked), label))
    return pd.DataFrame(rows)


def peer_table(noise: pd.DataFrame) -> pd.DataFrame:
    """The same ratios for the CUDA rules of :func:`~analysis.studies.noise.chunk_rules` (lce auto, torch 2.13's
    default, torch pull request 187838's), per dtype, on the best source of CUDA data."""
    source, rows = _source(study_rows(noise), "cuda")
    table = []
    for dtype_text in ("bfloat16", "float16"):
        dtype = getattr(torch, dtype_text)
        for rule, (policy, chunks) in chunk_rules(NOISE_SHAPE, dtype).items():
            picked = rows[(rows["dtype"] == dtype_text) & (rows["policy"] == policy) & (rows["num_chunks"] == chunks)
                          & (rows["layout"] == "cuda")]
            if not picked.empty:
                table.append(_worst(_ratios(picked), {"rule": rule, "dtype": dtype_text, "policy": policy,
                                                      "num_chunks": chunks, "source": source}))
    return pd.DataFrame(table)


def rule_checks(noise: pd.DataFrame) -> list[str]:
    """The "auto" entries that fail the rule (or lack data), as lines; empty when all pass."""
    table = rule_table(noise)
    return [f"{row.device} {row.dtype}: {row.pick} on {row.worst_family}" for row in table.itertuples()
            if not row.passes]


def rule_lines(noise: pd.DataFrame) -> list[str]:
    """One sentence per "auto" entry: its worst-family bias and error ratios against the limits."""
    lines = []
    for row in rule_table(noise).itertuples():
        if row.worst_family == "(no data)":
            lines.append(f"{row.device} {row.dtype} ({row.pick}): no noise-study data")
            continue
        verdict = "meets" if row.passes else "FAILS"
        where = {"cuda": "H200", "cpu": "CPU"}.get(row.source, "CUDA layouts emulated on CPU")
        lines.append(f"{row.device} {row.dtype} ({row.pick}, {where}): "
                     f"bias/noise {row.weight_bias_over_noise:.2g} (limit {BIAS_LIMIT}), error/noise "
                     f"{max(row.weight_error_over_noise, row.input_error_over_noise):.2g} (limit {ERROR_LIMIT}), "
                     f"worst on {row.worst_family} over {int(row.seeds)} seeds: {verdict} the rule")
    return lines


def checkpoint_bias(noise: pd.DataFrame, policy: str = "compact", chunks: int = 256) -> pd.DataFrame:
    """The bias ratio of ``policy`` at ``chunks`` on the training study's fp32-arm snapshots, per device, dtype
    and step (median and range over seeds)."""
    rows = noise[noise["step"].notna()] if "step" in noise else noise.iloc[:0]
    rows = rows[(rows["policy"] == policy) & (rows["num_chunks"] == chunks)]
    grouped = rows.groupby(["device", "dtype", "step"])["weight_bias_over_noise"]
    return pd.DataFrame({"median": grouped.median(), "min": grouped.min(), "max": grouped.max(),
                         "seeds": grouped.size()}).reset_index()


def memory_at_llm_shapes(shapes: tuple[Shape, ...] = LLM_SHAPES, dtype: torch.dtype = torch.bfloat16,
                         chunking: str = "aspect_ratio:2") -> pd.DataFrame:
    """lce's predicted peak extra bytes (its memory model) per CUDA policy at ``shapes`` (fp32 ``acc_dtype``,
    ``chunking``), and what compact saves against balanced and accurate. Nothing is allocated."""
    rows = []
    for shape in shapes:
        x = torch.empty(shape.N, shape.D, dtype=dtype, device="meta", requires_grad=True)
        w = torch.empty(shape.C, shape.D, dtype=dtype, device="meta", requires_grad=True)
        row: dict[str, object] = {"shape": str(shape)}
        with emulate_device_kind("cuda"):
            for policy in ("accurate", "balanced", "compact"):
                options = lce.LinearCrossEntropyOptions(acc_policy=policy, chunking_method=chunking,
                                                        acc_dtype=torch.float32)
                plan = lce.plan(x, w, options=options)
                row[f"{policy}_gib"] = plan.peak_extra_bytes / 2**30
                row["num_chunks"] = plan.num_chunks
        row["compact_saves_vs_balanced_gib"] = row["balanced_gib"] - row["compact_gib"]
        rows.append(row)
    return pd.DataFrame(rows)


def policy_costs(noise: pd.DataFrame, training: pd.DataFrame, chunks: int = 256) -> pd.DataFrame:
    """Per CUDA policy in bf16: what it costs at the LLM shapes (predicted peak GiB, lce's memory model), its
    worst-family bias/noise at ``chunks`` chunks, and the training study's final held-out gap to the fp32 head
    (mean over seeds, and the seeds' range) on each device that trained it."""
    from analysis.studies.training import final_losses

    memory = memory_at_llm_shapes()
    source, rows = _source(study_rows(noise), "cuda")
    rows = rows[(rows["dtype"] == "bfloat16") & (rows["layout"] == "cuda") & (rows["num_chunks"] == chunks)]
    full = training[training["setting"] == "full"] if "setting" in training else training.iloc[:0]
    table = []
    for policy in ("accurate", "balanced", "compact"):
        row: dict[str, object] = {"policy": policy}
        for shape, gib in zip(memory["shape"], memory[f"{policy}_gib"], strict=True):
            row[f"GiB at {shape}"] = gib
        picked = rows[rows["policy"] == policy]
        if not picked.empty:
            row[f"bias/noise ({'H200' if source == 'cuda' else 'emulated'})"] = \
                _ratios(picked)["weight_bias_over_noise"].max()
        for device in ("cuda", "cpu"):
            here = full[full["device"] == device]
            gaps = final_losses(here) if not here.empty else pd.DataFrame(columns=["arm", "gap"])
            gaps = gaps[(gaps["arm"] == f"bf16 {policy}") & gaps["gap"].notna()]["gap"]
            label = "H200" if device == "cuda" else "CPU"
            row[f"gap vs fp32, {label} (nats)"] = (f"{gaps.mean():+.3f} [{gaps.min():+.3f}, {gaps.max():+.3f}], "
                                                   f"{len(gaps)} seed{'s' if len(gaps) != 1 else ''}"
                                                   if len(gaps) else "not run")
        table.append(row)
    return pd.DataFrame(table)


# ---- python -m analysis verdicts -----------------------------------------------------------------------------

DESCRIPTION = "Reads the sweep results and the noise study; measures nothing."


def add_arguments(parser) -> None:
    from analysis.core.arguments import results_option

    results_option(parser, "folder of results files")


def run(args) -> None:
    from analysis.core.results_io import NOISE, load_kind
    from analysis.judge.pareto import load_table, verdict_lines

    _, table = load_table(args.results)
    print("\n".join(verdict_lines(table)))
    _, noise = load_kind(args.results, NOISE.name)
    if not noise.empty:
        print("\n".join(f"error/noise rule: {line}" for line in rule_lines(noise)))
