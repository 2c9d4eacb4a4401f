"""lce.kernels (fused Triton kernels for a chunk's passes) against lce's own PyTorch passes, through Triton's CPU
interpreter: no GPU needed. The kernel tests skip where triton is not installed.

Every check runs the PyTorch functions of :mod:`lce.passes` and the kernels on the same fp32 logits -- 37 rows x
1000 classes, block widths that do not divide 1000, a row's columns split between programs -- with ignored rows,
targets in the first and last columns and rows whose target leads by 0 to 40 nats. Two measures: the distance
from the reference in fp32 ulps, and (as a kernel should be judged) the error against fp64 beside the reference's
own. For dz, ulps are of the sum of the magnitudes of an entry's terms, since terms of both signs meet in the
smoothing term and in the target entry under a z-loss.

Measured (Triton 3.9 interpreter, numpy 2.4, torch 2.13 CPU):

* ``row_max`` and ``target_logit``: bitwise equal.
* ``other`` (the one sum the kernels order differently, and the online rescale): against fp64 the reference is
  within 4.2 ulps, the kernels within 2.2 to 4.2 depending on the launch; they are at most 5 ulps apart. Confident
  rows (target ahead by 0 to 40 nats): ``1 - p_y`` within 2.9 ulps of fp64 for both. A maximum rising at every one
  of 16 blocks: kernels 0.75 ulps, reference 0.9. Asserted: the kernels' error at most the reference's plus
  :data:`OTHER_ULPS`, and within :data:`AGREE_ULPS` of it.
* ``lse``, ``1 - p_y``, losses from the kernels' statistics: 1, 2 and 3 ulps from the reference's (:data:`ROW_ULPS`).
* dz, for every option covered (class weights, label smoothing with and without them, a z-loss, the fp16 rescale,
  reduction "none", a block of classes, all at once): 2 to 4 ulps from the reference given the same statistics
  (:data:`SAME_STATISTICS_ULPS`), 4 to 5 from the kernels' own (:data:`AGREE_ULPS`); against fp64 the same error
  as the reference's to within 0.6 ulps (:data:`DZ_ULPS`; 2.5 at 64 x 50000). Both are up to 32 ulps from fp64
  on confident rows, where ``z - row_max`` near -50 is rounded before ``exp``: the formula's error, shared.

On a GPU the kernels call libdevice's ``exp`` (torch's CUDA ``exp``) instead of an fp64 one: the ``cuda`` test at
the end runs the forward comparison with the compiled kernels on CUDA tensors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
import os
import subprocess
import sys
from importlib import metadata

import pytest
import torch
from packaging.version import Version

import lce
from helpers import loss_and_grads
from lce.kernels.interpreter import interpreting
from lce.kernels.launch import Launch, grad_launch, statistics_launch
from lce.passes.chunk import Chunk, HeadTensors, Targets, block_target_index
from lce.passes.grad_logits import DzScale, RowScales, chunk_grad_logits_
from lce.passes.statistics import (
    RowStatistics,
    block_statistics_,
    chunk_loss_and_softmax_,
    chunk_softmax_from_lse_,
    chunk_statistics_,
)
from lce.planning.resolve import make_plan
from lce.testing import emulate_device_kind, interpreted_kernels

PASSES = "lce.kernels.softmax_passes"
ROWS, CLASSES = 37, 1000
IGNORED = -100
MARGINS = (0.0, 1.0, 5.0, 10.0, 20.0, 30.0, 40.0)
"""Nats by which a confident row's target leads the rest of its row."""

OTHER_ULPS = 1.0
"""``other`` and ``1 - p_y``: the kernels' error against fp64 is at most the reference's largest plus this many
ulps (relative error in units of fp32's 2**-23)."""
DZ_ULPS = 3.0
"""dz: the kernels' error against fp64, in ulps of the magnitude of each entry's terms, is at most the reference's
largest plus this many (measured 0.6 at 1000 classes, 2.5 at 50000: the two differ by a few ulps entry by entry,
so their largest errors can fall on different entries)."""
ROW_ULPS = 3.0
"""``lse``, ``1 - p_y`` and the losses, from the kernels' statistics: at most this many ulps from the reference's
(measured: 1, 2 and 3)."""
AGREE_ULPS = 8.0
"""``other`` and dz from the kernels' own statistics: at most this many ulps from the reference's (measured 5 at
1000 classes, 6 at 50000: two sums each within a few ulps of fp64, on either side of it, and ``exp``'s last bit)."""
SAME_STATISTICS_ULPS = 4.0
"""dz from the reference's own statistics: at most this many ulps from the reference's dz (measured 2 to 4:
``exp``'s last bit, doubled where ``p`` falls into a lower binade than ``exp``, and each side's last rounding)."""

