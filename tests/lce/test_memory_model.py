"""The memory model (lce.planning.memory_model) against the allocations the chunk loop really makes.

The model lists buffers by reading the plan; the loop allocates by running.
Nothing but this test ties the two, so it runs the op (forward and backward)
for every policy x device kind x reduction x dtype x acc_dtype, records every
tensor each aten op creates -- not views, not in-place or ``out=`` results --
with its shape in memory order, dtype, size, pass and chunk, and checks:

* every planned buffer is made, with its shape and dtype, in its pass -- a
  "chunk" buffer in every full chunk, the others outside the chunks;
* nothing as large as a chunk of logits is made that the plan does not list;
* the most bytes a chunk's tensors hold at once (per-row values aside) is
  exactly the plan's chunk peak, the term the predicted peak is built from.

The CUDA layouts run on CPU tensors (lce.testing.emulate_device_kind). There,
lce.passes.gemm's exact stand-in for CUDA's mixed-precision GEMM counts as one
allocation, its result, and fp16 GEMMs run natively, as they do on a GPU: the
temporaries of the CPU emulation are not the CUDA op's. What kernels allocate
inside themselves (workspaces, packed operands) is invisible here; the
allocator-level comparison in tests/analysis/test_memory.py covers it.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import weakref
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import lce
import lce.passes.gemm
import lce.passes.logprob_passes
import lce.passes.loss
import lce.planning.blocks
from lce.planning.buffers import chunk_peak_bytes
from lce.planning.options import EXPLICIT_POLICIES, dtype_name
from lce.testing import cpu_gemms, emulate_device_kind

PLAN_MODULE = importlib.import_module("lce.planning.plan")

N, D, C, ROWS = 80, 28, 320, 24  # three full chunks of 24 rows and one of 8; (C, D) > (ROWS, C)
INVARIANT_ROWS = 64  # a batch-invariant call's fixed rows: 80 rows are a chunk and one padded with 48 ignored rows
BLOCK_ELEMENTS = 64 * D  # weight blocks of 64 rows: the blocked upcasts are visible at this size
CHUNK_FUNCTIONS = ("_scalar_chunk", "_per_row_loss_chunk", "_per_row_grad_chunk", "_scalar_chunk_tiled",
                   "_per_row_loss_chunk_tiled", "_per_row_grad_chunk_tiled")
TOKEN_CHUNK_FUNCTIONS = ("_chunk_statistics", "_chunk_gradients")  # lce.linear_log_probs's passes
CLASS_BLOCK = 96  # C = 320 in three blocks of 96 classes and one of 32


@dataclasses.dataclass(frozen=True)
class Allocation:
    stage: str  # "forward" or "backward"
    rows: int | None  # rows of the chunk that made it; None outside the chunks
    shape: tuple[int, ...]  # in memory order (a transposed copy of W is (C, D), like W)
    dtype: torch.dtype
    nbytes: int


class _Recorder(TorchDispatchMode):
    """Records the tensors that aten ops create (not views, not in-place or out= results)."""

    def __init__(self):
        super().__init__()
        self.stage = "forward"
        self.rows: int | None = None
        self.chunk_rows = ROWS  # the rows of a chunk whose allocations are checked
        self.paused = 0
        self.allocations: list[Allocation] = []
        self.live_chunk_bytes = 0
        self.peak_chunk_bytes: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.paused:
            outputs = out if isinstance(out, (tuple, list)) else (out,)
            for tensor, returned in zip(outputs, func._schema.returns, strict=False):
                if isinstance(tensor, torch.Tensor) and returned.alias_info is None:
                    self.note(tensor)
        return out

    def note(self, tensor: torch.Tensor) -> None:
        order = sorted(range(tensor.dim()), key=lambda i: -tensor.stride(i))
        nbytes = tensor.numel() * tensor.element_size()
        self.allocations.append(Allocation(self.stage, self.rows, tuple(tensor.shape[i] for i in order),
                                           tensor.dtype, nbytes))
        if self.rows == self.chunk_rows and tensor.numel() > self.rows:  # per-row values are not modeled
            self.live_chunk_bytes += nbytes
            weakref.finalize(tensor, self._freed, nbytes)
            peak = max(self.peak_chunk_bytes.get(self.stage, 0), self.live_chunk_bytes)
            self.peak_chunk_bytes[self.stage] = peak

    def _freed(self, nbytes: int) -> None:
        self.live_chunk_bytes -= nbytes

    def start_chunk(self, rows: slice) -> None:
        self.rows = rows.stop - rows.start
        self.live_chunk_bytes = 0


@pytest.fixture
def recorder(monkeypatch):
    recorder = _Recorder()
    monkeypatch.setattr(lce.planning.blocks, "_BLOCK_ELEMENTS", BLOCK_ELEMENTS)
    for name in CHUNK_FUNCTIONS:
        monkeypatch.setattr(lce.passes.loss, name, _marking_chunks(getattr(lce.passes.loss, name), recorder))
    for name in TOKEN_CHUNK_FUNCTIONS:
        passes = lce.passes.logprob_passes
        monkeypatch.setattr(passes, name, _marking_chunks(getattr(passes, name), recorder))
    return recorder


def _marking_chunks(chunk_function, recorder: _Recorder):
    def run_chunk(*args):
        recorder.start_chunk(next(a for a in args if isinstance(a, slice)))
        try:
            return chunk_function(*args)
        finally:
            recorder.rows = None

    return run_chunk


def _emulate_cuda_gemms(monkeypatch, recorder: _Recorder) -> None:
    exact_stand_in = lce.passes.gemm._mm_via_upcast

    def mixed_precision_mm(*args):
        recorder.paused += 1
        try:
            result = exact_stand_in(*args)
        finally:
            recorder.paused -= 1
        recorder.note(result)
        return result

    monkeypatch.setattr(lce.passes.gemm, "_mm_via_upcast", mixed_precision_mm)
    # narrow GEMMs run natively, as a GPU runs them: not on fp32 copies, as lce does on a CPU without fast ones
    monkeypatch.setattr(PLAN_MODULE.Plan, "narrow_gemms_in_fp32", property(lambda plan: False))


def _record(recorder, kind, options, dtype, reduction, needs_grad, features=None):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g).to(dtype).requires_grad_(needs_grad[0])
    w = (torch.randn(C, D, generator=g) / D**0.5).to(dtype).requires_grad_(needs_grad[1])
    b = torch.randn(C, generator=g).to(dtype).requires_grad_(needs_grad[2])
    target = torch.randint(0, C, (N,), generator=g)
    target[1::7] = -100
    features = features or {}
    with emulate_device_kind(kind):
        plan = lce.plan(x, w, options=options, linear_bias=b, reduction=reduction, **features)
        with recorder:
            loss = lce.linear_cross_entropy(x, w, target, linear_bias=b, reduction=reduction, options=options,
                                            **features)
            if features.get("return_lse"):
                loss, _ = loss
            recorder.stage = "backward"
            if loss.requires_grad:
                loss.backward(torch.ones_like(loss))
    return plan


def _check(plan, recorder: _Recorder, label: str) -> None:
    rows = recorder.chunk_rows
    if plan.batch_invariant:  # every chunk padded to its rows (the padded copies made in the last chunk alone)
        assert plan.batch_chunk_size == rows and plan.loop_rows > plan.num_rows, label
        full_chunks_per_pass = plan.num_chunks
    else:
        assert plan.batch_chunk_size == rows and plan.num_chunks == 4, label
        full_chunks_per_pass = 3

    def key(stage: str, in_chunk: bool, shape: tuple[int, ...], dtype: torch.dtype):
        return stage, in_chunk, tuple(shape), dtype

    def text(k) -> str:
        return f"{k[0]} {'chunk' if k[1] else 'outside the chunks'} {k[2]} {dtype_name(k[3])}"

    def last_chunk_only(buffer) -> bool:
        return buffer.name.startswith("padded_")

    planned = Counter(key(b.stage, b.span == "chunk", b.shape, b.dtype) for b in plan.buffers)
    made = Counter(key(a.stage, a.rows is not None, a.shape, a.dtype) for a in recorder.allocations
                   if a.rows in (None, rows))
    for k in planned:
        listed = [b for b in plan.buffers if key(b.stage, b.span == "chunk", b.shape, b.dtype) == k]
        names = [b.name for b in listed]
        # per pass: a chunk buffer in every chunk, the padded last chunk's copies once, a call buffer once
        wanted = sum(1 if last_chunk_only(b) or not k[1] else full_chunks_per_pass for b in listed)
        assert made[k] >= wanted, f"{label}: planned {names} ({text(k)}) {wanted} time(s) per pass, made {made[k]}"

    logits_bytes = next(b.nbytes for b in plan.buffers if b.name == "logits_chunk")
    for a in recorder.allocations:
        k = key(a.stage, a.rows is not None, a.shape, a.dtype)
        if a.rows in (None, rows) and k not in planned:
            assert a.nbytes < logits_bytes, (
                f"{label}: unplanned allocation {text(k)} of {a.nbytes} bytes; a chunk of logits is {logits_bytes}")

    for stage in ("forward", "backward"):
        held, modeled = recorder.peak_chunk_bytes.get(stage, 0), chunk_peak_bytes(plan.buffers, stage)
        assert held == modeled, f"{label}: a {stage} chunk held {held} bytes at once, the plan says {modeled}"


GRID = list(itertools.product(["cpu", "cuda"], EXPLICIT_POLICIES, ["mean", "sum", "none"],
                              [torch.float32, torch.bfloat16, torch.float16], [None, torch.float32]))
# acc_dtype narrower than, or unrelated to, the input: legal, rarely wise, modeled all the same
GRID += [
    ("cpu", "accurate", "mean", torch.float32, torch.float16),
    ("cpu", "balanced", "none", torch.bfloat16, torch.float16),
    ("cuda", "balanced", "sum", torch.float32, torch.bfloat16),
    ("cpu", "compact", "none", torch.float64, torch.float32),
    ("cuda", "accurate", "mean", torch.float64, torch.float32),
]



def _tiered(cases, fast) -> list:
    """The cases as parameters, those ``fast(*case)`` rejects marked ``slow``: ``make test-fast`` checks the model on
    bf16 with fp32 accumulation on every layout, policy and reduction; ``make test`` (CI) on the whole grid."""
    return [pytest.param(*case, marks=() if fast(*case) else pytest.mark.slow) for case in cases]


def _bf16_fp32(*case) -> bool:
    return torch.bfloat16 in case and torch.float32 in case


@pytest.mark.parametrize(("kind", "policy", "reduction", "dtype", "acc_dtype"), _tiered(GRID, _bf16_fp32),
                         ids=[f"{k}-{p}-{r}-{dtype_name(d)}-{dtype_name(a) if a else 'acc=input'}"
                              for k, p, r, d, a in GRID])
def test_planned_buffers_are_the_allocations_made(recorder, monkeypatch, kind, policy, reduction, dtype, acc_dtype):
    if kind == "cuda":
        _emulate_cuda_gemms(monkeypatch, recorder)
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=acc_dtype, chunking_method=None,
                                            batch_chunk_size=ROWS)
    plan = _record(recorder, kind, options, dtype, reduction, (True, True, True))
    _check(plan, recorder, f"{kind} {policy} {reduction} {dtype_name(dtype)} acc={acc_dtype}")


INVARIANT_GRID = [(k, p, r, d, a) for k, p, r, d, a in GRID[:len(GRID) - 5] if a is not None or d == torch.float32]


@pytest.mark.parametrize(("kind", "policy", "reduction", "dtype", "acc_dtype"), _tiered(INVARIANT_GRID, _bf16_fp32),
                         ids=[f"{k}-{p}-{r}-{dtype_name(d)}-{dtype_name(a) if a else 'acc=input'}"
                              for k, p, r, d, a in INVARIANT_GRID])
def test_batch_invariant_buffers_are_the_allocations_made(recorder, monkeypatch, kind, policy, reduction, dtype,
                                                          acc_dtype):
    """A batch-invariant call: per-row buffers of the padded rows, the last chunk's padded input copy and, where
    its input gradient is written in place, a chunk-sized buffer for it."""
    if kind == "cuda":
        _emulate_cuda_gemms(monkeypatch, recorder)
    recorder.chunk_rows = INVARIANT_ROWS
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=acc_dtype, batch_chunk_size=INVARIANT_ROWS,
                                            batch_invariant=True)
    plan = _record(recorder, kind, options, dtype, reduction, (True, True, True))
    assert (plan.loop_rows, plan.num_chunks) == (2 * INVARIANT_ROWS, 2)
    assert "padded_input_chunk" in {b.name for b in plan.buffers}
    _check(plan, recorder, f"invariant {kind} {policy} {reduction} {dtype_name(dtype)} acc={acc_dtype}")


@pytest.mark.parametrize("needs_grad", [(True, False, False), (False, True, False), (False, False, True),
                                        (False, False, False)])
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize(("kind", "policy", "dtype", "acc_dtype"), [("cpu", "accurate", torch.bfloat16, torch.float32),
                                                                    ("cpu", "compact", torch.float16, None),
                                                                    ("cuda", "balanced", torch.float16, torch.float32),
                                                                    ("cuda", "compact", torch.bfloat16, torch.float32)])
def test_only_the_requested_gradients_are_planned_and_made(recorder, monkeypatch, kind, policy, dtype, acc_dtype,
                                                           reduction, needs_grad):
    if kind == "cuda":
        _emulate_cuda_gemms(monkeypatch, recorder)
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=acc_dtype, chunking_method=None,
                                            batch_chunk_size=ROWS)
    plan = _record(recorder, kind, options, dtype, reduction, needs_grad)
    _check(plan, recorder, f"{kind} {policy} {reduction} {dtype_name(dtype)} grads={needs_grad}")


# Class tiling: the same layouts with the vocabulary cut into blocks (an lce-only option).
TILED_GRID = [(k, p, r, d, a) for k, p, r, d, a in GRID[:len(GRID) - 5] if d != torch.float32 or a is None]


@pytest.mark.parametrize(("kind", "policy", "reduction", "dtype", "acc_dtype"), _tiered(TILED_GRID, _bf16_fp32),
                         ids=[f"{k}-{p}-{r}-{dtype_name(d)}-{dtype_name(a) if a else 'acc=input'}"
                              for k, p, r, d, a in TILED_GRID])
def test_class_tiled_buffers_are_the_allocations_made(recorder, monkeypatch, kind, policy, reduction, dtype,
                                                      acc_dtype):
    if kind == "cuda":
        _emulate_cuda_gemms(monkeypatch, recorder)
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=acc_dtype, chunking_method=None,
                                            batch_chunk_size=ROWS, class_chunk_size=CLASS_BLOCK)
    plan = _record(recorder, kind, options, dtype, reduction, (True, True, True))
    assert plan.num_class_chunks == 4
    _check(plan, recorder, f"tiled {kind} {policy} {reduction} {dtype_name(dtype)} acc={acc_dtype}")


# lce's features beyond torch's op: soft-capping (a workspace of SOFTCAP_COLUMNS columns beside the logits),
# z-loss and the returned log-sum-exp, with and without class tiling.
SOFTCAP_COLUMNS = 40  # C = 320 in eight workspaces; a class block of 96 in two of 40 and one of 16
FEATURES_GRID = [(k, p, r, d, a, tiled) for k, p, r, d, a in GRID[:len(GRID) - 5] for tiled in (False, True)
                 if d != torch.float32 or a is None]


@pytest.mark.parametrize(("kind", "policy", "reduction", "dtype", "acc_dtype", "tiled"),
                         _tiered(FEATURES_GRID, lambda *case: _bf16_fp32(*case) and not case[-1]),
                         ids=[f"{k}-{p}-{r}-{dtype_name(d)}-{dtype_name(a) if a else 'acc=input'}"
                              f"{'-tiled' if t else ''}" for k, p, r, d, a, t in FEATURES_GRID])
def test_soft_capped_buffers_are_the_allocations_made(recorder, monkeypatch, kind, policy, reduction, dtype,
                                                      acc_dtype, tiled):
    if kind == "cuda":
        _emulate_cuda_gemms(monkeypatch, recorder)
    monkeypatch.setattr(PLAN_MODULE, "WORKSPACE_ELEMENTS", ROWS * SOFTCAP_COLUMNS)
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=acc_dtype, chunking_method=None,
                                            batch_chunk_size=ROWS, class_chunk_size=CLASS_BLOCK if tiled else None)
    features = dict(softcap=5.0, z_loss=1e-3, return_lse=True)
    plan = _record(recorder, kind, options, dtype, reduction, (True, True, True), features)
    assert plan.workspace_columns == SOFTCAP_COLUMNS
    assert any(b.name == "softcap_workspace" for b in plan.buffers)
    _check(plan, recorder, f"softcap {'tiled ' if tiled else ''}{kind} {policy} {reduction} {dtype_name(dtype)} "
                           f"acc={acc_dtype}")


# A CPU whose bf16 GEMMs are emulated (lce.planning.cpu_gemms): balanced's and compact's bf16 GEMMs run in acc_dtype,
# and with acc_dtype = bf16 every GEMM runs on fp32 copies of blocks of its operands (lce.passes.gemm).
EMULATED_GRID = list(itertools.product(EXPLICIT_POLICIES, ["mean", "none"], [None, torch.float32], [None, CLASS_BLOCK]))


@pytest.mark.parametrize(("policy", "reduction", "acc_dtype", "class_block"),
                         _tiered(EMULATED_GRID, lambda policy, reduction, acc, block: block is None
                                 and reduction == "mean"),
                         ids=[f"{p}-{r}-{dtype_name(a) if a else 'acc=input'}{'-tiled' if t else ''}"
                              for p, r, a, t in EMULATED_GRID])
def test_buffers_of_emulated_bf16_gemms_are_the_allocations_made(recorder, policy, reduction, acc_dtype,
                                                                   class_block):
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=acc_dtype, chunking_method=None,
                                            batch_chunk_size=ROWS, class_chunk_size=class_block)
    with cpu_gemms("emulated"):
        plan = _record(recorder, "cpu", options, torch.bfloat16, reduction, (True, True, True))
    assert plan.cpu_gemms.emulated
    assert any(plan.gemm_in_fp32(name) for name in ("logits", "grad_input", "grad_weight")) == (acc_dtype is None)
    if acc_dtype is None:  # every GEMM in bf16, computed on fp32 blocks: their temporaries are in the plan
        assert any(b.name.endswith("_fp32") for b in plan.buffers)
    else:  # no bf16 GEMM is left to emulate
        assert all(plan.gemm_dtypes(name).operands == torch.float32 for name in ("logits", "grad_input", "grad_weight"))
    _check(plan, recorder, f"emulated bf16 {policy} {reduction} acc={acc_dtype} block={class_block}")


# The per-token log-probabilities (lce.linear_log_probs, issue 32): its own per-row values and workspaces, the
# loss's logits and gradient buffers; a gradient reaches both outputs (the most backward holds).
TOKEN_GRID = [(k, p, d, a, tiled, softcap, entropy) for k, p, r, d, a in GRID[:len(GRID) - 5] if r == "none"
              for tiled, softcap, entropy in ((False, None, True), (True, None, False), (False, 5.0, True),
                                              (True, 5.0, True))
              if d != torch.float32 or a is None]


# each also batch-invariant (fixed rows, the last chunk padded: what the default runs), but fp16 with fp16 sums,
# which cannot be (an error, tests/lce/test_batch_invariance.py)
TOKEN_GRID = [(*case, invariant) for case in TOKEN_GRID for invariant in (False, True)
              if not (invariant and case[2] == torch.float16 and case[3] is None)]


@pytest.mark.parametrize(("kind", "policy", "dtype", "acc_dtype", "tiled", "softcap", "entropy", "invariant"),
                         _tiered(TOKEN_GRID, _bf16_fp32),
                         ids=[f"{k}-{p}-{dtype_name(d)}-{dtype_name(a) if a else 'acc=input'}{'-tiled' if t else ''}"
                              f"{'-softcap' if s else ''}{'-entropy' if e else ''}{'-invariant' if i else ''}"
                              for k, p, d, a, t, s, e, i in TOKEN_GRID])
def test_log_probs_buffers_are_the_allocations_made(recorder, monkeypatch, kind, policy, dtype, acc_dtype, tiled,
                                                    softcap, entropy, invariant):
    if kind == "cuda":
        _emulate_cuda_gemms(monkeypatch, recorder)
    if invariant:  # fixed chunks of INVARIANT_ROWS, the last one padded (what the default runs)
        recorder.chunk_rows = INVARIANT_ROWS
    monkeypatch.setattr(PLAN_MODULE, "WORKSPACE_ELEMENTS", recorder.chunk_rows * SOFTCAP_COLUMNS)
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=acc_dtype, chunking_method=None,
                                            batch_chunk_size=recorder.chunk_rows, batch_invariant=invariant,
                                            class_chunk_size=CLASS_BLOCK if tiled else None)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(C, D, generator=g) / D**0.5).to(dtype).requires_grad_()
    b = torch.randn(C, generator=g).to(dtype).requires_grad_()
    target = torch.randint(0, C, (N,), generator=g)
    target[1::7] = -100
    temperature = torch.linspace(0.6, 1.2, N)
    with emulate_device_kind(kind):
        plan = lce.logprobs.log_probs_plan(x, w, linear_bias=b, return_entropy=entropy, softcap=softcap,
                                           options=options)
        with recorder:
            out = lce.linear_log_probs(x, w, target, linear_bias=b, temperature=temperature,
                                       return_entropy=entropy, softcap=softcap, options=options)
            recorder.stage = "backward"
            total = out[0].sum() + out[1].sum() if entropy else out.sum()
            total.backward()
    assert plan.workspace_columns == SOFTCAP_COLUMNS and plan.op == "log_probs"
    _check(plan, recorder, f"log_probs {kind} {policy} {dtype_name(dtype)} acc={acc_dtype} tiled={tiled} "
                           f"softcap={softcap} entropy={entropy}")
