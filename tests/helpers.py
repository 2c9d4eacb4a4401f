"""Shared helpers for the ``lce`` public-API tests.

Every test module imports from here (``tests/conftest.py`` puts this folder on
``sys.path``), so problem construction, the reference formula, the error
metric and the covering-design generator live in exactly one place.

The reference is always the plain composition
``F.cross_entropy(F.linear(input, W, b), target, ...)`` of torch's public
functions, evaluated on the very same leaf values as the op under test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import lce
from analysis.core.metrics import rel_fro

F64 = torch.float64

TORCH_HAS_OP = hasattr(F, "linear_cross_entropy") and hasattr(torch.nn, "LinearCrossEntropyOptions")
"""Whether this torch has the op lce mirrors (2.13+): comparisons with it skip where it is absent (lce runs on 2.11)."""
needs_torch_op = pytest.mark.skipif(not TORCH_HAS_OP, reason=f"torch {torch.__version__} has no "
                                    "torch.nn.functional.linear_cross_entropy (added in 2.13)")

# ------------------------------------------------------------------ problems

# How the ``ignore_index`` argument is exercised.
#   "default":      ignore_index not passed (-> -100), some targets are -100
#   "absent":       ignore_index not passed, no target is ignored
#   "in_range":     ignore_index=3, some targets are 3
#   "out_of_range": ignore_index=1000, some targets are 1000
#   "negative":     ignore_index=-1, some targets are -1
IGNORE_MODES = ("default", "absent", "in_range", "out_of_range", "negative")
_IGNORE_VALUE = {"default": -100, "absent": -100, "in_range": 3, "out_of_range": 1000, "negative": -1}


@dataclasses.dataclass(frozen=True)
class Case:
    """One call configuration (everything except the options)."""

    N: int = 29
    D: int = 16
    V: int = 40
    reduction: str = "mean"
    bias: bool = False
    class_weight: bool = False
    ignore: str = "default"
    one_d: bool = False
    label_smoothing: float = 0.0
    ignore_every: int = 5  # row i is ignored when i % ignore_every == 1

    @property
    def ignore_value(self) -> int:
        return _IGNORE_VALUE[self.ignore]

    @property
    def ignore_index_arg(self) -> int | None:
        """What is passed as ``ignore_index`` (None = the default)."""
        return None if self.ignore in ("default", "absent") else self.ignore_value

    def short(self) -> str:
        parts = [f"{self.N}x{self.D}x{self.V}", self.reduction, f"ign={self.ignore}"]
        if self.bias:
            parts.append("bias")
        if self.class_weight:
            parts.append("cw")
        if self.one_d:
            parts.append("1d")
        if self.label_smoothing:
            parts.append(f"ls={self.label_smoothing}")
        return "-".join(parts)


@dataclasses.dataclass
class CallArgs:
    """The arguments of one linear_cross_entropy call: leaf tensors, keyword arguments, and the
    incoming gradient for reduction="none"."""

    input: torch.Tensor
    linear_weight: torch.Tensor
    target: torch.Tensor
    linear_bias: torch.Tensor | None
    weight: torch.Tensor | None
    reduction: str
    ignore_index: int | None
    label_smoothing: float
    grad_output: torch.Tensor | None  # for reduction="none"

    def kwargs(self) -> dict[str, Any]:
        return dict(
            linear_bias=self.linear_bias,
            weight=self.weight,
            reduction=self.reduction,
            ignore_index=self.ignore_index,
            label_smoothing=self.label_smoothing,
        )

    def replace(self, **changes: Any) -> CallArgs:
        return dataclasses.replace(self, **changes)


def make_targets(
    N: int, V: int, *, ignore_value: int, ignore_mask: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """Class indices in [0, V) avoiding ``ignore_value``; masked rows get ``ignore_value``."""
    allowed = torch.tensor([c for c in range(V) if c != ignore_value], dtype=torch.int64)
    if allowed.numel() == 0:  # V == 1 and ignore_value == 0
        allowed = torch.zeros(1, dtype=torch.int64)
    picks = torch.randint(0, allowed.numel(), (N,), generator=generator)
    target = allowed[picks]
    return torch.where(ignore_mask, torch.full_like(target, ignore_value), target)


def make_problem(case: Case, *, seed: int = 0, dtype: torch.dtype = F64, logit_scale: float = 2.0) -> CallArgs:
    """Deterministic random :class:`CallArgs` for ``case``, built in fp64 then cast to ``dtype``.

    Row 0 is never ignored (so the 1-D variant always has a live target).
    """
    g = torch.Generator().manual_seed(seed)
    N, D, V = case.N, case.D, case.V
    x = torch.randn(N, D, generator=g, dtype=F64)
    W = torch.randn(V, D, generator=g, dtype=F64) * (logit_scale / math.sqrt(D))
    b = torch.randn(V, generator=g, dtype=F64) * 0.5 if case.bias else None
    cw = (torch.rand(V, generator=g, dtype=F64) * 1.5 + 0.25) if case.class_weight else None
    rows = torch.arange(N)
    if case.ignore == "absent":
        mask = torch.zeros(N, dtype=torch.bool)
    else:
        mask = (rows % case.ignore_every) == 1
    target = make_targets(N, V, ignore_value=case.ignore_value, ignore_mask=mask, generator=g)
    if case.one_d:
        x, target = x[0], target[0]
    grad_out = None
    if case.reduction == "none":
        grad_out = torch.randn(target.shape, generator=g, dtype=F64)

    def cast(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(dtype)

    return CallArgs(
        input=cast(x),
        linear_weight=cast(W),
        target=target,
        linear_bias=cast(b),
        weight=cast(cw),
        reduction=case.reduction,
        ignore_index=case.ignore_index_arg,
        label_smoothing=case.label_smoothing,
        grad_output=cast(grad_out),
    )


# ------------------------------------------------------------------ running

GRAD_NAMES = ("input", "linear_weight", "linear_bias")


def reference_loss(input, linear_weight, target, *, linear_bias=None, weight=None, reduction="mean",
                   ignore_index=None, label_smoothing=0.0, options=None):
    """The reference formula, built from torch's public functions (``options`` is ignored).

    A K-dimensional ``linear_weight`` ``(C, d1..dK, D)`` gives logits ``(N, C, d1..dK)``.
    """
    class_shape = tuple(linear_weight.shape[:-1])
    flat_bias = None if linear_bias is None else linear_bias.reshape(-1)
    logits = F.linear(input, linear_weight.reshape(-1, linear_weight.shape[-1]), flat_bias)
    logits = logits.reshape(*input.shape[:-1], *class_shape)
    return F.cross_entropy(
        logits,
        target,
        weight=weight,
        reduction=reduction,
        ignore_index=-100 if ignore_index is None else ignore_index,
        label_smoothing=label_smoothing,
    )


def run(
    fn: Callable[..., torch.Tensor],
    problem: CallArgs,
    *,
    options: Any = None,
    requires_grad: Iterable[str] = GRAD_NAMES,
    backward: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
    """Call ``fn`` on fresh leaf copies of ``problem``; return (loss, grads by name).

    For ``reduction="none"`` the backward uses ``problem.grad_output``.
    Grads of leaves that were not asked for are reported as their ``.grad``
    (which must stay None).
    """
    wanted = set(requires_grad)
    leaves: dict[str, torch.Tensor | None] = {}
    for name in GRAD_NAMES:
        t = getattr(problem, name)
        if t is not None:
            t = t.detach().clone().requires_grad_(name in wanted)
        leaves[name] = t
    kwargs = problem.kwargs()
    kwargs["linear_bias"] = leaves["linear_bias"]
    if options is not None:
        kwargs["options"] = options
    loss = fn(leaves["input"], leaves["linear_weight"], problem.target, **kwargs)
    if backward and loss.requires_grad:
        if problem.reduction == "none":
            loss.backward(problem.grad_output)
        else:
            loss.backward()
    grads = {name: (None if t is None else t.grad) for name, t in leaves.items()}
    return loss.detach(), grads


def lce_run(problem: CallArgs, options: Any, **kw):
    return run(lce.linear_cross_entropy, problem, options=options, **kw)


def ref_run(problem: CallArgs, **kw):
    return run(reference_loss, problem, **kw)


# ------------------------------------------------------------------ metrics


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """:func:`analysis.core.metrics.rel_fro` over the positions where ``ref`` is finite (absolute if ``ref`` is 0
    there).

    Positions where ``ref`` is NaN/inf are compared with :func:`same_nonfinite`; a NaN in ``got``
    where ``ref`` is finite makes the error infinite.
    """
    assert got.shape == ref.shape, f"shape {tuple(got.shape)} != reference {tuple(ref.shape)}"
    finite = torch.isfinite(ref.detach())
    got = torch.where(finite, got.detach().to(F64), 0.0)
    ref = torch.where(finite, ref.detach().to(F64), 0.0)
    error = rel_fro(got, ref) if bool(ref.any()) else torch.linalg.vector_norm(got).item()
    return math.inf if math.isnan(error) else error


def same_nonfinite(got: torch.Tensor, ref: torch.Tensor) -> bool:
    """Same NaN positions and the same +inf/-inf positions."""
    got, ref = got.detach().to(F64), ref.detach().to(F64)
    return bool(
        torch.equal(torch.isnan(got), torch.isnan(ref))
        and torch.equal(got == math.inf, ref == math.inf)
        and torch.equal(got == -math.inf, ref == -math.inf)
    )


def assert_close_rel(got, ref, tol: float, what: str) -> float:
    assert got is not None, f"{what}: got None, expected a tensor"
    assert same_nonfinite(got, ref), f"{what}: NaN/inf pattern differs: got {got}, expected {ref}"
    err = rel_err(got, ref)
    assert err <= tol, f"{what}: rel. error {err:.3e} > {tol:.1e}"
    return err


def assert_parity(got: tuple, ref: tuple, tol: float = 1e-12, label: str = "") -> None:
    """Loss and every gradient of ``got`` match ``ref`` (both from :func:`run`)."""
    (gl, gg), (rl, rg) = got, ref
    assert gl.shape == rl.shape, f"{label} loss shape {tuple(gl.shape)} != {tuple(rl.shape)}"
    assert gl.dtype == rl.dtype, f"{label} loss dtype {gl.dtype} != {rl.dtype}"
    assert_close_rel(gl, rl, tol, f"{label} loss")
    for name in GRAD_NAMES:
        if rg[name] is None:
            assert gg[name] is None, f"{label} grad of {name}: expected None, got a tensor"
        else:
            assert_close_rel(gg[name], rg[name], tol, f"{label} grad of {name}")


# ------------------------------------------------------------------ precision


def round_trip(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` rounded to ``dtype`` and back to fp64 (the representation floor)."""
    return t.detach().to(dtype).to(F64)


