"""Every notebook conclusion on small hand-built tables: the right numbers, verdict words and limits."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.judge.pareto import ERROR, VS_UNFUSED, prepare
from analysis.report import nb02_accuracy, nb03_memory, nb04_pareto, wording
from analysis.report.notebooks import MARKER

PROVENANCE = {"cpu_model": "Test CPU 9000", "num_threads": 1, "seed": 0}


def _sections(text: str) -> tuple[str, str, str]:
    """(finding with its bullets, inputs, limits) of a conclusion; each must be there, in this order."""
    assert text.startswith(MARKER), text[:40]
    body, rest = text.split("\n\n*Inputs:* ", 1)
    inputs, limits = rest.split("\n\n*Limits:* ", 1)
    return body, inputs, limits


def test_random_family_reads_its_variance_from_the_family():
    assert wording.random_family() == ("`random` inputs (x ~ N(0, 1), W ~ N(0, 9/D), b ~ N(0, 1), "
                                           "uniform targets)")
    assert "b ~" not in wording.random_family(bias=False)


# --- 02 --------------------------------------------------------------------------------------------------------


def _sweep_row(op, policy, dtype, error, loss, *, acc="default", chunking="auto", device="cpu", N=64) -> dict:
    return {"op": op, "policy": policy, "dtype": dtype, ERROR: error, "loss_fro_in_floors": loss,
            "acc_dtype": acc, "chunking": chunking, "device": device, "N": N, "D": 8, "C": 256, **PROVENANCE}


def test_policy_errors_quotes_medians_per_dtype():
    rows = [
        _sweep_row("lce", "auto", "bfloat16", 1.0, 1.0), _sweep_row("lce", "auto", "bfloat16", 1.2, 1.0, N=128),
        _sweep_row("torch", "auto", "bfloat16", 4.0, 30.0), _sweep_row("torch", "auto", "bfloat16", 6.0, 50.0, N=128),
        _sweep_row("lce", "compact", "bfloat16", 5.0, 1.0),
        _sweep_row("lce", "balanced", "bfloat16", 1.5, 1.0, acc="float32"),
        _sweep_row("lce", "auto", "float32", 14.0, 1.0), _sweep_row("torch", "auto", "float32", 19.0, 18.0),
        _sweep_row("lce", "auto", "bfloat16", 99.0, 99.0, chunking="aspect_ratio"),  # not default chunking
    ]
    body, inputs, limits = _sections(nb02_accuracy.policy_errors(pd.DataFrame(rows)))
    assert ("With default options in bf16 and fp16, lce is at 1.00–1.20 rounding floors on its worst gradient and "
            "1.00 on the loss, torch 2.13 at 4.00–6.00 and 30.00–50.00") in body
    assert "**random, bfloat16**, default options: lce 1.00–1.20 on its worst gradient" in body
    assert "Explicit policies without acc_dtype (computing in bfloat16): lce 5.00" in body
    assert "with `acc_dtype=float32`, lce balanced 1.50" in body
    assert ("**random, float32**, default options: lce 14.00 on its worst gradient and 1.00 on the loss; "
            "torch 19.00") in body
    assert "99" not in body and "[" not in body  # one seed: no interval to quote
    assert "shapes 64×8×256 and 128×8×256 (N×D×C)" in inputs and "Test CPU 9000, 1 thread" in inputs
    assert "one seed (0)" in inputs and "`random` inputs (x ~ N(0, 1)" in inputs
    assert "one seed, so no error bars" in limits and "one CPU (Test CPU 9000)" in limits


def test_policy_errors_per_family_with_seed_intervals_and_the_unfused_ratio():
    lce = [1.0, 1.1, 1.2, 1.3, 3.0]
    rows = []
    for seed, error in enumerate(lce):
        for family, scale in (("random", 1.0), ("calibrated", 2.0)):
            common = dict(seed=seed, family=family)
            rows += [_sweep_row("lce", "auto", "bfloat16", error * scale, 1.0) | common,
                     _sweep_row("torch", "auto", "bfloat16", 5.0, 40.0) | common,
                     _sweep_row("lce", "auto", "float32", 14.0, 1.0) | common | {VS_UNFUSED: 1.1 + 0.1 * seed}]
    body, inputs, limits = _sections(nb02_accuracy.policy_errors(pd.DataFrame(rows)))
    low, high = np.percentile(lce, [5, 95])
    assert f"**random, bfloat16**, default options: lce 1.20 [{low:.2f}–{high:.2f}] on its worst gradient" in body
    assert f"**calibrated, bfloat16**, default options: lce 2.40 [{2 * low:.2f}–{2 * high:.2f}]" in body
    assert "on calibrated inputs, lce is at 2.40 rounding floors" in body and "on random inputs, lce is at 1.20" in body
    assert "lce 14.00 [14.00–14.00] on its worst gradient (1.3x the unfused fp32 computation's own error)" in body
    assert "5 seeds (0, 1, 2, 3 and 4), medians over seeds with the 5th–95th percentile over seeds" in inputs
    assert "`calibrated` inputs (a synthetic head with a trained one's traits: a Zipf class prior" in inputs
    assert "no error bars" not in limits and "one small shape per family" in limits


def test_family_descriptions():
    assert wording.family_description("random") == wording.random_family()
    assert "mean loss of 0.5 nats" in wording.family_description("calibrated:0.5")
    assert wording.family_description("trained") == (
        "`trained` inputs (hidden states, head weights and targets of the small LM trained here on the CPython "
        "standard library, checkpoint final)")


def test_chunk_growth_separates_growing_from_flat_series():
    runs = pd.DataFrame({"impl": "lce", "policy": "compact", "chunks": [1, 4, 64], "dtype": "bfloat16",
                         "acc_dtype": "float32", "device": ["cpu", "cpu", "cuda-emulated"], "N": 512, "D": 64,
                         "C": 2048, "seed": 0})
    fits = pd.DataFrame({"impl": ["lce", "lce", "torch"], "policy": ["compact", "accurate", "compact"],
                         "exponent": [0.48, 0.01, 0.3], "prefactor": [1.0, 1.0, 2.0],
                         "at_max_chunks": [7.5, 1.0, 9.0], "layouts": ["emulated CUDA", "CPU", "CPU"]})
    body, inputs, limits = _sections(nb02_accuracy.chunk_growth(runs, fits, cpu="Test CPU 9000"))
    assert "2 of 3 series have a fitted exponent above 0.2 (0.30–0.48)" in body
    assert "- lce compact (emulated CUDA layouts): error ∝ chunks^0.48, 7.50 floors at 64 chunks" in body
    assert "accurate policy, which sums in fp32 and rounds once, stays at 1.00 floors at 64 chunks" in body
    assert "flat (exponent ≤ 0.2): lce accurate (CPU, 0.01)" in body
    assert "chunk counts 1, 4 and 64" in inputs and "bfloat16 with acc_dtype=float32" in inputs
    assert "lce's CUDA layouts emulated on CPU tensors" in inputs and "one seed (0)" in inputs
    assert "fits to 3 points" in limits and "emulated on CPU tensors" in limits


def test_loss_drift_worst_over_seeds_and_lce_rounding():
    drift = pd.DataFrame({"impl": ["torch", "lce"] * 4, "chunks": [1, 1, 64, 64] * 2, "dtype": "bfloat16",
                          "N": 1024, "D": 128, "C": 4096, "seed": [0, 0, 0, 0, 1, 1, 1, 1],
                          "ulps_from_exact": [0.1, 0.2, 3.0, 0.3, 0.4, 0.1, 12.0, 0.5]})
    body, inputs, _ = _sections(nb02_accuracy.loss_drift(drift, cpu="x"))
    assert "torch's loss is up to 0.40 ulps from the exact loss at 1 chunk and up to 12.00 at 64 (worst over 2 " \
           "seeds)" in body
    assert "lce's loss is correctly rounded (≤ 0.5 ulp) at every chunk count, at most 0.50 ulps" in body
    assert "2 seeds (0 and 1)" in inputs
    off = drift.assign(ulps_from_exact=[0.1, 0.2, 3.0, 2.5, 0.4, 0.1, 12.0, 0.5])
    assert "**2.50 ulps** off" in nb02_accuracy.loss_drift(off, cpu="x")


def test_all_ignored_names_the_op_with_nan_gradients():
    table = pd.DataFrame({"impl": ["reference", "lce", "torch"], "dtype": "float32", "N": 64, "D": 16, "C": 100,
                          "seed": 0, "chunk_rows": [None, 16, 16], "reduction": "mean",
                          "loss": [math.nan, math.nan, math.nan], "grad_input_nan_entries": [0, 0, 1024],
                          "grad_weight_nan_entries": [0, 0, 1600], "max_abs_finite_grad": [0.0, 0.0, 0.0]})
    body, inputs, limits = _sections(nb02_accuracy.all_ignored(table, cpu="x"))
    assert body.startswith(f"{MARKER} With every target ignored, lce returns zero gradients, as the reference does; "
                           "torch returns NaN gradients")
    assert "- torch: mean loss NaN, **2,624 NaN gradient entries**" in body
    assert "- lce: mean loss NaN, finite gradients, largest |entry| 0 (all zero)" in body
    assert "16-row chunks" in inputs and "shape 64×16×100" in inputs and "one reduction" in limits


# --- 03 --------------------------------------------------------------------------------------------------------


def test_memory_model_counts_runs_within_the_band():
    table = pd.DataFrame({"op": "lce", "device": "cpu", "dtype": "bfloat16", "policy": ["accurate", "compact", "auto"],
                          "acc_dtype": "default", "peak_bytes_measured": [100.0, 150.0, 90.0],
                          "peak_bytes_modeled": [100.0, 100.0, 100.0], "memory_method": "profiler", "N": 64,
                          "D": 8, "C": 256, **PROVENANCE})
    body, inputs, limits = _sections(nb03_memory.memory_model(table))
    assert "within ±15% on 2 of 3 runs (measured/modeled 0.90–1.50, median 1.00)" in body
    assert "Outside it, all 1 measure more than predicted" in body
    assert "- bfloat16 compact acc=default: 1 runs outside, measured/modeled 1.50" in body
    assert "(profiler)" in inputs and "CPU allocator only" in limits


def _breakdown() -> pd.DataFrame:
    mib = 2**20
    rows = [("lce auto", "weight_grad_accumulator", "float32", "call", 16 * mib, 40 * mib),
            ("lce auto", "logits_chunk", "float32", "chunk", 8 * mib, 40 * mib),
            ("lce compact", "logits_chunk", "bfloat16", "chunk", 4 * mib, 10 * mib)]
    return pd.DataFrame([{"config": c, "buffer": b, "buffer_dtype": d, "span": s, "nbytes": n,
                          "predicted_peak_bytes": p, "dtype": "bfloat16", "N": 2048, "D": 256, "C": 16384,
                          "git_revision": "abc123"} for c, b, d, s, n, p in rows])


def test_buffer_breakdown_names_what_the_smaller_plan_lacks():
    body, inputs, limits = _sections(nb03_memory.buffer_breakdown(_breakdown()))
    assert "peaks from 10.0 MiB (lce compact) to 40.0 MiB (lce auto), 4.0x apart" in body
    assert "lce compact has no weight_grad_accumulator (float32, 16.0 MiB)." in body
    assert "- lce auto: predicted peak 40.0 MiB, 2 buffers; largest weight_grad_accumulator (float32, call, " \
           "16.0 MiB) and logits_chunk (float32, chunk, 8.0 MiB)" in body
    assert "shape 2048×256×16384" in inputs and "abc123" in inputs and "a plan, not a measurement" in limits


def test_memory_trace_against_prediction_and_reference():
    from analysis.studies.memory_study import peaks

    mib = 2**20
    trace = pd.DataFrame({"config": ["lce auto"] * 2 + ["reference"] * 2, "event": [0, 1, 0, 1],
                          "live_bytes": [10 * mib, 40 * mib, 50 * mib, 160 * mib], "dtype": "bfloat16", "N": 2048,
                          "D": 256, "C": 16384, "cpu_model": "Test CPU 9000", "num_threads": 2})
    table = peaks(trace, _breakdown())
    assert table["predicted_mib"].tolist()[0] == 40.0 and np.isnan(table["predicted_mib"].tolist()[1])
    body, inputs, limits = _sections(nb03_memory.memory_trace(table, trace))
    assert "lce's configurations peak at 40.0 MiB, within 1.00x of their predicted peaks" in body
    assert "reference peaks at 160.0 MiB" in body
    assert "- lce auto: 40.0 MiB (predicted 40.0, measured/predicted 1.00), 0.25x the reference" in body
    assert "Test CPU 9000, 2 threads" in inputs and "b ~" not in inputs and "CPU allocator only" in limits


# --- 04 --------------------------------------------------------------------------------------------------------


def _table(rows: list[dict]) -> pd.DataFrame:
    """A prepared sweep table from short rows (errors: every output's rel_fro/max_rel set to the error)."""
    full = []
    for row in rows:
        error = row.pop("error")
        full.append({"status": "ok", "acc_dtype": "default", "device": "cpu", "D": 8, "C": 256, "N": 64,
                     "resolved_policy": row["policy"], "resolved_acc_dtype": row.get("dtype", "float32"),
                     "peak_bytes_modeled": row["peak"] * 2**20, "peak_bytes_measured": row.pop("peak") * 2**20,
                     "time_median_s": row.pop("time") / 1e3, "time_repeats": 3, "grad_input_fro_in_floors": error,
                     "grad_weight_fro_in_floors": error, "grad_bias_fro_in_floors": np.nan,
                     "grad_weight_rel_fro": error * 1e-7, "grad_bias_rel_fro": error * 2e-7, **PROVENANCE, **row})
    return prepare(pd.DataFrame(full))


def _fp32_table() -> pd.DataFrame:
    rows = []
    for n in (64, 128):
        for policy in ("auto", "accurate", "compact"):  # same numbers for each chunking
            rows.append(dict(op="lce", policy=policy, chunking="aspect_ratio:2", chunk_size=n // 4, N=n,
                             dtype="float32", error=10.0, peak=1.0, time=30.0 + (policy == "compact")))
            rows.append(dict(op="lce", policy=policy, chunking="auto", chunk_size=n, N=n, dtype="float32",
                             error=12.0, peak=4.0, time=10.0 + (policy == "accurate")))
    return _table(rows)


def test_fp32_choice_names_ties_and_picks_by_the_rule():
    body, inputs, limits = _sections(nb04_pareto.fp32_choice(_fp32_table()))
    assert "The policy does not matter" in body
    assert "on cpu, `aspect_ratio:2` for memory × error and the default chunking for time × error" in body
    assert ("**cpu, memory × error**: `lce auto ar:2` (score 0.00, 10.00 floors, 1.00 MiB) — a tie of 3 spellings "
            "that compute the same numbers: `lce auto ar:2`, `lce accurate ar:2` and `lce compact ar:2`") in body
    assert "The current default (`lce auto auto`) is choice 2 of 2" in body
    assert "**cpu, time × error**: `lce auto auto`" in body and "differ only by timing noise" in body
    assert "The current default (`lce auto auto`) is this choice" in body
    assert "ties: configurations that compute the same numbers" in inputs and "fewest explicit options" in inputs
    assert "one seed, so no error bars" in limits


def test_fp32_choice_keeps_different_numbers_apart():
    table = _fp32_table()
    table.loc[(table["policy"] == "compact") & (table["chunking"] == "auto"), "grad_weight_rel_fro"] *= 1.5
    body, _, _ = _sections(nb04_pareto.fp32_choice(table))
    assert "The policy does not matter" not in body and "By the data" in body
    assert "on cpu the policy makes no difference" not in body


def _verdict(**fields) -> dict:
    base = dict(family="random", device="cpu", dtype="bfloat16", shape="64x8x256", pick="accurate aspect_ratio",
                listed=True, seeds=1, error=1.0, error_low=1.0, error_high=1.0, vs_unfused=math.nan, peak_mib=12.0,
                time_ms=5.0, on_memory_front=True, memory_off_seeds=0, memory_dominator="",
                memory_dominator_seeds=0, memory_dominator_error=math.nan, memory_dominator_peak_mib=math.nan,
                on_time_front=True, time_off_seeds=0, time_dominator="", time_dominator_seeds=0,
                time_dominator_error=math.nan, time_dominator_ms=math.nan)
    return {**base, **fields}


def test_verdicts_count_fronts_and_name_rivals():
    verdict_table = pd.DataFrame([
        _verdict(on_memory_front=False, memory_off_seeds=1, memory_dominator="lce auto ar",
                 memory_dominator_seeds=1, memory_dominator_error=1.0, memory_dominator_peak_mib=4.0),
        _verdict(shape="128x8x256", on_time_front=False, time_off_seeds=1, time_dominator="lce compact auto",
                 time_dominator_seeds=1, time_dominator_error=0.9, time_dominator_ms=4.0),
        _verdict(device="cuda-emulated", pick="compact aspect_ratio:2", on_time_front=False)])
    table = _table([dict(op="lce", policy="auto", chunking="auto", chunk_size=64, dtype="bfloat16", error=1.0,
                         peak=12.0, time=5.0)])
    body, inputs, limits = _sections(nb04_pareto.verdicts_conclusion(verdict_table, table))
    assert body.startswith(f"{MARKER} 2 of 3 auto picks (entries × input families × shapes) are on the error–memory "
                           "front in every seed, and 1 of the 2 measured on the CPU on the error–time front")
    assert ("- off the memory front — random cpu bfloat16, 1 of 2 shapes (64x8x256), off in 1 of 1 seeds: `lce auto "
            "ar` reaches 1.00 floors (the pick: 1.00) with 3.0x less memory; the pick is on the time front "
            "there") in body
    assert ("- off the time front — random cpu bfloat16, 1 of 2 shapes (128x8x256), off in 1 of 1 seeds: `lce compact "
            "auto` reaches 0.90 floors (the pick: 1.00) in 0.80x the time") in body
    assert "off the time front — random cuda-emulated" not in body  # emulated picks: time not judged
    assert "- random bfloat16: the auto picks' worst gradient at 1.00 floors [1.00–1.00] over 1 seed" in body
    assert "median of 3 repeats" in inputs and "more than 5% better on one" in inputs
    assert "times of one thread on a shared machine" in limits


def test_fronts_per_dtype():
    table = _table([
        dict(op="lce", policy="auto", chunking="auto", chunk_size=64, dtype="bfloat16", error=1.0, peak=10.0, time=5),
        dict(op="lce", policy="compact", chunking="auto", chunk_size=64, dtype="bfloat16", error=4.0, peak=2.0,
             time=4),
        dict(op="torch", policy="auto", chunking="auto", chunk_size=64, dtype="bfloat16", error=3.0, peak=8.0,
             time=9)])
    body, inputs, limits = _sections(nb04_pareto.fronts(table, "cpu"))
    assert "On cpu, per input family and dtype (measured peak memory" in body
    assert ("- **random, bfloat16**: lowest error of any run 1.00 floors; the auto pick 1.00 floors [1.00–1.00] at "
            "10.00 MiB; torch's best run 3.00 floors; the least memory any run needs 2.00 MiB, at 4.00 floors.") in body
    assert "CPU (Test CPU 9000, 1 thread)" in inputs and "one small shape per family" in limits
    assert "no cuda-emulated runs" in nb04_pareto.fronts(table, "cuda-emulated")


def test_auto_table_reports_evidence_without_data():
    entries = pd.DataFrame({"device": ["cpu", "cuda", "other"], "dtype": ["bfloat16", "bfloat16", "any"],
                            "evidence": [("error_vs_memory_cpu", "chunk_sweep"), ("error_vs_chunks_cuda",),
                                         ("error_vs_memory_cpu",)]})
    verdict_table = pd.DataFrame([_verdict(), _verdict(shape="128x8x256")])
    body, inputs, limits = _sections(nb04_pareto.auto_table(entries, verdict_table,
                                                            {"error_vs_memory_cpu", "chunk_sweep"}))
    assert "has 2 entries and a fallback" in body and "3 in all, of which 2 are drawn" in body
    assert "`error_vs_chunks_cuda` has no data yet" in body
    assert ("- the verdicts below judge 1 entry on 2 problems (input family × shape) each, 1 seed a problem "
            "(cpu: bfloat16)") in body
    assert "no real-GPU results are committed" in body
    assert "lce/policies.py" in inputs and "a reason is a claim" in limits


@pytest.mark.parametrize("function", [nb02_accuracy.policy_errors, nb03_memory.memory_model])
def test_no_data_still_gives_a_conclusion(function):
    empty = pd.DataFrame(columns=["op", "device", "chunking", "dtype", "peak_bytes_measured", "peak_bytes_modeled"])
    assert function(empty).startswith(MARKER)


def test_fronts_and_fp32_choice_per_family_over_seeds():
    rows = []
    for seed, (auto, compact) in enumerate([(10.0, 12.0), (11.0, 12.5), (14.0, 13.0)]):
        for family in ("random", "calibrated"):
            bump = 0.0 if family == "random" else 1.0
            common = dict(seed=seed, family=family, dtype="float32", N=64)
            rows += [dict(op="lce", policy="auto", chunking="auto", chunk_size=64, error=auto + bump, peak=4.0,
                          time=5.0, **common),
                     dict(op="lce", policy="compact", chunking="aspect_ratio:2", chunk_size=16, error=compact + bump,
                          peak=1.0, time=9.0, **common),
                     dict(op="reference", policy="", chunking="", chunk_size=64, error=10.0, peak=8.0, time=2.0,
                          **common)]
    table = _table(rows)
    body, inputs, limits = _sections(nb04_pareto.fronts(table, "cpu"))
    expected = np.percentile([10.0, 11.0, 14.0], [5, 95])
    assert (f"- **random, float32**: lowest error of any run 10.00 floors; the auto pick 11.00 floors "
            f"[{expected[0]:.2f}–{expected[1]:.2f}], 1.1x the unfused fp32 computation's own error at 4.00 MiB") in body
    assert "- **calibrated, float32**: lowest error of any run 10.00 floors; the auto pick 12.00 floors" in body
    assert "3 seeds (0, 1 and 2), errors are medians over seeds" in inputs and "no error bars" not in limits
    body, _, _ = _sections(nb04_pareto.fp32_choice(table))
    assert "for calibrated inputs on cpu" in body and "for random inputs on cpu" in body
    assert "**random, cpu, memory × error**: `lce compact ar:2` (score" in body
    assert "12.50 floors [12.05–12.95], 1.2x the unfused fp32 computation's own error, 1.00 MiB" in body
