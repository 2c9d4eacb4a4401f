"""The README's headline findings and its commands table, written from the committed results (``python -m analysis
docs``). Each headline is one sentence with its figure; ``tests/claims/test_readme.py`` asserts what each says.
Nothing here measures."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.core.provenance import cpu_kind
from analysis.core.results_io import (
    HEAD_MISMATCH,
    HEAD_TRAINING,
    NOISE_SCALING,
    REPRODUCE,
    RL_COST,
    RL_LOGPROBS,
    TEST_TIME,
    load_kind,
)

__all__ = ["decision_headline", "training_headline", "batch_headline", "rl_headline", "memory_headline",
           "readme_headlines",
           "readme_commands"]


def decision_headline(results: Path) -> dict[str, float | str]:
    """CUDA bf16 at the first reference head: auto's and torch 2.13's default's weight floors and the GiB auto saves
    (negative: more)."""
    from analysis.report.decision_table import decision_table

    table = decision_table(results)
    row = table[(table["device"] == "cuda") & (table["dtype"] == "bfloat16")].iloc[0]
    return {"head": row["head"], "auto": row["auto"].split(",")[0], "weight_floors": float(row["grad_weight_floors"]),
            "torch_weight_floors": float(row["torch_grad_weight_floors"]), "saved_gib": float(row["saves_gib"]),
            "peak_gib": float(row["peak_gib"]), "rows": int(row["rows"])}


def measured_head_headline(results: Path, head: str) -> dict[str, float] | None:
    """The "auto" call measured on a GPU at ``head`` (``"N×D×C"``, :func:`analysis.report.nb04_pareto.head_costs`):
    its worst gradient error in floors, peak GiB and time over the unfused op's; None where no GPU ran it."""
    from analysis.judge import pareto
    from analysis.report.nb04_pareto import head_costs, todays_pick

    costs = head_costs(pareto.load_table(results)[1])
    pick = costs[costs["pick"] & (costs["shape"] == head)] if len(costs) else costs
    if pick.empty:
        return None
    row = pick.iloc[0]
    today = todays_pick(costs).set_index("shape").loc[head]
    return {"floors": float(row["error"]), "gib": float(row["peak_mib"]) / 1024,
            "vs_unfused_time": float(row["vs_unfused_time"]),
            "predicted_vs_unfused": float(today["predicted_vs_unfused"])}


def training_headline(results: Path) -> dict[str, float]:
    """The head-only AdamW study's final rare-class gaps (millinats) of bf16 compact at 256 chunks and of lce's
    balanced at 64, and the fp32 head's own seed spread there."""
    from analysis.judge import horizon

    _, head = load_kind(results, HEAD_TRAINING.name)
    head = head[head["setting"] == "full"]
    final = horizon.final_gaps(head)
    rare = final[(final["optimizer"] == "adamw") & (final["bucket"] == "rare")].set_index("arm")
    return {"compact_gap": float(rare.loc["bf16 compact@256", "gap"]) * 1e3,
            "balanced_gap": float(rare.loc["bf16 balanced@64", "gap"]) * 1e3,
            "spread": float(rare.loc["bf16 balanced@64", "seed_spread"]) * 1e3,
            "seeds": int(rare.loc["bf16 balanced@64", "seeds"])}


def batch_headline(results: Path) -> dict[str, float] | None:
    """The noise-scaling study at the CUDA bf16 auto pick and torch 2.13's CUDA default (bf16): the auto pick's
    exponent and predicted bias/noise at 2^20 with its band, its floors' range, torch's first crossing and its
    measured ratio at the largest N; None without the study's rows."""
    from analysis.report.nb06_does_it_matter import (
        FLOOR_CANDIDATES,
        auto_at_step,
        first_crossing,
        floor_check,
        scaling_numbers,
    )

    _, scaling = load_kind(results, NOISE_SCALING.name)
    numbers = scaling_numbers(scaling) if not scaling.empty else None
    if numbers is None:
        return None
    fit = numbers.bias.set_index(["candidate", "dtype"])
    read = auto_at_step().set_index(["device", "dtype"]).loc[("cuda", "bfloat16")]  # what the procedure reads
    auto, torch_default = fit.loc[(read["candidate"], "bfloat16")], fit.loc[("torch 2.13 auto", "bfloat16")]
    floors = floor_check(scaling)
    floors = floors[floors["candidate"].isin(FLOOR_CANDIDATES)]
    measured = numbers.measured_bias.set_index(["candidate", "dtype", "N"])["weight_bias_over_noise"]
    largest = max(numbers.rows)
    return {"exponent": float(auto["exponent"]), "exponent_low": float(auto["exponent_low"]),
            "exponent_high": float(auto["exponent_high"]), "at_2_20": float(read["value"]),
            "at_2_20_low": float(read["low"]), "at_2_20_high": float(read["high"]),
            "floors_max": float(floors["floors_max"].max()), "largest": largest,
            "auto_measured": float(measured.loc[(read["candidate"], "bfloat16", largest)]),
            "torch_first": first_crossing(numbers, "torch 2.13 auto", "bfloat16"),
            "torch_measured": float(measured.loc[("torch 2.13 auto", "bfloat16", largest)]),
            "torch_exponent": float(torch_default["exponent"]), "seeds": numbers.seeds,
            "families": ", ".join(numbers.families),
            "cpu_model": ", ".join(sorted(scaling["cpu_model"].astype(str).unique()))}


