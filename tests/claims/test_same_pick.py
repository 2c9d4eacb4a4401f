"""One answer: at every reference head, "auto", ``lce.recommend(memory_budget=None)``, the README's decision table and
notebooks 06, 07 and 10 name the same pick, or differ where the README's one sentence says (after the decision
table: "`lce.recommend(..., memory_budget=None)` names auto's plan except where it may do what a default may not").

A failure names the place that disagrees."""

from __future__ import annotations

import functools
import json
import re

import pytest
import torch

import lce
from analysis.core.results_io import HEAD_TRAINING, NOISE, load_kind
from analysis.judge import horizon
from analysis.judge.rule import peer_table, rule_table
from analysis.paths import RESULTS_DIR, ROOT
from analysis.report.decision_table import ENTRIES, decision_table
from analysis.studies.head_training import ADAMW_ARMS
from lce.decide import (
    AUTO_CHUNKINGS,
    DEFAULT_MAX_ERROR,
    DEFAULT_MAX_ERROR_FOR_AUTO,
    REFERENCE_HEADS,
    TORCH_DEFAULTS,
    TORCH_FALLBACK,
    default_accuracy_fault,
    drop_in_fault,
    faults,
    objective,
    rule_candidate,
)
from lce.planning.options import dtype_name
from lce.planning.policies import AUTO_TABLE
from lce.testing import cpu_gemms

SENTENCE = "`lce.recommend(..., memory_budget=None)` names auto's plan except where it may do what a default may not"


def _pick(kind, dtype) -> str:
    """The auto table's answer for the loss: its policy, and its chunking rule or, where the loss's default keeps the
    batch-invariance contract, its fixed rows ("batch-invariant")."""
    entry = AUTO_TABLE[(kind, dtype)]
    return f"{entry.acc_policy}, {'batch-invariant' if entry.batch_invariant else entry.chunking_method}"


@functools.cache
def _noise():
    return load_kind(RESULTS_DIR, NOISE.name)[1]


def _outputs(notebook: str) -> str:
    cells = json.loads((ROOT / "notebooks" / notebook).read_text(encoding="utf-8"))["cells"]
    return json.dumps([cell.get("outputs", []) for cell in cells])


