"""The batch-invariance contract (``LinearCrossEntropyOptions.batch_invariant``, docs/using-lce.md): a row's outputs
are a bitwise function of that row, the head, the options, the dtype and the device kind.

Each case scores one seeded batch, then the same rows inside other batches -- its first rows (fewer than a chunk,
exactly a chunk, one more, several chunks), shuffled, with ignored padding rows appended, and beside rows of another
batch -- and requires every shared row's outputs to be the same bits: the log-probabilities, entropy and
log-sum-exp, the per-row loss, and the input gradient under reduction "sum" and "none". The weight gradient, a sum
over rows, must repeat bit for bit run to run. CPU layouts run natively; CUDA layouts under
:func:`lce.testing.emulate_device_kind` (the GEMMs in the layout's dtypes on this CPU). The accuracy of the same
calls against fp64 is tested elsewhere (tests/lce/test_parity_fp64.py, test_log_probs.py); here a row's bits are
compared across batches only, and the reference check below guards the comparison against an op that returns
zeros.
"""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch

import lce
from lce.integrations import trl as trl_integration
from lce.planning.options import EXPLICIT_POLICIES, dtype_name
from lce.testing import emulate_device_kind

N, D, C = 150, 32, 700
ROWS = 48  # a batch_chunk_size the plan rounds up to FIXED_ROWS
FIXED_ROWS = 64  # lce.planning.plan.INVARIANT_ROW_MULTIPLE: 150 rows are two chunks of 64 and a padded third
CLASS_BLOCK = 128
IGNORE = -100


def _head(dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=g).to(dtype)
    w = (torch.randn(C, D, generator=g) * 2 / D**0.5).to(dtype)
    b = (torch.randn(C, generator=g) * 0.5).to(dtype)
    target = torch.randint(0, C, (N,), generator=g)
    target[3::11] = IGNORE
    temperature = torch.rand(N, generator=g) + 0.5
    return x, w, b, target, temperature


def _batches(seed: int = 1) -> list[tuple[str, torch.Tensor | None, int]]:
    """(name, row order, extra rows): the rows of the reference batch each variant holds, in its order, and how many
    rows of another batch (or of ignored padding) come after them."""
    g = torch.Generator().manual_seed(seed)
    first = [(f"first {n}", torch.arange(n), 0) for n in (1, ROWS, FIXED_ROWS - 1, FIXED_ROWS, FIXED_ROWS + 1, 100)]
    return [*first, ("shuffled", torch.randperm(N, generator=g), 0), ("padded with 37 ignored rows", None, 37),
            ("beside 61 other rows", None, -61)]


def _variant(x, target, temperature, order, extra: int, dtype, seed: int = 2):
    """The variant's input, target and temperature; the reference rows' positions in it."""
    if order is not None:
        return x[order], target[order], temperature[order], order
    g = torch.Generator().manual_seed(seed)
    other = torch.randn(abs(extra), D, generator=g).to(dtype)
    other_target = torch.full((abs(extra),), IGNORE) if extra > 0 else torch.randint(0, C, (abs(extra),), generator=g)
    other_temperature = torch.rand(abs(extra), generator=g) + 0.5
    if extra > 0:  # padding after the rows
        return (torch.cat([x, other]), torch.cat([target, other_target]), torch.cat([temperature, other_temperature]),
                torch.arange(N))
    # other rows first, then the reference rows
    return (torch.cat([other, x]), torch.cat([other_target, target]), torch.cat([other_temperature, temperature]),
            torch.arange(N) + abs(extra))


def _log_probs_op(softcap=None, tensor_temperature=False):
    def run(x, w, b, target, temperature, options):
        x = x.detach().requires_grad_()
        t = temperature if tensor_temperature else 0.7
        logp, entropy = lce.linear_log_probs(x, w, target, linear_bias=b, temperature=t, return_entropy=True,
                                             softcap=softcap, options=options)
        # per-row upstream gradients that travel with their rows: a function of the row's own target
        (logp * (target.remainder(7) - 3) + entropy * 0.25).sum().backward()
        return {"log_probs": logp.detach(), "entropy": entropy.detach(), "grad_input": x.grad}, None
    return run


def _loss_op(reduction: str, softcap=None):
    def run(x, w, b, target, temperature, options):
        x = x.detach().requires_grad_()
        loss, lse = lce.linear_cross_entropy(x, w, target, linear_bias=b, reduction=reduction, options=options,
                                             softcap=softcap, return_lse=True)
        (loss if reduction == "sum" else (loss * (target.remainder(5) + 1)).sum()).backward()
        out = {"lse": lse.detach(), "grad_input": x.grad}
        if reduction == "none":
            out["loss"] = loss.detach()
        return out, None
    return run


OPS = {
    "log_probs": _log_probs_op(),
    "log_probs T per row, softcap": _log_probs_op(softcap=4.0, tensor_temperature=True),
    "loss none": _loss_op("none"),
    "loss sum, softcap": _loss_op("sum", softcap=6.0),
}


