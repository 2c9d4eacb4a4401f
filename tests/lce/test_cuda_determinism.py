"""No atomic accumulation on lce's CUDA path, checked on the CPU: every aten op the CUDA layouts call is recorded
(a dispatch mode under ``emulate_device_kind("cuda")``) and held against the ops torch documents as
nondeterministic on CUDA (``torch.use_deterministic_algorithms``' docstring, torch 2.13).

Two kinds of op are in that list. Accumulating scatters (``index_add``, ``scatter_add``, ``scatter_reduce``,
``index_put`` with ``accumulate=True``, ``put_``), ``cumsum`` of floats, ``histc``, ``bincount``, ``median``,
``nll_loss``: their result depends on the order in which CUDA threads add, so none may be called at all. Writing
scatters (``index_copy``, ``index_put``, ``scatter`` of a tensor): nondeterministic only where two writes land on
the same element with different values, so each call is checked for that (lce's target-row correction writes each
class row once per row of that class, with the same bits: lce.passes.gradients.TargetResidual.add_to_weight_rows_).

The kernels (lce.kernels) are Triton programs with no atomics (their module says how they merge splits); the
cases with ``kernels=True`` run them through Triton's interpreter and check the ops around them.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import lce
import lce.checks
from lce.testing import emulate_device_kind, interpreted_kernels

ACCUMULATING = frozenset({
    "index_add", "index_add_", "scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_", "put", "put_",
    "histc", "bincount", "median", "nanmedian", "cumsum", "cumsum_", "cumprod", "cumprod_", "nll_loss",
    "nll_loss_forward", "nll_loss2d", "nll_loss2d_forward", "embedding_dense_backward", "_embedding_bag_backward",
    "index_put_impl_", "_index_put_impl_",
})
"""aten ops that are nondeterministic on CUDA whatever their arguments (by torch's documented list), by name."""

WRITING = frozenset({"index_copy", "index_copy_", "index_put", "index_put_", "scatter", "scatter_"})
"""aten ops nondeterministic on CUDA only where two writes to one element carry different values."""


class _OpRecorder(TorchDispatchMode):
    """Runs every op; keeps each op's name and, for a writing scatter, whether it could race."""

    def __init__(self):
        super().__init__()
        self.names: set[str] = set()
        self.races: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.names.add(name)
        if name in WRITING:
            race = _race(name, args, kwargs)
            if race:
                self.races.append(f"{func}: {race}")
        return func(*args, **kwargs)


def _race(name: str, args, kwargs) -> str | None:
    """Why this writing scatter would depend on the order of its writes (None: it would not)."""
    if name.startswith("index_copy"):
        target, dim, index, source = args[:4]
        return _repeats_differ(index, source.movedim(dim, 0) if source.dim() else source.reshape(1))
    if name.startswith("index_put"):
        target, indices, values = args[:3]
        accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
        if accumulate:
            return "accumulate=True"
        live = [i for i in indices if i is not None]
        if len(live) != 1 or indices[0] is None or live[0].dtype == torch.bool:
            return None if all(i is None or i.dtype == torch.bool for i in indices) else "indices on several dims"
        index = live[0].reshape(-1)
        values = values.expand(index.shape + target.shape[1:]) if values.dim() else values.expand(index.shape)
        return _repeats_differ(index, values.reshape(index.shape[0], -1))
    # scatter / scatter_ with a tensor src along dim: a race only where one row repeats a destination
    if len(args) < 4 or not isinstance(args[3], torch.Tensor):
        return None  # a scalar value: every write carries the same bits
    target, dim, index, src = args[:4]
    moved_index, moved_src = index.movedim(dim, -1), src.movedim(dim, -1)[..., :index.shape[dim]]
    for flat_index, flat_src in zip(moved_index.reshape(-1, moved_index.shape[-1]),
                                    moved_src.reshape(-1, moved_src.shape[-1]), strict=True):
        race = _repeats_differ(flat_index, flat_src[:, None])
        if race:
            return race
    return None


def _repeats_differ(index: torch.Tensor, values: torch.Tensor) -> str | None:
    """Where ``index`` repeats a destination, whether the rows of ``values`` written there differ in any bit."""
    index = index.reshape(-1)
    for destination in index.unique():
        rows = values[(index == destination).nonzero().reshape(-1)]
        if rows.shape[0] > 1 and not (rows == rows[:1]).all() | (rows.isnan() & rows[:1].isnan()).all():
            return f"destination {int(destination)} written {rows.shape[0]} times with different values"
    return None


@dataclasses.dataclass(frozen=True)
class Case:
    policy: str
    dtype: torch.dtype
    rows: int | None  # rows per chunk (None: auto)
    classes: int | None  # classes per block (None: no tiling)
    reduction: str = "mean"
    extras: str = ""  # "softcap", "zloss", "smoothing", "weight", "lse", "ignore", "bias" joined by "+"
    kernels: bool = False
    wide_sum: bool = True  # acc_dtype fp32 (the weight-gradient sum in an fp32 accumulator), else the default

    @property
    def options(self) -> lce.LinearCrossEntropyOptions:
        wide = self.wide_sum and self.dtype != torch.float32
        return lce.LinearCrossEntropyOptions(acc_policy=self.policy, acc_dtype=torch.float32 if wide else None,
                                             batch_chunk_size=self.rows, class_chunk_size=self.classes)

    def __str__(self) -> str:
        return (f"{self.policy}-{str(self.dtype)[6:]}-rows{self.rows}-classes{self.classes}-{self.reduction}"
                f"-{self.extras or 'plain'}{'-kernels' if self.kernels else ''}{'' if self.wide_sum else '-narrow'}")


N, D, C = 48, 16, 300
TARGET_POOL = 7  # few distinct targets, so that rows share them (the target-row correction's repeated writes)

CASES = [
    Case(policy, dtype, rows, classes, reduction, wide_sum=wide)
    for policy, dtype, (rows, classes), reduction, wide in itertools.product(
        ("auto", "accurate", "balanced", "compact"), (torch.bfloat16, torch.float16),
        ((16, None), (None, None), (16, 96), (N, None)), ("mean", "none"), (True, False))
    if policy != "auto" or wide
] + [
    Case("balanced", torch.bfloat16, 16, None, "sum", "softcap+zloss+lse+bias"),
    Case("balanced", torch.bfloat16, 16, 96, "mean", "smoothing+weight+ignore"),
    Case("compact", torch.float16, 16, 96, "none", "softcap+smoothing+ignore+bias"),
    Case("accurate", torch.float32, 16, 96, "mean", "zloss+weight+lse"),
    Case("balanced", torch.bfloat16, 16, None, "mean", "smoothing+weight+ignore", kernels=True),
    Case("balanced", torch.bfloat16, 16, 96, "none", "zloss+bias", kernels=True),
]


def _problem(case: Case):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(N, D, generator=g).to(case.dtype).requires_grad_()
    w = (torch.randn(C, D, generator=g) * 0.5).to(case.dtype).requires_grad_()
    bias = (torch.randn(C, generator=g) * 0.1).to(case.dtype).requires_grad_() if "bias" in case.extras else None
    y = torch.randint(0, TARGET_POOL, (N,), generator=g) * 37 % C
    if "ignore" in case.extras:
        y[::5] = -100
    return x, w, bias, y


def _run_loss(case: Case) -> None:
    x, w, bias, y = _problem(case)
    extras = case.extras.split("+")
    out = lce.linear_cross_entropy(
        x, w, y, linear_bias=bias, reduction=case.reduction, options=case.options,
        weight=torch.linspace(0.5, 1.5, C) if "weight" in extras else None,
        label_smoothing=0.1 if "smoothing" in extras else 0.0, softcap=30.0 if "softcap" in extras else None,
        z_loss=1e-3 if "zloss" in extras else 0.0, return_lse="lse" in extras)
    loss = out[0] if isinstance(out, tuple) else out
    loss.backward(torch.linspace(0.5, 1.5, N).to(loss.dtype) if loss.dim() else None)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_cuda_layouts_call_no_op_that_is_nondeterministic_on_cuda(case):
    recorder = _OpRecorder()
    with emulate_device_kind("cuda"), (interpreted_kernels() if case.kernels else _nothing()):
        plan = lce.plan(*_problem(case)[:2], options=case.options)
        assert plan.fused_passes == (case.kernels and "softcap" not in case.extras), str(plan)
        with recorder:
            _run_loss(case)
    assert not recorder.names & ACCUMULATING, sorted(recorder.names & ACCUMULATING)
    assert not recorder.races, recorder.races


@pytest.mark.parametrize(("policy", "entropy", "softcap"), [("balanced", True, None), ("compact", False, 20.0),
                                                             ("accurate", True, 20.0)])
def test_the_cuda_log_probs_call_no_op_that_is_nondeterministic_on_cuda(policy, entropy, softcap):
    case = Case(policy, torch.bfloat16, 16, 96)
    x, w, _, y = _problem(case)
    recorder = _OpRecorder()
    with emulate_device_kind("cuda"), recorder:
        out = lce.linear_log_probs(x, w, y, temperature=0.7, return_entropy=entropy, softcap=softcap,
                                   options=lce.LinearCrossEntropyOptions(acc_policy=policy, batch_chunk_size=16,
                                                                         class_chunk_size=96))
        log_probs, ent = out if entropy else (out, None)
        (log_probs.sum() + (ent.sum() if ent is not None else 0)).backward()
    assert not recorder.names & ACCUMULATING, sorted(recorder.names & ACCUMULATING)
    assert not recorder.races, recorder.races


def test_the_cases_reach_the_target_row_correction():
    """The sum that once used index_add_ (the target rows' residuals into a wider weight-gradient sum) runs in the
    cases above, with rows sharing a target."""
    with emulate_device_kind("cuda"):
        reached = [case for case in CASES
                   if lce.plan(*_problem(case)[:2], options=case.options).target_residual_to_weight]
    assert len(reached) >= 20 and {case.policy for case in reached} >= {"auto", "balanced"}


def test_the_recorder_sees_an_atomic_scatter_and_a_racing_write():
    """The check can fail: index_add_ is named, and an index_copy_ writing two different rows to one class races,
    while the same row twice does not."""
    recorder = _OpRecorder()
    target, index = torch.zeros(4, 3), torch.tensor([1, 1])
    with recorder:
        target.index_add_(0, index, torch.ones(2, 3))
        target.index_copy_(0, index, torch.tensor([[1.0, 2, 3], [1, 2, 3]]))
        assert not recorder.races
        target.index_copy_(0, index, torch.tensor([[1.0, 2, 3], [1, 2, 4]]))
    assert "index_add_" in recorder.names & ACCUMULATING
    assert len(recorder.races) == 1 and "destination 1 written 2 times" in recorder.races[0]


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


HOST_READS = frozenset({"_local_scalar_dense", "nonzero", "nonzero_static", "masked_select", "_unique", "_unique2",
                        "unique_dim", "unique_consecutive", "unique_dim_consecutive", "equal", "is_nonzero",
                        "allclose"})
"""aten ops that read a value on the host (``.item()``, data-dependent shapes): each synchronises a GPU."""


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_the_default_cuda_path_reads_no_value_on_the_host(dtype, monkeypatch):
    """The CPU twin of tests/lce/test_cuda.py's sync-debug test (issue 33): lce's default options on the CUDA
    layouts, loss and per-token log-probabilities with a temperature per token, call no op that reads a value on
    the host, so a change that adds one fails here, not only on a GPU. The argument checks read CPU tensors on the
    host by design (lce.checks); here they take the device-side assert a CUDA tensor gets."""
    monkeypatch.setattr(lce.checks, "checks_eagerly", lambda tensor: False)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(300, 16, generator=g) / 4).to(dtype).requires_grad_()
    target = torch.randint(0, TARGET_POOL, (64,), generator=g) * 37 % 300
    recorder = _OpRecorder()
    with emulate_device_kind("cuda"), recorder:
        lce.linear_cross_entropy(x, w, target, options=lce.LinearCrossEntropyOptions()).backward()
        log_probs, entropy = lce.linear_log_probs(x, w, target, temperature=torch.full((64,), 0.8),
                                                  return_entropy=True)
        (log_probs.sum() + entropy.sum()).backward()
    assert not recorder.names & HOST_READS, sorted(recorder.names & HOST_READS)