def neighbours(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The representable values just below and just above the scalar ``y`` in its dtype."""
    inf = torch.tensor(math.inf, dtype=y.dtype)
    return torch.nextafter(y, -inf), torch.nextafter(y, inf)


def within_one_ulp(got: torch.Tensor, exact: torch.Tensor) -> bool:
    """``got`` (scalar, low precision) is the rounding of ``exact`` (fp64) or a neighbour of it."""
    r = exact.to(got.dtype)
    lo, hi = neighbours(r)
    return bool(lo <= got <= hi)


# ------------------------------------------------------------------ designs


def pairwise_design(factors: Mapping[str, Sequence[Any]], *, seed: int = 0, candidates: int = 40) -> list[dict]:
    """A deterministic covering array of strength 2 (every pair of levels of every
    two factors appears in at least one row), built greedily.
    """
    names = list(factors)
    levels = {n: list(factors[n]) for n in names}
    uncovered = {
        (a, i, b, j)
        for a, b in itertools.combinations(names, 2)
        for i in range(len(levels[a]))
        for j in range(len(levels[b]))
    }
    rng = random.Random(seed)
    rows: list[dict[str, int]] = []

    def gain(row: dict[str, int]) -> int:
        return sum((a, row[a], b, row[b]) in uncovered for a, b in itertools.combinations(names, 2))

    while uncovered:
        a, i, b, j = min(uncovered, key=lambda p: (names.index(p[0]), p[1], names.index(p[2]), p[3]))
        best, best_gain = None, -1
        for _ in range(candidates):
            row = {n: rng.randrange(len(levels[n])) for n in names}
            row[a], row[b] = i, j
            g_ = gain(row)
            if g_ > best_gain:
                best, best_gain = row, g_
        assert best is not None
        rows.append(best)
        for p, q in itertools.combinations(names, 2):
            uncovered.discard((p, best[p], q, best[q]))
    return [{n: levels[n][r[n]] for n in names} for r in rows]


# ------------------------------------------------------------------ options

# Chunking variants of the parity design; "bcsN"/"bcs2N" are relative to the batch.
CHUNKINGS = ("auto", "aspect_ratio", "aspect_ratio:2", "bcs1", "bcs7", "bcsN", "bcs2N", "single")


CALL_FACTORS: dict[str, Sequence[Any]] = {
    "chunking": CHUNKINGS,
    "policy": ("auto", "accurate", "balanced", "compact"),
    "reduction": ("mean", "sum", "none"),
    "bias": (False, True),
    "class_weight": (False, True),
    "ignore": IGNORE_MODES,
    "one_d": (False, True),
    "label_smoothing": (0.0, 0.1),
}
"""The factors of the fp64 parity designs (:func:`pairwise_design`), one call configuration per row."""


def case_of(row: Mapping[str, Any]) -> Case:
    """The :class:`Case` of one row of a design over :data:`CALL_FACTORS`."""
    return Case(reduction=row["reduction"], bias=row["bias"], class_weight=row["class_weight"], ignore=row["ignore"],
                one_d=row["one_d"], label_smoothing=row["label_smoothing"])


def make_options(policy: str, chunking: str, N: int, cls: type | None = None, **extra: Any):
    """Options for a chunking variant name (``cls`` defaults to lce's options class)."""
    cls = cls or lce.LinearCrossEntropyOptions
    if chunking in ("auto", "aspect_ratio", "aspect_ratio:2"):
        kw = dict(chunking_method=chunking)
    elif chunking == "single":
        kw = dict(chunking_method=None)
    else:
        size = {"bcs1": 1, "bcs7": 7, "bcsN": N, "bcs2N": 2 * N}[chunking]
        kw = dict(chunking_method=None, batch_chunk_size=size)
    return cls(acc_policy=policy, **kw, **extra)


def torch_options(opts) -> torch.nn.LinearCrossEntropyOptions:
    """torch's options with the same fields as ``opts``."""
    return torch.nn.LinearCrossEntropyOptions(
        **{f.name: getattr(opts, f.name) for f in dataclasses.fields(torch.nn.LinearCrossEntropyOptions)}
    )


@contextlib.contextmanager
def own_cpu_gemms():
    """Lift the suite's pin of lce.planning.cpu_gemms (tests/conftest.py: every test plans as on a CPU with native
    bf16/fp16
    GEMMs): inside, lce decides with this CPU's own verdict, so on a CPU that emulates bf16 GEMMs its plans run them
    on fp32 copies instead of the emulated kernel. For tests whose checks hold under any verdict."""
    from lce.planning.cpu_gemms import CPU_GEMMS_OVERRIDE

    token = CPU_GEMMS_OVERRIDE.set(None)
    try:
        yield
    finally:
        CPU_GEMMS_OVERRIDE.reset(token)


# ------------------------------------------------------------------ autocast (lce.autocasting)

def autocast_problem(leaf_dtype: torch.dtype, seed: int = 0, device: str = "cpu") -> dict:
    """Leaves of ``leaf_dtype`` (fp32: the parameters of mixed-precision training) with targets, class weights and a
    few ignored rows."""
    n, d, c = 24, 16, 40
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(c, d, generator=g) * 3 / d**0.5  # logits spread over a few nats: the rounding shows
    b = torch.randn(c, generator=g)
    target = torch.randint(0, c, (n,), generator=g)
    target[3::7] = -100
    class_weight = torch.rand(c, generator=g) + 0.5
    grad_rows = torch.randn(n, generator=g)
    floats = dict(x=x.to(leaf_dtype), w=w.to(leaf_dtype), b=b.to(leaf_dtype), class_weight=class_weight,
                  grad_rows=grad_rows)
    return {key: t.to(device) for key, t in dict(floats, target=target).items()}


def autocast_run(op, problem: dict, *, autocast: torch.dtype | None, cast: torch.dtype | None, backward_inside: bool,
                 **keywords):
    """``op`` on fresh leaves: under ``torch.autocast`` of the leaves' device type in ``autocast`` (None: no
    autocast), on the leaves cast to ``cast`` first (None: as they are); backward inside the autocast block or after
    it. Returns the outputs and the leaves' gradients."""
    leaves = [problem[k].detach().clone().requires_grad_() for k in ("x", "w", "b")]
    taken = [t if cast is None else t.to(cast) for t in leaves]
    context = (torch.autocast(leaves[0].device.type, dtype=autocast) if autocast is not None
               else contextlib.nullcontext())
    with context:
        out = op(*taken, **keywords)
        outputs = out if isinstance(out, tuple) else (out,)
        differentiable = [o for o in outputs if o.requires_grad]
        seeds = [problem["grad_rows"][: o.numel()].reshape(o.shape).to(o.dtype) for o in differentiable]
        if backward_inside:
            torch.autograd.backward(differentiable, seeds)
    if not backward_inside:
        torch.autograd.backward(differentiable, seeds)
    return [o.detach() for o in outputs], [t.grad for t in leaves]


def assert_bitwise(under, outside, label: str) -> None:
    """Two :func:`autocast_run` results hold the same outputs and gradients, dtype and bits."""
    (outputs, grads), (outputs_off, grads_off) = under, outside
    for i, (a, b) in enumerate(zip(outputs + grads, outputs_off + grads_off, strict=True)):
        assert (a is None) == (b is None), f"{label}: output {i}"
        if a is not None:
            assert a.dtype == b.dtype, f"{label}: output {i} is {a.dtype} under autocast, {b.dtype} outside"
            assert torch.equal(a, b), f"{label}: output {i} differs by {(a.double() - b.double()).abs().max():.3e}"


def padded_batch(vocab: int, seed: int = 0, rows: int = 3, length: int = 12):
    """Token ids below ``vocab``, an attention mask with one right-padded row, and labels -100 at the padding and at
    a prompt (the first row's first five tokens): the integration tests' language-model batch."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, length), generator=g)
    mask = torch.ones(rows, length, dtype=torch.int64)
    mask[-1, -4:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[0, :5] = -100  # a prompt: no loss on its tokens
    return ids, mask, labels


def assert_import_leaves_out(module: str, absent: Sequence[str]) -> None:
    """Importing lce and ``module`` in a fresh interpreter loads none of ``absent`` (the packages an integration
    imports only when it is used)."""
    import subprocess
    import sys

    code = (f"import sys, lce, {module}\n"
            f"loaded = [name for name in {list(absent)!r} if name in sys.modules]\n"
            "assert not loaded, (loaded, sorted(sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def loss_and_grads(options, input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor, **kwargs,
                   ) -> list[torch.Tensor]:
    """The loss (backward of ones where it is per row) and the gradients of ``input`` and ``linear_weight`` for one
    call, in fp32, on fresh leaf copies of the two tensors: a copy made by ``clone()`` of a tensor that already
    requires grad is not a leaf, and its ``.grad`` stays None (the bug of two CUDA tests, issue 49)."""
    leaves = [input.detach().clone().requires_grad_(), linear_weight.detach().clone().requires_grad_()]
    loss = lce.linear_cross_entropy(*leaves, target, options=options, **kwargs)
    loss.backward(torch.ones_like(loss) if loss.dim() else None)
    return [loss.detach().float(), *(leaf.grad.float() for leaf in leaves)]
