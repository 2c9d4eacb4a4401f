"""Autograd contract of the chunked path: gradcheck, retain_graph, grad mode, torch.compile."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import lce
from helpers import Case, assert_close_rel, lce_run, make_problem, ref_run
from lce.planning.options import EXPLICIT_POLICIES
from lce.testing import emulate_device_kind

POLICIES = EXPLICIT_POLICIES
REDUCTIONS = ("mean", "sum", "none")


def _gradcheck_inputs(reduction: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    n, d, c = 7, 3, 5
    x = torch.randn(n, d, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(c, d, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(c, dtype=torch.float64, generator=g, requires_grad=True)
    target = torch.randint(0, c, (n,), generator=g)
    target[2] = -100
    class_weight = torch.rand(c, dtype=torch.float64, generator=g) + 0.5
    return x, w, b, target, class_weight


@pytest.mark.parametrize("device_kind", ["cpu", "cuda"])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gradcheck_fp64(policy, reduction, device_kind):
    x, w, b, target, class_weight = _gradcheck_inputs(reduction)
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, batch_chunk_size=3, allow_retain_graph=True)

    def loss(x, w, b):
        return lce.linear_cross_entropy(x, w, target, linear_bias=b, weight=class_weight, reduction=reduction,
                                        label_smoothing=0.1, options=options)

    with emulate_device_kind(device_kind):
        assert torch.autograd.gradcheck(loss, (x, w, b), eps=1e-6, atol=1e-8, rtol=1e-6)


def _scalar_case():
    return make_problem(Case(N=24, D=8, V=30, reduction="mean", bias=True))


def test_second_backward_raises_without_allow_retain_graph():
    p = _scalar_case()
    x = p.input.clone().requires_grad_()
    loss = lce.linear_cross_entropy(x, p.linear_weight, p.target, options=lce.LinearCrossEntropyOptions())
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="allow_retain_graph"):
        loss.backward()


def test_second_backward_accumulates_with_allow_retain_graph():
    p = _scalar_case()
    x = p.input.clone().requires_grad_()
    options = lce.LinearCrossEntropyOptions(allow_retain_graph=True, batch_chunk_size=5)
    loss = lce.linear_cross_entropy(x, p.linear_weight, p.target, linear_bias=p.linear_bias, options=options)
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    loss.backward()
    torch.testing.assert_close(x.grad, 2 * first, rtol=0, atol=0)
    _, ref = ref_run(p, requires_grad=("input",))
    torch.testing.assert_close(first, ref["input"], rtol=1e-12, atol=1e-15)


def test_none_reduction_backward_twice_without_allow_retain_graph():
    p = make_problem(Case(N=24, D=8, V=30, reduction="none"))
    x = p.input.clone().requires_grad_()
    losses = lce.linear_cross_entropy(x, p.linear_weight, p.target, reduction="none",
                                      options=lce.LinearCrossEntropyOptions(batch_chunk_size=7))
    losses.backward(p.grad_output, retain_graph=True)
    first = x.grad.clone()
    losses.backward(p.grad_output)
    torch.testing.assert_close(x.grad, 2 * first, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_grad_output_scales_the_precomputed_gradients(reduction):
    p = make_problem(Case(N=24, D=8, V=30, reduction=reduction, bias=True))
    _, got = lce_run(p, lce.LinearCrossEntropyOptions(batch_chunk_size=5))
    x = p.input.clone().requires_grad_()
    loss = lce.linear_cross_entropy(x, p.linear_weight, p.target, linear_bias=p.linear_bias,
                                    reduction=reduction, options=lce.LinearCrossEntropyOptions(batch_chunk_size=5))
    (loss * -2.5).backward()
    torch.testing.assert_close(x.grad, -2.5 * got["input"], rtol=1e-14, atol=0)


class _OutputShapes(TorchDispatchMode):
    """Records the shape of every new tensor an op returns while active (views of existing ones aside)."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        for t, returned in zip(outputs, func._schema.returns, strict=False):
            if isinstance(t, torch.Tensor) and returned.alias_info is None:
                self.shapes.append(tuple(t.shape))
        return out