def rl_headline(results: Path) -> dict[str, float]:
    """At the Qwen-size head (bf16): TRL's default head's per-item p99 ratio error (median over temperatures and
    seeds), the worst token of its fp32 cast and of lce's defaults (either layout table), and the classes."""
    from analysis.report.nb11_rl_logprobs import QWEN_CLASSES, qwen_summary

    _, table = load_kind(results, RL_LOGPROBS.name)
    qwen = qwen_summary(table, load_kind(results, RL_COST.name)[1]).set_index("recipe")
    return {"trl_p99": float(qwen.loc["trl", "ratio_p99"]),
            "cast_worst": float(qwen.loc["trl cast_lm_head_to_fp32", "ratio_max"]),
            "lce_worst": float(qwen.loc[["lce auto cuda", "lce auto cpu"], "ratio_max"].max()),
            "classes": QWEN_CLASSES}


def memory_headline(results: Path) -> dict[str, float]:
    """At the Qwen-size head's larger batch: the materialized recipe's, TRL's default head's and lce's peak (GiB),
    tokens and classes."""
    _, costs = load_kind(results, RL_COST.name)
    big = costs[costs["N"] == costs["N"].max()].set_index("recipe")
    return {"materialized_gib": float(big.loc["materialized", "peak_bytes"]) / 2**30,
            "trl_gib": float(big.loc["trl", "peak_bytes"]) / 2**30,
            "lce_gib": float(big.loc["lce auto cpu", "peak_bytes"]) / 2**30, "tokens": int(costs["N"].max()),
            "classes": int(costs["C"].iloc[0])}


def readme_headlines(results: Path) -> str:
    """Six findings, a sentence or two and one figure each."""
    for kind in (HEAD_TRAINING, RL_LOGPROBS, RL_COST, HEAD_MISMATCH):
        if load_kind(results, kind.name)[1].empty:
            return f"The headlines need the {kind.name} results (see docs/findings.md for their commands).\n"
    decision, training = decision_headline(results), training_headline(results)
    rl, memory = rl_headline(results), memory_headline(results)
    batch = batch_headline(results)
    more = -decision["saved_gib"]
    measured = measured_head_headline(results, decision["head"].replace("x", "×"))
    on_gpu = "" if measured is None else (
        f" Measured on an H200: {measured['floors']:.2f} floors (worst gradient) in {measured['gib']:.2f} GiB, at "
        f"{measured['vs_unfused_time']:.0f}x the unfused op's time, spent adding into its fp32 accumulator in "
        f"million-element blocks; lce now sums it in one GEMM or a few large blocks per chunk of {decision['rows']} "
        f"rows, predicted at {measured['predicted_vs_unfused']:.1f}x in {decision['peak_gib']:.2f} GiB (not yet run "
        "on a GPU; notebook 04).")
    return "\n".join([
        f"- **Accuracy for memory, chosen per head.** At a {decision['head']} bf16 head on CUDA, lce's default "
        f"({decision['auto']}) keeps the weight gradient at {decision['weight_floors']:.2f} rounding floors where "
        f"torch 2.13's default sits at {decision['torch_weight_floors']:.2f}, for {more:.2f} GiB more (predicted by "
        "lce's models; [figures/error_vs_memory_cuda-emulated.png](figures/error_vs_memory_cuda-emulated.png))."
        + on_gpu,
        f"- **The error matters on rare classes.** Over 10⁴ head-only AdamW steps ({training['seeds']} seeds), compact "
        f"at 256 chunks moved the rare classes' held-out loss by {training['compact_gap']:+.1f} millinats, beyond "
        f"the fp32 head's own seed spread ({training['spread']:.1f}), while balanced stayed at "
        f"{training['balanced_gap']:+.1f} ([figures/head_gap_vs_step_adamw.png](figures/head_gap_vs_step_adamw.png)).",
        *([] if batch is None else [_batch_text(batch)]),
        f"- **RL's importance ratio.** At a {rl['classes']:,}-class head in bf16, TRL 1.16's fused log-probability "
        f"head moves the PPO/GRPO ratio by {rl['trl_p99']:.1%} at the 99th percentile of sampled tokens (its bf16 "
        f"logits tiles); `lce.linear_log_probs`, routed into TRL by one call (`lce.integrations.trl.route`), keeps "
        f"every token within {rl['lce_worst']:.0e} from the same bf16 operands, as TRL's fp32 cast of the head does "
        f"({rl['cast_worst']:.0e}) ([figures/rl_qwen_head.png](figures/rl_qwen_head.png)).",
        f"- **Memory.** One forward and backward of per-token log-probabilities and entropy at a "
        f"{memory['classes']:,}-class head and {memory['tokens']:,} tokens (bf16) peaks at "
        f"{memory['materialized_gib']:.2f} GiB with materialized logits, {memory['trl_gib']:.2f} GiB with TRL's "
        f"fused head and {memory['lce_gib']:.2f} GiB with lce ([figures/rl_costs.png](figures/rl_costs.png)).",
        f"- **Which trainer head for which inference head.** {_head_pairs(results)} "
        "([figures/rl_head_mismatch.png](figures/rl_head_mismatch.png); notebook 11).",
    ]) + "\n"