def _gemm_rows_ignore_their_position(dtype: torch.dtype, device: str = "cpu") -> bool:
    """The premise the contract rests on where it runs: this device's GEMM of one shape gives a row the same bits at
    any position among the rows (lce fixes the shape; the library's kernels must do the rest)."""
    g = torch.Generator().manual_seed(7)
    left, right = torch.randn(FIXED_ROWS, 96, generator=g), torch.randn(96, 200, generator=g)
    order = torch.randperm(FIXED_ROWS, generator=g).to(device)
    for gemm_dtype in {dtype, torch.float32}:  # the input dtype's GEMMs and the fp32 ones of the wider layouts
        a, b = left.to(device, gemm_dtype), right.to(device, gemm_dtype)
        if not torch.equal(a[order] @ b, (a @ b)[order]):
            return False
    return True


def _assert_invariant(op_name: str, kind: str, dtype: torch.dtype, options: lce.LinearCrossEntropyOptions,
                      device: str = "cpu"):
    """``kind``'s layouts on ``device``'s tensors (on the CPU, CUDA's layouts emulated)."""
    if not _gemm_rows_ignore_their_position(dtype, device):
        pytest.skip(f"premise failed: this {device}'s {dtype} GEMMs give a row other bits at another position in a "
                    "product of the same shape, so no fixed chunking makes a row's outputs batch-invariant here")
    x, w, b, target, temperature = (t.to(device) for t in _head(dtype))
    run = OPS[op_name]
    with emulate_device_kind(kind) if device == "cpu" else contextlib.nullcontext():
        reference, _ = run(x, w, b, target, temperature, options)
        fp64 = lce.linear_log_probs(x.double(), w.double(), target, linear_bias=b.double(), temperature=0.7)
        assert reference["grad_input"].abs().sum() > 0 and torch.isfinite(reference["grad_input"]).all()
        if op_name == "log_probs":  # the compared numbers are the op's, not zeros: near fp64's
            assert torch.allclose(reference["log_probs"].double(), fp64, atol=0.1, rtol=0.05)
        for name, order, extra in _batches():
            xv, tv, temp_v, where = (t.to(device) for t in _variant(x.cpu(), target.cpu(), temperature.cpu(), order,
                                                                    extra, dtype))
            outputs, _ = run(xv, w, b, tv, temp_v, options)
            rows = (order if order is not None else torch.arange(N)).to(device)
            for output, values in outputs.items():
                expected = reference[output][rows]
                got = values[where if order is None else torch.arange(len(rows), device=device)]
                differ = (got != expected) & ~(got.isnan() & expected.isnan())
                assert not differ.any(), (
                    f"{op_name}, {kind} {dtype_name(dtype)}, {options}: {output} of "
                    f"{int(differ.any(-1).sum() if differ.dim() > 1 else differ.sum())} row(s) change {name} "
                    f"(largest change {(got.double() - expected.double()).abs().max():.3g})")


def _invariant_options(policy: str, chunking: str, tiled: bool, dtype: torch.dtype) -> lce.LinearCrossEntropyOptions:
    fields = dict(acc_policy=policy, batch_invariant=True,
                  class_chunk_size=CLASS_BLOCK if tiled else None)
    if chunking == "fixed rows":
        fields["batch_chunk_size"] = ROWS
    if dtype == torch.float16 and policy != "auto":
        fields["acc_dtype"] = torch.float32  # fp16 with fp16 sums cannot be invariant (an error, tested below)
    return lce.LinearCrossEntropyOptions(**fields)


CASES = list(itertools.product(OPS, ["cpu", "cuda"], [torch.bfloat16, torch.float16, torch.float32],
                               ["auto", *EXPLICIT_POLICIES], ["auto rows", "fixed rows"], [False, True]))


def _fast(op, kind, dtype, policy, chunking, tiled) -> bool:
    """``make test-fast``: bf16 on both layouts, each policy, op and chunking untiled, and the tiled defaults."""
    return dtype == torch.bfloat16 and (not tiled or policy == "auto")


@pytest.mark.parametrize(("op", "kind", "dtype", "policy", "chunking", "tiled"),
                         [pytest.param(*case, marks=() if _fast(*case) else pytest.mark.slow) for case in CASES],
                         ids=[f"{o}-{k}-{dtype_name(d)}-{p}-{c}{'-tiled' if t else ''}" for o, k, d, p, c, t in CASES])
def test_a_rows_outputs_do_not_depend_on_its_batch(op, kind, dtype, policy, chunking, tiled):
    _assert_invariant(op, kind, dtype, _invariant_options(policy, chunking, tiled, dtype))


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_log_probs_default_is_batch_invariant_and_the_plan_says_so(kind, dtype):
    x, w, *_ = _head(dtype)
    with emulate_device_kind(kind):
        plan = lce.logprobs.log_probs_plan(x, w)
    assert plan.batch_invariant and plan.loop_rows % plan.batch_chunk_size == 0
    assert "invariant: a row's outputs do not depend on the rest of the batch" in str(plan)
    _assert_invariant("log_probs", kind, dtype, lce.LinearCrossEntropyOptions())