@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference_mode"])
def test_gradient_buffers_exist_only_when_gradients_are_due(mode):
    n, d, c = 96, 16, 200
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g, requires_grad=True)
    w = torch.randn(c, d, generator=g, requires_grad=True)
    target = torch.randint(0, c, (n,), generator=g)
    options = lce.LinearCrossEntropyOptions(batch_chunk_size=32)
    context = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[mode]
    recorder = _OutputShapes()
    with context(), recorder:
        lce.linear_cross_entropy(x, w, target, options=options)
        planned = {b.name for b in lce.plan(x, w, options=options).buffers}
    gradient_shaped = {(n, d), (c, d)} & set(recorder.shapes)
    if mode == "grad":
        assert gradient_shaped == {(n, d), (c, d)}
        assert {"grad_input", "grad_weight"} <= planned
    else:
        assert gradient_shaped == set(), f"gradient-sized allocations under {mode}: {gradient_shaped}"
        assert not any(name.startswith("grad") for name in planned)


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "reduction"), [("inductor", "mean"), ("aot_eager", "none")])
def test_torch_compile_matches_eager(backend, reduction):
    p = make_problem(Case(N=32, D=8, V=50, reduction=reduction, bias=True, class_weight=True))
    options = lce.LinearCrossEntropyOptions(batch_chunk_size=8, allow_retain_graph=True)

    def step(x, w, b):
        loss = lce.linear_cross_entropy(x, w, p.target, linear_bias=b, weight=p.weight, reduction=reduction,
                                        options=options)
        return (loss * 1.5).sum() if reduction == "mean" else (loss * p.grad_output).sum()

    compiled = torch.compile(step, backend=backend)
    results = []
    for fn in (step, compiled):
        leaves = [t.detach().clone().requires_grad_() for t in (p.input, p.linear_weight, p.linear_bias)]
        out = fn(*leaves)
        out.backward()
        results.append((out.detach(), *(t.grad for t in leaves)))
    for name, got, expected in zip(("output", "input", "weight", "bias"), results[1], results[0], strict=False):
        assert_close_rel(got, expected, 1e-13, f"compiled {reduction}: {name}")


@pytest.mark.slow
def test_torch_compile_of_the_log_probs_matches_eager():
    """lce.linear_log_probs inside a compiled function: a graph break (lce runs eagerly), the same numbers."""
    p = make_problem(Case(N=32, D=8, V=50, reduction="none", bias=True))
    options = lce.LinearCrossEntropyOptions(batch_chunk_size=8)
    advantages = torch.linspace(-1, 1, 32, dtype=p.input.dtype)

    def step(x, w, b):
        log_probs, entropy = lce.linear_log_probs(torch.tanh(x), w, p.target.clamp_min(0), linear_bias=b,
                                                  temperature=0.7, return_entropy=True, options=options)
        return -(advantages * log_probs).mean() - 0.01 * entropy.mean()

    compiled = torch.compile(step, backend="inductor")
    results = []
    for fn in (step, compiled):
        leaves = [t.detach().clone().requires_grad_() for t in (p.input, p.linear_weight, p.linear_bias)]
        out = fn(*leaves)
        out.backward()
        results.append((out.detach(), *(t.grad for t in leaves)))
    for name, got, expected in zip(("output", "input", "weight", "bias"), results[1], results[0], strict=True):
        assert_close_rel(got, expected, 1e-13, f"compiled log-probs: {name}")


