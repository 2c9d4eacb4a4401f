"""The loss-scale study (analysis.studies.loss_scale): its autocast baseline is what torch.autocast computes, its
"before" arm is lce without the headroom, and it writes, resumes and measures what the headroom changes."""

from __future__ import annotations

import contextlib

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import lce
from analysis.core.families import draw
from analysis.core.fp64 import reference_outputs
from analysis.core.inputs import rounded_inputs
from analysis.core.problem import Shape
from analysis.core.results_io import read_table
from analysis.studies import head_arithmetic
from analysis.studies import loss_scale as study
from lce.testing import emulate_device_kind, without_headroom

SHAPE = Shape(1024, 32, 4096)


def _inputs(shape: Shape = SHAPE):
    return rounded_inputs(draw("calibrated", shape, seed=0, bias=True), torch.float16)


def test_the_autocast_baseline_is_what_torch_autocast_computes():
    """Row-chunked restatement against torch.autocast's fp16 unfused op, with a loss scale: the same entries up to
    the GEMMs' fp32 summation order, the same lost entries and the same floors."""
    inputs = _inputs()
    scale = 2.0 ** 12
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(F.linear(inputs.input, inputs.weight, inputs.bias), inputs.target)
    assert loss.dtype == torch.float32
    real = torch.autograd.grad(loss * scale, inputs.leaves())
    mine = study.autocast_gradients(inputs, [scale], block=256 * SHAPE.C)[scale]  # 4 row chunks
    exact = reference_outputs(inputs)
    for got, want, truth in zip(mine, real, (exact.grad_input, exact.grad_weight, exact.grad_bias), strict=True):
        assert got.dtype == want.dtype == torch.float16
        assert float((got != want).double().mean()) < 0.02
        eligible, lost = study.lost_entries(got, truth * scale)
        assert eligible > 0 and abs(lost - study.lost_entries(want, truth * scale)[1]) <= max(2, lost // 20)
        floors = study._floors(got, truth * scale)
        assert abs(floors - study._floors(want, truth * scale)) < 0.02 * floors


def test_without_headroom_is_lces_arithmetic_before_it():
    """lce.testing.without_headroom runs lce as it was before lce.passes.headroom: its weight gradient is the head-only
    study's restatement of that arithmetic (up to fp32 summation order), and it loses entries lce now keeps."""
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(512, 32, generator=g), torch.randn(2048, 32, generator=g) * 1.0
    y = torch.randint(0, 64, (512,), generator=g)  # most classes never a target: entries about p / N
    scale = 2.0 ** 12
    restated = head_arithmetic.head_step(x, w, y, torch.float16, "compact", 16, scale, headroom=False).grad_weight

    def lce_gradient(context):
        leaves = [x.half().requires_grad_(), w.half().requires_grad_()]
        options = lce.LinearCrossEntropyOptions(acc_policy="compact", acc_dtype=torch.float32, chunking_method=None,
                                                batch_chunk_size=32)
        with emulate_device_kind("cuda"), context:
            loss = lce.linear_cross_entropy(*leaves, y, options=options, loss_dtype=torch.float32)
            return torch.autograd.grad(loss * scale, leaves[1])[0].float() / scale

    before = lce_gradient(without_headroom())
    after = lce_gradient(contextlib.nullcontext())
    assert float((before.double() != restated.double()).double().mean()) < 0.01
    x64, w64 = x.half().double(), w.half().double()
    p = torch.softmax(x64 @ w64.T, dim=1)
    p[torch.arange(512), y] -= 1.0
    exact = p.T @ x64 / 512
    _, lost_before = study.lost_entries(before * scale, exact * scale)
    _, lost_after = study.lost_entries(after * scale, exact * scale)
    assert lost_before > 20 * max(1, lost_after)


def test_the_study_writes_its_rows_resumes_and_sees_the_headroom(tmp_path):
    shape = Shape(512, 32, 2048)
    runs = study.contenders(arms=(("cuda", "auto", "default"), ("cpu", "compact", "default")))
    path, _ = study.record(tmp_path, "ls.csv", shapes=(shape,), seeds={shape: (0,)}, runs=runs, progress=False)
    table = read_table(path)
    assert len(table) == len(runs) * len(study.SCALES) * len(study.GRADIENTS)
    assert set(table["impl"]) == {r.label for r in runs}
    assert table["git_revision"].notna().all() and (table["wall_s"] > 0).all()
    study.record(tmp_path, "ls.csv", shapes=(shape,), seeds={shape: (0,)}, runs=runs, progress=False)
    assert len(read_table(path)) == len(table)  # the problem is done: nothing measured twice
    weight = table[table["gradient"] == "weight"].set_index(["impl", "scale_log2"])
    for scale in (12, 16):
        reference = weight.loc[("unfused autocast", scale), "lost"]
        assert weight.loc[("lce auto cuda before", scale), "lost"] > 10 * max(1, reference)
        assert weight.loc[("lce auto cuda after", scale), "lost"] <= reference
    torch_op = weight.xs("torch default", level="impl")
    assert not torch_op.loc[16, "finite"] and torch_op.loc[12, "finite"]  # an fp16 loss cannot carry 2**16
    # an arm measured again (its plan changed) replaces its own rows and leaves every other row as it was
    study.remeasure(tmp_path, ["lce auto cuda after"], "ls.csv", progress=False)
    again = read_table(path)
    assert len(again) == len(table)
    others = again[again["impl"] != "lce auto cuda after"].drop(columns=["wall_s", "cpu_s"]).reset_index(drop=True)
    before = table[table["impl"] != "lce auto cuda after"].drop(columns=["wall_s", "cpu_s"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(others, before)
    mine = again[again["impl"] == "lce auto cuda after"].set_index(["gradient", "scale_log2"]).sort_index()
    old = table[table["impl"] == "lce auto cuda after"].set_index(["gradient", "scale_log2"]).sort_index()
    assert mine["lost"].equals(old["lost"])  # the same plan measured again: the same counts
    with pytest.raises(ValueError, match="labels must name contenders"):
        study.remeasure(tmp_path, ["lce fastest"], "ls.csv", progress=False)