@pytest.mark.parametrize(("kind", "dtype"), [("cuda", torch.bfloat16), ("cpu", torch.float32),
                                             ("cpu", torch.bfloat16), ("cuda", torch.float16)])
def test_the_loss_default_follows_the_auto_table(kind, dtype):
    """batch_invariant=None: the loss is invariant where the auto table says the contract is cheap (and then
    keeps it), else its plan says why not."""
    from lce.planning.policies import auto_pick

    x, w, *_ = _head(dtype)
    with emulate_device_kind(kind):
        plan = lce.plan(x, w)
    assert plan.batch_invariant == (auto_pick(kind, dtype).batch_invariant and dtype != torch.float16)
    if plan.batch_invariant:
        assert plan.batch_chunk_size == auto_pick(kind, dtype).invariant_rows
        _assert_invariant("loss none", kind, dtype, lce.LinearCrossEntropyOptions())
    else:
        assert any(note.startswith("not batch-invariant: ") for note in plan.notes)
        assert "not invariant" in str(plan)


def test_options_that_size_chunks_as_torch_does_keep_torchs_chunks_by_default():
    x, w, *_ = _head(torch.float32)
    for options, rows in ((lce.LinearCrossEntropyOptions(batch_chunk_size=ROWS), ROWS),
                          (lce.LinearCrossEntropyOptions(chunking_method=None), N),
                          (lce.LinearCrossEntropyOptions(chunking_method="aspect_ratio:2"), None)):
        plan = lce.plan(x, w, options=options)
        assert not plan.batch_invariant and plan.loop_rows == N
        assert rows is None or plan.batch_chunk_size == rows


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
@pytest.mark.parametrize("policy", EXPLICIT_POLICIES)
def test_the_weight_gradient_repeats_bit_for_bit(kind, policy):
    x, w, b, target, _ = _head(torch.bfloat16)
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, batch_chunk_size=ROWS, batch_invariant=True)
    grads = []
    with emulate_device_kind(kind):
        for _ in range(3):
            weight, bias = w.detach().requires_grad_(), b.detach().requires_grad_()
            lce.linear_cross_entropy(x, weight, target, linear_bias=bias, options=options).backward()
            grads.append((weight.grad, bias.grad))
    assert grads[0][0].abs().sum() > 0
    for weight_grad, bias_grad in grads[1:]:
        assert torch.equal(weight_grad, grads[0][0]) and torch.equal(bias_grad, grads[0][1])


def test_padding_costs_rows_not_a_different_answer():
    """A call smaller than a chunk runs one padded chunk: the plan counts its padded rows, and says that the
    chunk's rows were rounded up to a multiple of 64."""
    x, w, *_ = _head(torch.bfloat16)
    plan = lce.plan(x[:5], w, options=lce.LinearCrossEntropyOptions(batch_chunk_size=ROWS, batch_invariant=True))
    assert (plan.num_rows, plan.loop_rows, plan.num_chunks, plan.batch_chunk_size) == (5, FIXED_ROWS, 1, FIXED_ROWS)
    assert f"{FIXED_ROWS - 5} ignored rows pad the last chunk" in str(plan)
    assert f"batch_chunk_size={ROWS} rounded up to {FIXED_ROWS} rows" in str(plan)


def test_the_trl_route_keeps_the_contract():
    """lce.integrations.trl.fused_head (what the routed TRL head runs): each row's outputs the same in any batch."""
    x, w, b, target, _ = _head(torch.bfloat16)
    full = trl_integration.fused_head(x, w, b, target, temperature=0.7)
    for n in (1, FIXED_ROWS + 1, 100):
        part = trl_integration.fused_head(x[:n], w, b, target[:n], temperature=0.7)
        for whole, piece in zip(full, part, strict=True):
            if whole is not None:
                assert torch.equal(whole[:n], piece), n


def test_invariance_that_cannot_hold_is_an_error_naming_the_option():
    x, w, _, target, _ = _head(torch.float16)
    with pytest.raises(ValueError, match="batch_invariant=True.*chunking_method='aspect_ratio'"):
        lce.plan(x, w, options=lce.LinearCrossEntropyOptions(chunking_method="aspect_ratio", batch_invariant=True))
    with pytest.raises(ValueError, match="acc_dtype=torch.float32"):
        lce.linear_cross_entropy(x, w, target, options=lce.LinearCrossEntropyOptions(
            acc_policy="compact", acc_dtype=torch.float16, batch_invariant=True))
    with pytest.raises(ValueError, match="batch_invariant must be True, False or None, got 'yes'"):
        lce.LinearCrossEntropyOptions(batch_invariant="yes")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_name)
@pytest.mark.parametrize("policy", ["auto", "compact"])
def test_on_a_gpu_a_rows_outputs_do_not_depend_on_its_batch(op, dtype, policy):
    """The contract on CUDA tensors (python -m analysis gpu-check runs it): cuBLAS and lce's kernels at one shape."""
    _assert_invariant(op, "cuda", dtype, _invariant_options(policy, "fixed rows", False, dtype), device="cuda")