def _batch_text(batch: dict) -> str:
    """The headline on the error at LLM batch sizes (:func:`batch_headline`)."""
    from lce.decide import BIAS_LIMIT

    return (f"- **At LLM batch sizes.** Measured from 2^10 to 2^{batch['largest'].bit_length() - 1} rows per "
            f"batch (D = 128, C = 16384; worst of the {batch['families']} families, median of {batch['seeds']} "
            f"seeds; CUDA layouts emulated on {batch['cpu_model']}), lce's CUDA bf16 default returns the weight "
            f"gradient at its bf16 rounding floor (at most "
            f"{batch['floors_max']:.2f} floors), and its bias over the batch's sampling noise grows as "
            f"N^{batch['exponent']:.2f} [{batch['exponent_low']:.2f}, {batch['exponent_high']:.2f}], not sqrt(N): "
            f"{batch['auto_measured']:.2g} at {batch['largest']:,} rows, predicted at {batch['at_2_20']:.2g} "
            f"[{batch['at_2_20_low']:.2g}, {batch['at_2_20_high']:.2g}] at an LLM step's 2^20 rows (a power law's "
            f"extrapolation, 95% band), against the "
            f"rule's {BIAS_LIMIT:g} -- the rounding of a bf16 gradient itself, which no policy returning bf16 goes "
            f"under. torch 2.13's CUDA default is over the limit from {batch['torch_first']:,} rows and at "
            f"{batch['torch_measured']:.3g} at {batch['largest']:,} (growing as N^{batch['torch_exponent']:.1f}) "
            "([figures/noise_scaling_weight_bias.png](figures/noise_scaling_weight_bias.png); notebook 06).")


def _head_pairs(results: Path) -> str:
    """The trainer/inference head pairing (notebook 11): the pair to use and what each other pair costs."""
    from analysis.report.nb11_head_mismatch import headline

    return headline(load_kind(results, HEAD_MISMATCH.name)[1])


def _minutes(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def readme_commands(results: Path) -> str:
    """The two commands' last measured times per CPU kind (``reproduce.csv``, ``test_times.csv``)."""
    rows = []
    _, runs = load_kind(results, REPRODUCE.name)
    runs = runs[runs["grid"] == "quick"]
    for _, row in runs.iterrows():
        rows.append({"command": "`make reproduce`", "cpu": cpu_kind(row["cpu_model"], row["cpu_gemms"]),
                     "seconds": row["total_s"], "date": str(row["date"])[:10], "revision": row["git_revision"]})
    _, tests = load_kind(results, TEST_TIME.name)
    names = {"test-fast": "`make test-fast`", "test": "`make test`",
             "train --quick": "`python -m analysis train --quick`"}
    for _, row in tests[tests["status"] == 0].iterrows():
        rows.append({"command": names[row["tier"]], "cpu": cpu_kind(row["cpu_model"], row["cpu_gemms"]),
                     "seconds": row["wall_s"], "date": str(row["date"])[:10], "revision": row["git_revision"]})
    if not rows:
        return "No command has been timed yet (`python -m analysis test-times`).\n"
    table = pd.DataFrame(rows).sort_values("date").groupby(["command", "cpu"], sort=False).last().reset_index()
    order = {name: i for i, name in enumerate(["`make reproduce`", *names.values()])}
    table = table.sort_values(["command", "cpu"], key=lambda s: s.map(order) if s.name == "command" else s)
    lines = ["| command | CPU kind | time | measured |", "|---|---|---|---|"]
    lines += [f"| {r.command} | {r.cpu} | {_minutes(r.seconds)} | {r.date}, {r.revision} |" for r in table.itertuples()]
    return "\n".join(lines) + "\n"
