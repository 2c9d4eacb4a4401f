"""The head-mismatch study (analysis.studies.head_mismatch, issue 51): its reference draws the rollout's tokens and
their exact log-probabilities, its Liger-style head is the chunked formula, its measures are what they claim, a
known case comes out as the arithmetic says, and it writes rows with the kind's columns and resumes."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from analysis.core.families import draw
from analysis.core.problem import Shape
from analysis.core.results_io import HEAD_BATCH, HEAD_MISMATCH, read_table
from analysis.core.token_reference import sample_and_score, sample_targets, token_reference
from analysis.report import nb11_head_mismatch as report
from analysis.studies import head_mismatch as study
from helpers import own_cpu_gemms

SMALL = study.Case("calibrated", Shape(640, 32, 3000))
"""Above 512 rows, so that the batch component runs; 1 full 512-token sequence."""


@pytest.fixture(autouse=True)
def _native_cpu_gemms():
    """This CPU's own verdict on its bf16/fp16 GEMMs (helpers.own_cpu_gemms), as the study runs; what is checked
    here holds under either."""
    with own_cpu_gemms():
        yield


def _inputs(case=SMALL, seed=0):
    drawn = draw(case.family, case.shape, seed=seed, bias=False)
    return drawn.x.bfloat16(), drawn.weight.bfloat16()


def test_the_reference_draws_the_rollouts_tokens_and_their_exact_log_probs():
    x, w = _inputs()
    joint = sample_and_score(x, w, None, (0.6, 1.0), seed=4, block_elements=3000 * 50)
    for t in (0.6, 1.0):
        target = sample_targets(x, w, None, t, seed=4)
        assert torch.equal(joint[t][0], target)
        exact = token_reference(x, w, None, target, t, torch.zeros(x.shape[0], dtype=torch.float64))
        torch.testing.assert_close(joint[t][1], exact.log_probs, rtol=1e-13, atol=1e-13)


def test_the_liger_style_head_is_the_chunked_formula_whatever_its_blocks():
    x, w = _inputs()
    target = torch.randint(0, w.shape[0], (x.shape[0],), generator=torch.Generator().manual_seed(0))
    targets = {0.6: target, 1.0: target}
    default = study.liger_style_log_probs(x, w, targets)
    small_blocks = study.liger_style_log_probs(x, w, targets, rows=77, classes=301)
    for t in targets:
        logits = study.low_precision_logits(x, w)  # one bf16 rounding of each logit, as each block's GEMM
        assert logits.dtype == torch.bfloat16
        want = torch.log_softmax(logits.float().double() / t, -1).gather(1, target[:, None]).squeeze(1)
        assert default[t].dtype == torch.float32
        torch.testing.assert_close(default[t].double(), want, rtol=0, atol=2e-5)
        torch.testing.assert_close(small_blocks[t], default[t], rtol=0, atol=2e-5)


def test_pair_measures_are_what_they_say():
    delta = torch.zeros(4 * 8)
    delta[:8] = 0.2  # sequence 0: log-ratio 1.6 > ln 3, dropped by TRL's default mask
    delta[8:16] = -0.2  # sequence 1: -1.6, dropped only with the lower bound
    delta[16] = 1.5  # sequence 2: mean exp|delta| = (7 + e^1.5) / 8 < 2, and 1.5 > ln 3: dropped by TRL's
    delta[24:32] = 0.9  # sequence 3: mean exp|delta| = e^0.9 > 2
    inference = torch.linspace(-5, -1, 32)
    measures = study.pair_measures(inference + delta, inference, sequence_tokens=8)
    assert measures["sequences"] == 4 and measures["tokens"] == 32
    assert measures["rms_nats"] == pytest.approx(float(delta.double().square().mean().sqrt()), rel=1e-5)
    assert measures["mean_delta"] == pytest.approx(float(delta.double().mean()), rel=1e-5)
    assert measures["ratio_err_max"] == pytest.approx(math.expm1(1.5), rel=1e-5)
    assert measures["masked_trl_default"] == 3  # sequences 0, 2 and 3
    assert measures["masked_trl_two_sided"] == 4
    assert measures["masked_nemo_rl_2"] == 1  # sequence 3 alone
    assert measures["seq_mult_prob_error_max"] == pytest.approx(math.exp(0.9), rel=1e-5)
    assert measures["seq_log_ratio_max"] == pytest.approx(7.2, rel=1e-5)
    assert measures["bitwise_equal_share"] == 7 / 32  # where delta is 0: sequence 2 but its first token


def test_a_known_case_fp32_heads_match_and_bf16_logits_do_not():
    """lce's default (fp32 logits of the bf16 operands) against vLLM's fp32 head: about 1e-7 nats; against vLLM's
    default bf16 logits: the RMS the bf16 rounding of the logits gives, computed here directly."""
    pairs, batch = study.measure_case(SMALL, seed=0, temperatures=(1.0,))
    by = pairs.set_index(["trainer", "inference"])
    matched = by.loc[("lce auto cpu", "vllm head_dtype=float32"), "rms_nats"]
    mixed = by.loc[("lce auto cpu", "vllm default"), "rms_nats"]
    assert matched < 1e-5 and mixed > 100 * matched
    assert by.loc[("trl", "vllm default"), "rms_nats"] < 1e-5  # bf16 tiles against bf16 logits: the same grid
    x, w = _inputs()
    target = sample_targets(x, w, None, 1.0, seed=0)
    fp32 = torch.log_softmax(x.float() @ w.float().T, -1).gather(1, target[:, None]).squeeze(1).double()
    bf16 = torch.log_softmax(study.low_precision_logits(x, w).float(), -1).gather(1, target[:, None]).squeeze(1)
    direct = float((fp32 - bf16.double()).square().mean().sqrt())
    assert mixed == pytest.approx(direct, rel=1e-2)
    assert set(pairs["trainer"]) == {h.label for h in study.TRAINER_HEADS}
    assert set(pairs["inference"]) == {h.label for h in study.INFERENCE_HEADS}
    assert len(batch) == len(study.BATCH_ROWS) * (len(study.TRAINER_HEADS) + len(study.INFERENCE_HEADS))
    assert (batch["rows"].isin(study.BATCH_ROWS)).all() and (batch["max_abs_diff"] >= 0).all()


def test_record_writes_the_kinds_columns_and_resumes_case_by_case(tmp_path, monkeypatch):
    settings = dict(cases=(SMALL,), seeds=(0,), temperatures=(1.0,), progress=False)
    path, _ = study.record(tmp_path, **settings)
    pairs, batch = read_table(path), read_table(tmp_path / study.HEAD_BATCH_FILE)
    assert list(pairs.columns) == list(HEAD_MISMATCH.columns) and list(batch.columns) == list(HEAD_BATCH.columns)
    assert len(pairs) == len(study.TRAINER_HEADS) * len(study.INFERENCE_HEADS)
    assert pairs["git_revision"].notna().all() and pairs["cpu_model"].notna().all()
    assert pairs["sequences"].eq(1).all()  # 640 rows: one whole 512-token sequence
    figure = report.plot_head_mismatch(pairs)  # the report draws and tabulates the study's rows, measuring nothing
    assert figure.stem == "rl_head_mismatch" and "RMS" in figure.caption
    assert len(report.pair_table(pairs, "calibrated")) == len(pairs) and len(report.batch_table(batch)) == 10
    assert "the pair to use is" in report.headline(pairs)

    def measured(*args, **kwargs):
        raise AssertionError("a finished case is measured again")

    with monkeypatch.context() as patch:
        patch.setattr(study, "measure_case", measured)
        study.record(tmp_path, **settings)  # nothing left to do
    (tmp_path / study.HEAD_BATCH_FILE).unlink()  # a case whose batch rows are missing runs again ...
    study.record(tmp_path, **settings)
    pd.testing.assert_frame_equal(read_table(path), pairs)  # ... and appends only those
    assert len(read_table(tmp_path / study.HEAD_BATCH_FILE)) == len(batch)


def test_the_wilson_interval():
    assert report.wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert report.wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert report.wilson(0, 0) == (0.0, 1.0)


def test_the_lce_heads_give_their_recipes_log_probs_bit_for_bit():
    """The study asks lce for log p alone; the rl_logprobs recipes ask for the entropy too: the same bits."""
    x, w = _inputs()
    target = sample_targets(x, w, None, 0.6, seed=1)
    recipes = {recipe.label: recipe for recipe in study.RECIPES}
    for head, label in (("lce auto cuda", "lce auto cuda"), ("lce auto cpu", "lce auto cpu"),
                        ("lce compact cuda", "lce compact cuda acc=input")):
        mine = next(h for h in study.TRAINER_HEADS if h.label == head).score(x, w, {0.6: target}, None)[0.6]
        with torch.no_grad():
            theirs, _ = recipes[label].run(x, w, None, target, 0.6)
        assert torch.equal(mine, theirs), head


def test_pairs_are_classed_by_the_grids_their_heads_round_to():
    assert report.pairing("trl", "vllm default") == "same grid"
    assert report.pairing("lce auto cpu", "vllm head_dtype=float32") == "same grid"
    assert report.pairing("lce auto cpu", "vllm default") == "bf16 against fp32"
    assert report.pairing("lce compact cuda", "vllm head_dtype=float32") == "bf16 against fp32"
    assert report.pairing("trl cast_lm_head_to_fp32", "fp16") == "fp16 against fp32"
    assert report.pairing("liger-style bf16 chunks", "fp16") == "bf16 against fp16"
    assert report.pairing("materialized", "vllm default") == "materialized"
    assert report.TRAINER_ORDER == tuple(h.label for h in study.TRAINER_HEADS)
    assert report.INFERENCE_ORDER == tuple(h.label for h in study.INFERENCE_HEADS)
    heads = {h.label for h in (*study.TRAINER_HEADS, *study.INFERENCE_HEADS)}
    assert heads == set(report.LOGITS_GRID) == set(report.PROSE_NAMES)
    assert set(report.MASKS) == {mask.column for mask in study.SEQUENCE_MASKS}