STATISTICS_LAUNCHES = {
    "one_block": None,  # the default: 1024 columns, one block per row
    "blocks_of_256": Launch(256),  # 3 full blocks and one of 232 columns
    "blocks_of_128_in_3_splits": Launch(128, splits=3),  # 8 blocks: 3 + 3 + 2
}


@pytest.fixture
def kernels():
    """lce.kernels with CPU tensors running its kernels through Triton's interpreter (``TRITON_INTERPRET=1``, which
    tests/conftest.py sets before triton is imported, and :func:`lce.testing.interpreted_kernels`)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    triton_version, numpy_version = Version(metadata.version("triton")), Version(metadata.version("numpy"))
    if triton_version < Version("3.9") and numpy_version >= Version("2.3"):
        pytest.skip(f"triton {triton_version}'s interpreter needs numpy < 2.3 (measured on 3.6), not {numpy_version}")
    if not interpreting():
        pytest.skip("triton was not asked for its interpreter before it was imported (a session with CUDA)")
    import lce.kernels
    from lce.testing import interpreted_kernels

    with interpreted_kernels():
        assert lce.kernels.available(torch.zeros(1)), "the interpreted kernels did not import"
        yield lce.kernels


# ---- inputs and the reference's pieces -------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Problem:
    """One chunk: logits ``z`` (rows, C) fp32, its :class:`Chunk` (plan, targets) and the DzScale inputs."""

    z: torch.Tensor
    chunk: Chunk
    row_scales: RowScales
    rescale: float

    @property
    def targets(self) -> Targets:
        return self.chunk.targets

    @property
    def target_index(self) -> torch.Tensor:
        return self.targets.safe_target[self.chunk.rows]

    @property
    def class_weight(self) -> torch.Tensor | None:
        return self.targets.class_weight

    def dz_scale(self, lse: torch.Tensor) -> DzScale:
        scale = self.row_scales.dz_scale(self.chunk, lse)
        return dataclasses.replace(scale, rescale=self.rescale)


def make(*, seed: int = 0, rows: int = ROWS, classes: int = CLASSES, class_weight: bool = False,
         smoothing: float = 0.0, z_loss: float = 0.0, reduction: str = "mean", rescale: float = 1.0,
         logits: torch.Tensor | None = None, confident: bool = True) -> Problem:
    """Logits (normal, scale 2, or ``logits``) with targets in the first and last columns, ignored rows (from row
    10, every 13th) and, from row 3 where ``confident``, rows whose target leads by each of :data:`MARGINS`."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, classes, generator=g) * 2.0 if logits is None else logits.clone()
    target = torch.randint(0, classes, (rows,), generator=g)
    target[0], target[1] = 0, classes - 1
    for row, margin in enumerate(MARGINS if confident else (), start=3):
        if row < rows:
            z[row, target[row]] = z[row].max() + margin
    target[10::13] = IGNORED
    weight = torch.rand(classes, generator=g) * 1.5 + 0.5 if class_weight else None
    options = lce.LinearCrossEntropyOptions(batch_chunk_size=rows, chunking_method=None)
    plan = make_plan(options, num_rows=rows, in_features=4, num_classes=classes, dtype=torch.float32,
                     device=torch.device("cpu"), reduction=reduction, z_loss=z_loss)
    targets = Targets.build(target, class_weight=weight, ignore_index=IGNORED, label_smoothing=smoothing,
                            num_classes=classes, stats_dtype=torch.float32, z_loss=z_loss)
    head = HeadTensors(torch.zeros(rows, 4), torch.zeros(classes, 4), None)
    if reduction == "none":
        main = torch.randn(rows, generator=g)
    else:
        main = (1.0 / targets.row_weight.sum()).reshape(())
    z_scale = None
    if z_loss:
        z_scale = main if reduction == "none" else (1.0 / targets.valid.sum()).to(torch.float32).reshape(())
    chunk = Chunk(plan, head, None, targets, slice(0, rows), head.input)
    return Problem(z, chunk, RowScales(main, z_scale, 1.0, 1.0), rescale)


