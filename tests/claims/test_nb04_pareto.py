"""Claims of notebook 04, over the committed sweep results and lce's "auto" table, judged by
:mod:`analysis.judge.pareto` as the notebook judges them. A failure names the sentence to rewrite."""

from __future__ import annotations

import functools

import pandas as pd

from analysis.judge import pareto
from analysis.paths import FIGURES_DIR
from analysis.report import nb04_pareto
from analysis.report.nb02_accuracy import AT_FLOOR
from lce.policies import AUTO_FALLBACK, AUTO_TABLE

ASPECT_RATIO = r"lce auto ar(:\d+)?"
SAME_POLICY_ASPECT_RATIO = r"lce (auto|accurate) ar(:\d+)?( acc=fp32)?"
"""The CPU low-precision pick (accurate, fp32 acc_dtype) spelled with explicit aspect-ratio chunking."""
ANY_POLICY_ASPECT_RATIO = r"lce (auto|accurate|balanced|compact) ar(:\d+)?"
"""fp32: every policy computes the same numbers, so any of them with explicit aspect-ratio chunking."""


@functools.cache
def _table() -> pd.DataFrame:
    return pareto.load_table()[1]


@functools.cache
def _verdicts(device: str | None = None, low_precision: bool | None = None) -> pd.DataFrame:
    verdicts = pareto.verdicts(_table()) if device is None else _verdicts()
    return verdicts if device is None else verdicts[
        (verdicts["device"] == device) & ((verdicts["dtype"] != "float32") == low_precision)]


@functools.cache
def _fronts(device: str, low_precision: bool) -> pd.DataFrame:
    fronts = nb04_pareto.fronts(_table(), _verdicts(), device)
    return fronts[(fronts["dtype"] != "float32") == low_precision]


def test_every_entry_cites_evidence_that_figures_holds_and_cuda_is_judged_emulated():
    """"each with its reason and the figures that carry its evidence: ... drawn in `figures/`" (all); "No sweep on
    a real GPU is committed, so the CUDA entries are judged on lce's CUDA layouts emulated on CPU tensors"."""
    picks = [*AUTO_TABLE.values(), AUTO_FALLBACK]
    assert all(pick.evidence for pick in picks)
    assert all((FIGURES_DIR / f"{stem}.png").exists() for pick in picks for stem in pick.evidence)
    judged = set(zip(_verdicts()["device"], _verdicts()["dtype"], strict=True))
    assert "cuda" not in set(_table()["device"]) and judged == {
        (device, dtype) for device in ("cpu", "cuda-emulated") for dtype in ("bfloat16", "float16", "float32")}


def test_cpu_low_precision_picks_are_on_the_time_front_and_lose_memory_only_to_aspect_ratio_chunking():
    """"on the time front on all ... problems. Off the memory front on ..., beaten only by ...: the same policy with
    explicit aspect-ratio chunking ... The row floor spends memory to stay fast"."""
    picks = _verdicts("cpu", True)
    off = picks[~picks["on_memory_front"]]
    assert picks["on_time_front"].all() and len(off)
    assert off["memory_dominator"].str.fullmatch(SAME_POLICY_ASPECT_RATIO).all()
    assert (off["memory_dominator_error"] >= off["error"] * (1 - pareto.VERDICT_TOLERANCE)).all()


def test_cpu_fp32_picks_lose_memory_to_aspect_ratio_chunking_and_time_only_to_torch():
    """"off the memory front ..., to the same aspect-ratio spellings, and off the time front on ..., where torch's op
    with aspect-ratio chunks takes ...x the pick's time"."""
    picks = _verdicts("cpu", False)
    assert picks.loc[~picks["on_memory_front"], "memory_dominator"].str.fullmatch(ANY_POLICY_ASPECT_RATIO).all()
    assert picks.loc[~picks["on_time_front"], "time_dominator"].str.fullmatch(r"torch \w+ ar(:\d+)?").all()


def test_emulated_cuda_picks_lose_memory_only_to_accurate_at_the_floor_and_the_fp32_fallback_never():
    """"(`balanced`): off the memory front on ... problems, each time to `lce accurate` (auto or aspect-ratio chunking,
    fp32 acc_dtype), which reaches
    [the floor]"; "fp32 (the fallback): on the memory front on ... of ... problems" (all)."""
    off = _verdicts("cuda-emulated", True)[lambda rows: ~rows["on_memory_front"]]
    assert len(off) and off["memory_dominator"].str.fullmatch(r"lce accurate (auto|ar(:\d+)?) acc=fp32").all()
    assert (off["memory_dominator_error"] < AT_FLOOR).all()
    assert _verdicts("cuda-emulated", False)["on_memory_front"].all()


def test_cpu_low_precision_pick_is_at_the_floor_and_beats_torch_and_fp32_loses_only_to_torch():
    """"the auto pick is at the rounding floor on every family and shape ...; torch's best run is above it on every
    problem it ran"; "In fp32 the pick is the most accurate run on ...; on the other ... torch's op has ..."."""
    low, fp32 = _fronts("cpu", True), _fronts("cpu", False)
    ran, beaten = low.dropna(subset=["torch"]), fp32[fp32["pick"] > fp32["lowest"]]
    assert (low["pick_high"] < AT_FLOOR).all() and len(ran) and (ran["torch"] > ran["pick"]).all()
    assert (beaten["torch"] == beaten["lowest"]).all()


def test_emulated_cuda_some_run_reaches_the_floor_the_pick_does_not_and_the_fp32_fallback_is_cheapest():
    """"some run reaches the floor on every family and shape, while the `balanced` pick is at ... floors"; "In fp32
    the fallback needs the least modeled memory of any run on every problem"."""
    low, fp32 = _fronts("cuda-emulated", True), _fronts("cuda-emulated", False)
    assert (low["lowest"] < AT_FLOOR).all() and (low["pick"] > AT_FLOOR).all()
    assert len(fp32) and (fp32["pick_mib"] <= fp32["cheapest_mib"]).all()


def test_fp32_policy_changes_no_number_and_the_default_wins_every_ranking_but_one():
    """"the ... policies compute bit-identical numbers on every shape and seed"; "the current default is the first
    choice in ... of the ... rankings; the exception is ..., where ... (explicit aspect_ratio chunking) scores ..."."""
    computations = nb04_pareto.fp32_computations(_table())
    assert (computations["policies"] > 1).all() and (computations["computations"] == 1).all()
    rankings = nb04_pareto.fp32_rankings(_table())
    exceptions = rankings[rankings["default's rank"] != 1]
    assert len(exceptions) == 1 and exceptions["chunking"].str.startswith("aspect_ratio").all()