def _html_rows(notebook: str) -> list[list[str]]:
    """Every row of the executed notebook's HTML tables, as cell texts."""
    cells = json.loads((ROOT / "notebooks" / notebook).read_text(encoding="utf-8"))["cells"]
    html = "".join("".join(output.get("data", {}).get("text/html", [])) for cell in cells
                   for output in cell.get("outputs", []))
    return [[text.strip() for text in re.findall(r">([^<>]+)</(?:div|td|th)>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", html, flags=re.S)]


def test_the_decision_table_names_the_auto_table_at_every_reference_head():
    table = decision_table(RESULTS_DIR)
    for kind, dtype in ENTRIES:
        rows = table[(table["device"] == kind) & (table["dtype"] == dtype_name(dtype))]
        assert sorted(rows["head"]) == sorted(str(head) for head in REFERENCE_HEADS)
        assert (rows["auto"] == _pick(kind, dtype)).all(), (kind, dtype, rows["auto"].tolist())


def test_notebook_07_leads_with_the_decision_table():
    cells = json.loads((ROOT / "notebooks" / "07_choosing_options.ipynb").read_text(encoding="utf-8"))["cells"]
    sections = [i for i, cell in enumerate(cells) if cell["cell_type"] == "markdown"
                and "".join(cell["source"]).startswith("## ")]
    table_cell = next(i for i, cell in enumerate(cells) if cell["cell_type"] == "code"
                      and "decision_table.decision_table(" in "".join(cell["source"]))
    assert sections[0] < table_cell < sections[1], "notebook 07's first section is no longer the decision table"
    shown = _outputs("07_choosing_options.ipynb")
    for kind, dtype in ENTRIES:
        assert _pick(kind, dtype) in shown, f"notebook 07's executed table does not show {kind} {dtype}'s auto pick"


def test_notebook_06_judges_the_auto_table_and_lces_cuda_plan():
    noise = _noise()
    judged = rule_table(noise)
    assert sorted(judged["pick"]) == sorted(f"{e.acc_policy} {e.chunking_method}" for e in AUTO_TABLE.values())
    cuda = peer_table(noise).query("rule == 'lce auto'")
    for row in cuda.itertuples():
        assert row.policy == AUTO_TABLE[("cuda", getattr(torch, row.dtype))].acc_policy
    rows = [row for row in _html_rows("06_does_it_matter.ipynb") if row and row[0] == "lce auto"]
    assert rows, "notebook 06's executed tables lost their 'lce auto' rows"
    for row in rows:
        dtype, policy = row[1], row[2]
        assert policy == AUTO_TABLE[("cuda", getattr(torch, dtype))].acc_policy, row


def test_notebook_10_trains_the_auto_policy_as_its_lce_auto_arm():
    arms = [arm for arm in ADAMW_ARMS if arm.rule == "lce auto"]
    assert {arm.dtype for arm in arms} == {"bfloat16", "float16"}
    for arm in arms:
        assert arm.policy == AUTO_TABLE[("cuda", getattr(torch, arm.dtype))].acc_policy, arm
    head = load_kind(RESULTS_DIR, HEAD_TRAINING.name)[1]
    verdicts = horizon.rule_verdicts(head[head["setting"] == "full"])
    auto = verdicts[verdicts["rule"] == "lce auto"]
    assert set(auto["arm"]) == {arm.name for arm in arms}, "notebook 10's verdicts lost an 'lce auto' arm"


def test_the_readme_states_where_recommend_without_a_budget_may_differ_from_auto():
    page = " ".join((ROOT / "docs" / "policies.md").read_text(encoding="utf-8").split())
    assert SENTENCE in page
    limits = set(DEFAULT_MAX_ERROR_FOR_AUTO.values())
    assert len(limits) == 1 and f"accurate-default condition, every gradient within {limits.pop():g} floors" in page


def _rule_rows(policy, head, dtype, kind) -> set[int]:
    return {rule_candidate(policy, chunking, head, dtype, kind).plan.batch_chunk_size for chunking in AUTO_CHUNKINGS}


@pytest.mark.parametrize(("kind", "dtype"), ENTRIES, ids=[f"{k}-{dtype_name(d)}" for k, d in ENTRIES])
def test_recommend_without_a_budget_is_autos_plan_or_differs_as_the_readme_says(kind, dtype):
    """"names auto's plan except where it may do what a default may not: choose the rows per chunk for one shape
    (a count no chunking rule that auto may use gives there), or give up accuracy that a default must keep (the
    drop-in condition [...] and the accurate-default condition, every gradient within 1.25 floors, bind defaults
    only); there its pick meets every other condition and, weighed by the same objective against the same candidates
    with auto's plan among them, comes first"."""
    limit = DEFAULT_MAX_ERROR.get(dtype, float("inf"))
    torch_rule = TORCH_DEFAULTS.get((kind, dtype), TORCH_FALLBACK)
    with cpu_gemms("native"):
        for head in REFERENCE_HEADS:
            tuned = lce.recommend(head.N, head.D, head.C, dtype, "cpu" if kind == "cpu" else "cuda")
            auto, chosen = tuned.auto, tuned.chosen
            same = (chosen.plan.acc_policy, chosen.plan.batch_chunk_size, chosen.plan.class_chunk_size) == (
                auto.plan.acc_policy, auto.plan.batch_chunk_size, auto.plan.class_chunk_size)
            if same:
                continue
            assert not faults(chosen, limit), (head, chosen.label())
            weighed = [c for c in tuned.considered if not faults(c, limit)]
            assert not faults(auto, limit) and objective([*weighed, auto]) is chosen, (
                head, chosen.label(), auto.label())
            theirs = rule_candidate(*torch_rule, head, dtype, kind, min_rows=False)
            tuned_rows = chosen.plan.batch_chunk_size not in _rule_rows(chosen.plan.acc_policy, head, dtype, kind)
            tiled = chosen.plan.tiles_classes
            assert tuned_rows or tiled or drop_in_fault(chosen, theirs) or default_accuracy_fault(chosen), (
                f"{head}: recommend's {chosen.label()} differs from auto's {auto.label()} for a reason the README "
                "does not give")