def dz_coefficients(chunk: Chunk, scale: DzScale) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(prob_coef, target_coef, smoothing_coef)``: the chunk loop's own coefficients of dz
    (:func:`lce.passes.grad_logits.dz_coefficients`), as the kernels take them."""
    coefficients = lce.passes.grad_logits.dz_coefficients(chunk, scale)
    return coefficients.prob, coefficients.target, coefficients.smoothing


# ---- how far apart: ulps, and errors against fp64 -----------------------------------------------------

def ulps(got: torch.Tensor, want: torch.Tensor, magnitude: torch.Tensor | None = None) -> float:
    """The largest ``|got - want|`` in fp32 ulps of ``magnitude`` (default ``|want|``); 0 where both agree."""
    return float(ulps_each(got, want, magnitude).max()) if got.numel() else 0.0


def ulps_each(got: torch.Tensor, want: torch.Tensor, magnitude: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`ulps` entry by entry."""
    size = (want.abs() if magnitude is None else magnitude).float()
    spacing = torch.nextafter(size, torch.tensor(math.inf, device=size.device)) - size
    diff = (got.double() - want.double()).abs()
    return torch.where(diff == 0, 0.0, diff / spacing.double())


def relative_ulps(got: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """Per entry, ``|got - exact| / |exact|`` in units of fp32's 2**-23 (an ulp at the bottom of a binade)."""
    return ((got.double() - exact) / exact).abs() / 2.0**-23


def exact_other(z: torch.Tensor, target_index: torch.Tensor) -> torch.Tensor:
    """``other`` in fp64 from the fp32 logits."""
    z = z.double()
    return (z - z.amax(1, keepdim=True)).exp().scatter(1, target_index[:, None], 0.0).sum(1)


def exact_other_prob(z: torch.Tensor, target_index: torch.Tensor) -> torch.Tensor:
    """``1 - p_y`` in fp64 from the fp32 logits."""
    z = z.double()
    target = (z.gather(1, target_index[:, None]).squeeze(1) - z.amax(1)).exp()
    other = exact_other(z, target_index)
    return other / (other + target)


def exact_dz(problem: Problem, scale: DzScale, cols: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
    """dz in fp64 from the fp32 logits and the fp32 coefficients (which kernels and reference share), and the
    magnitude of each entry's terms: where terms of both signs meet (the smoothing term, the target entry under
    a z-loss) the result's own ulp would measure cancellation, not the arithmetic."""
    prob_coef, target_coef, smoothing = (None if t is None else t.double()
                                         for t in dz_coefficients(problem.chunk, scale))
    z = problem.z.double()
    probs = torch.softmax(z, 1)
    other_prob = exact_other_prob(problem.z, problem.target_index)
    dz, magnitude = prob_coef[:, None] * probs, prob_coef.abs()[:, None] * probs
    index, in_block = block_target_index(problem.chunk, slice(None))
    p_y = probs.gather(1, index).squeeze(1)
    entry = (prob_coef - target_coef) * p_y - target_coef * other_prob
    size = (prob_coef - target_coef).abs() * p_y + target_coef.abs() * other_prob
    dz.scatter_(1, index, entry[:, None])
    magnitude.scatter_(1, index, size[:, None])
    if smoothing is not None:
        weight = (torch.ones(z.shape[1], dtype=z.dtype, device=z.device) if problem.class_weight is None
                  else problem.class_weight.double())
        dz += smoothing[:, None] * weight
        magnitude += smoothing.abs()[:, None] * weight.abs()
    return dz[:, cols], magnitude[:, cols]


def assert_no_further_from_fp64(got: torch.Tensor, want: torch.Tensor, exact: torch.Tensor, magnitude: torch.Tensor,
                                margin: float, what: str) -> None:
    """The kernels' error against ``exact`` (ulps of ``magnitude``) is at most the reference's largest + margin."""
    got_error, want_error = ulps(got, exact, magnitude), ulps(want, exact, magnitude)
    assert got_error <= want_error + margin, f"{what}: kernels {got_error:.2f} ulps, reference {want_error:.2f}"


# ---- the kernels against the reference --------------------------------------------------------------

@pytest.mark.parametrize("launch", STATISTICS_LAUNCHES)
def test_row_statistics_match_chunk_statistics(kernels, launch):
    problem = make(class_weight=True, smoothing=0.1)
    z, chunk = problem.z, problem.chunk
    got = kernels.row_statistics(z, problem.target_index, class_weight=problem.class_weight, weighted_logit_sum=True,
                                 launch=STATISTICS_LAUNCHES[launch])
    want = chunk_statistics_(z.clone(), chunk)
    assert torch.equal(got.row_max, want.row_max)
    assert torch.equal(got.target_logit, want.target_logit)
    exact = exact_other(z, problem.target_index)
    assert_no_further_from_fp64(got.other, want.other, exact, exact, OTHER_ULPS, "other")
    assert ulps(got.other, want.other) <= AGREE_ULPS
    # the weighted logit sum cancels: both against the fp64 sum, in ulps of the sum of its terms' magnitudes
    exact_weighted = z.double() @ problem.class_weight.double()
    magnitude = z.abs().double() @ problem.class_weight.double()
    assert_no_further_from_fp64(got.weighted_logit_sum, want.weighted_logit_sum, exact_weighted, magnitude, 4.0,
                                "weighted logit sum")
    assert torch.equal(z, problem.z), "the statistics pass leaves the logits as they are"


def test_confident_rows_keep_one_minus_p_y_to_fp32_precision(kernels):
    """Targets ahead by up to 40 nats: ``1 - p_y`` (4e-17 at 40 nats over 1000 classes, far below fp32's epsilon)
    keeps fp32's relative precision, as the reference's does; and so does dz's target entry, ``-s * (1 - p_y)``."""
    problem = make()
    confident = slice(3, 3 + len(MARGINS))
    stats = RowStatistics(*kernels.row_statistics(problem.z, problem.target_index, launch=Launch(128, splits=3)))
    want = chunk_statistics_(problem.z.clone(), problem.chunk)
    exact = exact_other_prob(problem.z, problem.target_index)[confident]
    assert float(exact[-1]) < 1e-16
    got_error = relative_ulps(stats.other_prob[confident], exact).max()
    want_error = relative_ulps(want.other_prob[confident], exact).max()
    assert got_error <= want_error + OTHER_ULPS and got_error <= 4, (got_error, want_error)
    dz = run_forward(kernels, problem, Launch(128, splits=3))[0]
    target_entry = dz[confident].gather(1, problem.target_index[confident, None]).squeeze(1)
    assert relative_ulps(-target_entry / problem.row_scales.main, exact).max() <= got_error + 2


def test_a_maximum_rising_at_every_block_costs_no_more_than_the_reference(kernels):
    """The online rescale's worst case: logits rising along the row, so each of 16 blocks raises the maximum and
    rescales everything gathered before it (by ``exp`` of the fall, its rounding put back: two-sum)."""
    g = torch.Generator().manual_seed(1)
    rising = torch.linspace(-30.0, 0.0, CLASSES) + 0.01 * torch.randn(8, CLASSES, generator=g)
    problem = make(seed=1, rows=8, logits=rising, confident=False)
    got = kernels.row_statistics(problem.z, problem.target_index, launch=Launch(64))
    want = chunk_statistics_(problem.z.clone(), problem.chunk)
    exact = exact_other(problem.z, problem.target_index)
    assert_no_further_from_fp64(got.other, want.other, exact, exact, OTHER_ULPS, "other")


def run_forward(kernels, problem: Problem, launch: Launch | None = None, grad_launch: Launch | None = None):
    """The kernels' forward of a scalar reduction: statistics, the losses and lse from them as lce forms them,
    then dz. Returns ``(dz, losses, lse, other_prob, scale)``."""
    z, chunk = problem.z.clone(), problem.chunk
    stats = RowStatistics(*kernels.row_statistics(z, problem.target_index, class_weight=problem.class_weight,
                                                  weighted_logit_sum=bool(problem.targets.label_smoothing),
                                                  launch=launch))
    losses, lse, other_prob = stats.losses(problem.targets, chunk.rows), stats.lse, stats.other_prob
    scale = problem.dz_scale(lse)
    prob_coef, target_coef, smoothing = dz_coefficients(chunk, scale)
    dz = kernels.grad_logits_(z, problem.target_index, stats.row_max, divisor=stats.sum_exp, prob_coef=prob_coef,
                              target_coef=target_coef, other_prob=other_prob, smoothing_coef=smoothing,
                              class_weight=problem.class_weight, launch=grad_launch)
    return dz, losses, lse, other_prob, scale


def reference_forward(problem: Problem):
    """lce's forward of a scalar reduction on one chunk: ``(dz, losses, lse, other_prob, scale)``."""
    z = problem.z.clone()
    losses, lse, other_prob = chunk_loss_and_softmax_(z, problem.chunk)
    scale = problem.dz_scale(lse)
    return chunk_grad_logits_(z, problem.chunk, other_prob, scale), losses, lse, other_prob, scale


FEATURES = {
    "plain": {},
    "class_weight": {"class_weight": True},
    "smoothing": {"smoothing": 0.1},
    "smoothing_class_weight": {"smoothing": 0.1, "class_weight": True},
    "z_loss": {"z_loss": 1e-2},
    "fp16_rescale": {"rescale": 2.0**-7},
    "reduction_none_scales": {"reduction": "none"},
    "everything": {"class_weight": True, "smoothing": 0.2, "z_loss": 1e-2, "rescale": 2.0**3, "reduction": "none"},
}


def _assert_forward_agrees(kernels, problem) -> torch.Tensor:
    """The fused forward pass against the PyTorch chunk loop: row statistics and losses within ROW_ULPS, dz no
    further from fp64 than the loop's and within AGREE_ULPS of it; returns the kernels' dz."""
    dz, losses, lse, other_prob, _ = run_forward(kernels, problem)
    want_dz, want_losses, want_lse, want_other_prob, scale = reference_forward(problem)
    assert ulps(lse, want_lse) <= ROW_ULPS
    assert ulps(other_prob, want_other_prob) <= ROW_ULPS
    assert ulps(losses, want_losses) <= ROW_ULPS
    exact, magnitude = exact_dz(problem, scale)
    assert_no_further_from_fp64(dz, want_dz, exact, magnitude, DZ_ULPS, "dz")
    assert ulps(dz, want_dz, magnitude) <= AGREE_ULPS
    return dz


@pytest.mark.parametrize("features", FEATURES)
def test_forward_dz_matches_the_chunk_loop(kernels, features):
    problem = make(seed=2, **FEATURES[features])
    dz = _assert_forward_agrees(kernels, problem)
    ignored = ~problem.targets.valid
    assert ignored.any() and (dz[ignored] == 0).all(), "ignored rows get no gradient"


def test_dz_alone_matches_chunk_grad_logits_given_the_same_statistics(kernels):
    """Handed the reference's own statistics, the gradient pass differs from it by ``exp``'s last bits only."""
    problem = make(seed=3, class_weight=True, smoothing=0.1, z_loss=1e-2, rescale=2.0**-5)
    stats = chunk_statistics_(problem.z.clone(), problem.chunk)
    want_dz, _, _, _, scale = reference_forward(problem)
    prob_coef, target_coef, smoothing = dz_coefficients(problem.chunk, scale)
    z = problem.z.clone()
    kernels.grad_logits_(z, problem.target_index, stats.row_max, divisor=stats.sum_exp, prob_coef=prob_coef,
                         target_coef=target_coef, other_prob=stats.other_prob, smoothing_coef=smoothing,
                         class_weight=problem.class_weight, launch=Launch(256))
    exact, magnitude = exact_dz(problem, scale)
    assert ulps(z, want_dz, magnitude) <= SAME_STATISTICS_ULPS
    assert_no_further_from_fp64(z, want_dz, exact, magnitude, DZ_ULPS, "dz")


@pytest.mark.parametrize("features", ["plain", "everything"])
def test_backward_of_reduction_none_matches_chunk_softmax_from_lse(kernels, features):
    """Backward recomputes dz from the saved lse: ``p = exp(z - lse)``, ``1 - p_y`` summed without the target."""
    problem = make(seed=4, **{**FEATURES[features], "reduction": "none"})
    lse = chunk_statistics_(problem.z.clone(), problem.chunk).lse
    scale = problem.dz_scale(lse)
    probs, other_prob = chunk_softmax_from_lse_(problem.z.clone(), problem.chunk, lse)
    want_dz = chunk_grad_logits_(probs, problem.chunk, other_prob, scale)
    z = problem.z.clone()
    got_other_prob = kernels.sum_apart_from_target(z, problem.target_index, lse, launch=Launch(256, splits=2))
    exact = exact_other_prob(problem.z, problem.target_index)
    assert_no_further_from_fp64(got_other_prob, other_prob, exact, exact, OTHER_ULPS, "1 - p_y")
    prob_coef, target_coef, smoothing = dz_coefficients(problem.chunk, scale)
    kernels.grad_logits_(z, problem.target_index, lse, prob_coef=prob_coef, target_coef=target_coef,
                         other_prob=got_other_prob, smoothing_coef=smoothing, class_weight=problem.class_weight)
    exact, magnitude = exact_dz(problem, scale)
    assert_no_further_from_fp64(z, want_dz, exact, magnitude, DZ_ULPS, "dz")
    assert ulps(z, want_dz, magnitude) <= SAME_STATISTICS_ULPS


def test_class_blocks_match_block_statistics_and_block_gradients(kernels):
    """Class tiling: the statistics folded block by block (the kernel starting from the running maximum) and dz
    of each block from the whole row's lse, as lce.passes' tiled passes form them."""
    problem = make(seed=5, class_weight=True, smoothing=0.1)
    chunk, z, weight = problem.chunk, problem.z, problem.class_weight
    blocks = (slice(0, 384), slice(384, CLASSES))
    want = got = None
    for cols in blocks:
        want = block_statistics_(z[:, cols].clone(), chunk, cols, want)
        index, in_block = block_target_index(chunk, cols)
        block = kernels.row_statistics(z[:, cols], torch.where(in_block, index.squeeze(1), -1),
                                       class_weight=weight[cols], weighted_logit_sum=True,
                                       running_max=None if got is None else got.row_max, launch=Launch(128))
        got = fold(got, RowStatistics(*block), in_block)
    assert torch.equal(got.row_max, want.row_max) and torch.equal(got.target_logit, want.target_logit)
    exact = exact_other(z, problem.target_index)
    assert_no_further_from_fp64(got.other, want.other, exact, exact, OTHER_ULPS, "other")
    scale = problem.dz_scale(want.lse)
    prob_coef, target_coef, smoothing = dz_coefficients(chunk, scale)
    for cols in blocks:
        want_dz = chunk_grad_logits_(z[:, cols].clone().sub_(want.lse[:, None]).exp_(), chunk, want.other_prob,
                                     scale, cols)
        index, in_block = block_target_index(chunk, cols)
        got_dz = kernels.grad_logits_(z[:, cols].clone(), torch.where(in_block, index.squeeze(1), -1), want.lse,
                                      prob_coef=prob_coef, target_coef=target_coef, other_prob=want.other_prob,
                                      smoothing_coef=smoothing, class_weight=weight[cols], launch=Launch(128))
        exact, magnitude = exact_dz(problem, scale, cols)
        assert_no_further_from_fp64(got_dz, want_dz, exact, magnitude, DZ_ULPS, f"dz of {cols}")
        assert ulps(got_dz, want_dz, magnitude) <= SAME_STATISTICS_ULPS


def fold(previous: RowStatistics | None, block: RowStatistics, in_block: torch.Tensor) -> RowStatistics:
    """A block's kernel statistics folded into the previous blocks', as lce.passes.statistics.block_statistics_ folds
    its
    own (the integration's few lines; the block's sum is already relative to the new maximum)."""
    if previous is None:
        return block
    carried = (previous.row_max - block.row_max).exp().nan_to_num_(0.0)
    return RowStatistics(block.row_max, torch.addcmul(block.other, previous.other, carried),
                         torch.where(in_block, block.target_logit, previous.target_logit),
                         None if block.weighted_logit_sum is None
                         else previous.weighted_logit_sum + block.weighted_logit_sum)


def test_kernels_are_deterministic(kernels):
    problem = make(seed=6, rows=13, smoothing=0.1)
    first = run_forward(kernels, problem, Launch(256, splits=2), Launch(256))
    second = run_forward(kernels, problem, Launch(256, splits=2), Launch(256))
    assert all(torch.equal(a, b) for a, b in zip(first[:4], second[:4], strict=True))


# ---- dispatch and arguments -------------------------------------------------------------------------

def test_available_only_on_cuda_outside_the_interpreter(monkeypatch):
    """CPU tensors never run the kernels unless a test asks (the interpreter is far slower than the PyTorch ops),
    whether or not TRITON_INTERPRET is set."""
    import lce.kernels

    assert not lce.kernels.available(torch.zeros(3))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not lce.kernels.available(torch.zeros(3))
    assert not lce.kernels.available(torch.zeros(3, device="meta"))
    assert not lce.kernels.available(torch.device("cpu"))


def test_available_on_cpu_tensors_under_the_interpreter(kernels):
    assert kernels.available(torch.zeros(3)) and kernels.available(torch.device("cpu"))
    assert not kernels.available(torch.zeros(3, device="meta"))


def test_covers_every_option_but_soft_capping_and_wide_statistics():
    """Label smoothing, class weights, a z-loss reach the kernels through their coefficients; a soft cap and fp64
    statistics do not, and the plan says which."""
    import lce.kernels

    assert lce.kernels.covers(stats_dtype=torch.float32) and lce.kernels.uncovered(stats_dtype=torch.float32) is None
    assert "soft-capping" in lce.kernels.uncovered(stats_dtype=torch.float32, softcap=30.0)
    assert "float64 statistics" in lce.kernels.uncovered(stats_dtype=torch.float64)
    x, w = torch.zeros(8, 4), torch.zeros(16, 4)
    with emulate_device_kind("cuda"), interpreted_kernels():
        capped = lce.plan(x, w, softcap=30.0)
        assert capped.passes_reason == "PyTorch ops (soft-capping, which the kernels do not cover)"
        assert "two fused Triton kernels" in lce.plan(x, w).passes_reason
    assert lce.plan(x, w).passes_reason == "PyTorch ops (cpu tensors (the kernels run on CUDA))"


def test_arguments_are_checked(kernels):
    z, target = torch.zeros(4, 10), torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match="z must be a 2-D float32"):
        kernels.row_statistics(z.double(), target)
    with pytest.raises(ValueError, match="contiguous"):
        kernels.row_statistics(torch.zeros(10, 4).T, target)
    with pytest.raises(ValueError, match="target_index must be a \\(4,\\) torch.int64"):
        kernels.row_statistics(z, target.int())
    with pytest.raises(ValueError, match="class_weight must be a \\(10,\\) float32"):
        kernels.row_statistics(z, target, class_weight=torch.ones(9), weighted_logit_sum=True)
    ones = torch.ones(4)
    with pytest.raises(ValueError, match="prob_coef must be a \\(4,\\)"):
        kernels.grad_logits_(z, target, ones, prob_coef=torch.ones(5), target_coef=ones, other_prob=ones)


def test_empty_chunks_and_one_class(kernels):
    stats = kernels.row_statistics(torch.zeros(0, 7), torch.zeros(0, dtype=torch.int64))
    assert stats.other.shape == (0,)
    z = torch.full((3, 1), 2.0)
    stats = kernels.row_statistics(z, torch.zeros(3, dtype=torch.int64))
    assert torch.equal(stats.other, torch.zeros(3)) and torch.equal(stats.target_logit, z[:, 0])


def test_default_launches_cover_the_row():
    cpu = torch.device("cpu")
    assert statistics_launch(37, 1000, cpu) == Launch(1024, 2, 1)
    assert grad_launch(37, 1000, cpu) == Launch(1024, 2)
    big = statistics_launch(256, 256000, cpu)
    assert big.block == 4096 and big.splits == 1 and big.blocks(256000) == 63
    with pytest.raises(ValueError, match="Launch.block must be a power of two"):
        Launch(1000)


@pytest.mark.slow
def test_import_lce_never_imports_triton():
    """``import lce`` and a check on a CPU tensor leave triton unimported (it costs about a second and 1 GB)."""
    code = ("import sys, torch, lce, lce.kernels, lce.passes.loss\n"
            "assert not lce.kernels.available(torch.zeros(1))\n"
            "assert 'triton' not in sys.modules, 'triton was imported'\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


@pytest.mark.slow
def test_a_larger_chunk_with_the_default_launches(kernels):
    """64 rows x 50000 classes, every option on, default launches (blocks of 4096 and 2048 columns): the
    comparison the ``cuda`` test makes, in the interpreter (about 15 s)."""
    compare_a_larger_chunk(kernels, lambda tensor: tensor)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_kernels_on_cuda_match_the_chunk_loop():
    """The same comparison with the compiled kernels (libdevice exp, no fused multiply-adds) on a GPU (a session
    with CUDA leaves TRITON_INTERPRET unset: tests/conftest.py)."""
    import lce.kernels

    compare_a_larger_chunk(lce.kernels, lambda tensor: tensor.cuda())


ON_CUDA = pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                           reason="needs a CUDA device")])