# In a fresh interpreter, so that the order is the one named (in-process, earlier tests decide it): both ops inside
# compiled functions, traced before any eager call ("compiled-first"), after eager calls once torch._dynamo is
# loaded ("eager-first": lce.compiler disables the op at that call), and after eager calls made before anything
# loaded it ("eager-before-dynamo": those calls must leave it unloaded). fp64, loss and gradients against eager;
# the backend records every graph Dynamo hands it, which must hold none of the chunk loop's GEMMs.
_COMPILE_ORDER_SCRIPT = """
import json, sys, torch, lce
order = sys.argv[1]
report = {"dynamo_after_import": "torch._dynamo" in sys.modules}
g = torch.Generator().manual_seed(0)
n, d, v = 32, 8, 50
x0, w0 = torch.randn(n, d, dtype=torch.float64, generator=g), torch.randn(v, d, dtype=torch.float64, generator=g)
b0 = torch.randn(v, dtype=torch.float64, generator=g)
target = torch.randint(0, v, (n,), generator=g)
target[3] = -100
advantages = torch.linspace(-1, 1, n, dtype=torch.float64)
options = lce.LinearCrossEntropyOptions(batch_chunk_size=8)

def cross_entropy(x, w, b):
    return 1.5 * lce.linear_cross_entropy(torch.tanh(x), w, target, linear_bias=b, options=options)

def log_probs(x, w, b):
    lp, entropy = lce.linear_log_probs(torch.tanh(x), w, target.clamp_min(0), linear_bias=b, temperature=0.7,
                                       return_entropy=True, options=options)
    return -(advantages * lp).mean() - 0.01 * entropy.mean()

steps = {"linear_cross_entropy": cross_entropy, "linear_log_probs": log_probs}
graphs = {name: [] for name in steps}

def recording(name):
    def backend(gm, example_inputs):
        graphs[name].append([getattr(node.target, "__name__", str(node.target)) for node in gm.graph.nodes
                             if node.op in ("call_function", "call_method")])
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)
    return backend

def run(fn):
    leaves = [t.clone().requires_grad_() for t in (x0, w0, b0)]
    out = fn(*leaves)
    out.backward()
    return [out.detach(), *(t.grad for t in leaves)]

eager = {}
if order == "eager-before-dynamo":
    eager = {name: run(step) for name, step in steps.items()}
    report["dynamo_after_eager"] = "torch._dynamo" in sys.modules
compiled = {name: torch.compile(step, backend=recording(name)) for name, step in steps.items()}
if order == "eager-first":
    eager = {name: run(step) for name, step in steps.items()}
got = {name: [run(fn), run(fn)] for name, fn in compiled.items()}
if order == "compiled-first":
    eager = {name: run(step) for name, step in steps.items()}
report["errors"] = {name: [max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(call, eager[name]))
                           for call in got[name]] for name in steps}
report["graphs"] = graphs
print(json.dumps(report))
"""


@pytest.mark.slow
@pytest.mark.parametrize("order", ["compiled-first", "eager-first", "eager-before-dynamo"])
def test_torch_compile_of_both_ops_in_a_fresh_process_breaks_the_graph_and_matches_eager(order):
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _COMPILE_ORDER_SCRIPT, order], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert not report["dynamo_after_import"], "import lce loaded torch._dynamo"
    if order == "eager-before-dynamo":
        assert not report["dynamo_after_eager"], "an eager lce call loaded torch._dynamo"
    gemms = {"mm", "matmul", "addmm", "bmm", "baddbmm", "linear", "logsumexp"}
    for name, graphs in report["graphs"].items():
        # a graph before the op (tanh) and one after it (the scaling or the advantage-weighted mean)
        assert len(graphs) >= 2, f"{order}, {name}: no graph break at the op: {graphs}"
        traced = {op for graph in graphs for op in graph} & gemms
        assert not traced, f"{order}, {name}: Dynamo traced into the chunk loop: {traced}"
        assert any("tanh" in graph for graph in graphs), f"{order}, {name}: {graphs}"
        for call, error in enumerate(report["errors"][name]):
            assert error <= 1e-12, f"{order}, {name}, compiled call {call}: relative error {error:.3g}"