@pytest.mark.parametrize("device", ["cpu", ON_CUDA])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_the_op_runs_the_kernels_and_gives_the_pytorch_paths_numbers(reduction, device, monkeypatch):
    """End to end: a CUDA plan says ``fused_passes``; loss and gradients agree with the PyTorch ops' path to a few
    fp32 ulps, bf16 input, class tiling and label smoothing included. On a GPU with the compiled kernels; on the CPU
    with CUDA's layouts and the kernels through Triton's interpreter (smaller), so that what the test itself gets
    wrong fails here, not on a GPU."""
    import lce.kernels

    rows, classes, block = (256, 5000, 1024) if device == "cuda" else (48, 700, 256)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(rows, 64, generator=g).bfloat16().to(device)
    w = (torch.randn(classes, 64, generator=g) * 0.5).bfloat16().to(device)
    y = torch.randint(0, classes, (rows,), generator=g).to(device)
    options = lce.LinearCrossEntropyOptions(batch_chunk_size=rows // 4, class_chunk_size=block)
    with contextlib.ExitStack() as stack:
        if device == "cpu":
            stack.enter_context(emulate_device_kind("cuda"))
            stack.enter_context(interpreted_kernels())
        assert lce.plan(x, w.requires_grad_(), options=options).fused_passes
        fused = loss_and_grads(options, x, w, y, reduction=reduction, label_smoothing=0.1)
        monkeypatch.setattr(lce.kernels, "available", lambda where: False)
        reference = loss_and_grads(options, x, w, y, reduction=reduction, label_smoothing=0.1)
    for got, expected in zip(fused, reference, strict=True):
        assert float((got - expected).norm() / expected.norm()) < 1e-2  # bf16 gradients: a rounding at most


def compare_a_larger_chunk(kernels, move) -> None:
    """The forward of a 64 x 50000 chunk with every option, its tensors moved by ``move``, kernels against the
    chunk loop's PyTorch ops."""
    cpu = make(seed=7, class_weight=True, smoothing=0.1, z_loss=1e-2, rescale=2.0**-7, rows=64, classes=50000)
    problem = dataclasses.replace(cpu, z=move(cpu.z), row_scales=_moved(cpu.row_scales, move),
                                  chunk=dataclasses.replace(cpu.chunk, targets=_moved(cpu.targets, move)))
    assert kernels.available(problem.z)
    _assert_forward_agrees(kernels, problem)


def _moved(obj, move):
    """A dataclass with its tensor fields moved by ``move``."""
    return dataclasses.replace(obj, **{field.name: move(getattr(obj, field.name)) for field in dataclasses.fields(obj)
                                       if isinstance(getattr(obj, field.name), torch.Tensor)})


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("variant", ["plain", "tiled, smoothed, weighted, z-loss"])
def test_the_op_runs_the_kernels_when_its_plan_says_so_and_gives_the_pytorch_paths_numbers(kernels, reduction,
                                                                                            variant):
    """End to end: under the interpreter a CPU plan says ``fused_passes`` and the chunk loop calls the kernels
    (counted); loss and gradients agree with the PyTorch ops' path (plan without the kernels) to a few fp32 ulps."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(37, 16, generator=g, dtype=torch.float32)
    w = torch.randn(300, 16, generator=g, dtype=torch.float32) * 2
    y = torch.randint(0, 300, (37,), generator=g)
    y[::5] = -100
    extras = dict() if variant == "plain" else dict(weight=torch.rand(300, generator=g) + 0.5, label_smoothing=0.1,
                                                     z_loss=1e-3)
    options = lce.LinearCrossEntropyOptions(batch_chunk_size=8,
                                            class_chunk_size=None if variant == "plain" else 64)

    def run():
        leaves = [x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()]
        loss = lce.linear_cross_entropy(*leaves, y, reduction=reduction, options=options, **extras)
        loss.backward(torch.linspace(0.5, 1.5, loss.numel()).reshape(loss.shape) if loss.dim() else None)
        return [loss.detach(), *(t.grad for t in leaves)]

    calls = []
    original = kernels.grad_logits_

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernels, "grad_logits_", counted)
        assert lce.plan(x, w, options=options).fused_passes
        fused = run()
    assert calls, "the chunk loop did not call the kernels"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernels, "available", lambda where: False)
        assert not lce.plan(x, w, options=options).fused_passes
        reference = run()
    for got, expected in zip(fused, reference, strict=True):
        assert float((got - expected).abs().max() / expected.abs().max()) < 1e-6


def test_a_kernel_that_fails_to_compile_warns_once_and_the_pass_runs_the_pytorch_ops(kernels, monkeypatch):
    """A Triton error at a kernel's first launch (here a stand-in raised by the statistics kernel) is not silent:
    lce warns once, naming it, runs the whole pass again with the PyTorch ops (the same numbers as a plan without
    the kernels), and every later plan says why the kernels are out."""

    class FakeCompilationError(Exception):
        pass

    FakeCompilationError.__module__ = "triton.compiler.errors"  # what lce.kernels recognises as Triton's own
    passes = kernels._passes()

    def failing(*args, **kwargs):
        raise FakeCompilationError("at 12:8: type mismatch in the stand-in")

    monkeypatch.setattr(kernels, "_launch_error", None)
    monkeypatch.setattr(kernels, "_warned", set())
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(24, 8, generator=g), torch.randn(90, 8, generator=g)
    y = torch.randint(0, 90, (24,), generator=g)
    options = lce.LinearCrossEntropyOptions(batch_chunk_size=8)
    with emulate_device_kind("cuda"):
        before = lce.plan(x, w.requires_grad_(), options=options)
        with monkeypatch.context() as patch:
            patch.setattr(kernels, "available", lambda where: False)
            expected = loss_and_grads(options, x, w, y)
        monkeypatch.setattr(passes, "row_statistics", failing)
        with pytest.warns(kernels.KernelsFallbackWarning, match="type mismatch in the stand-in"):
            got = loss_and_grads(options, x, w, y)
        after = lce.plan(x, w, options=options)
    assert before.fused_passes and not after.fused_passes
    assert "a kernel failed to compile or launch: FakeCompilationError" in str(after)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)
