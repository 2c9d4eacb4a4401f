"""What each spawned rank of tests/test_distributed.py runs (a module, so spawned processes import it by name).

:func:`run_group` joins a gloo group over a file rendezvous (loopback only), runs one scenario and saves what it
measured to ``rank<R>.pt`` for the test to judge; collectives time out after :data:`TIMEOUT`, so a rank left
waiting fails instead of hanging.
"""

from __future__ import annotations

import datetime
import itertools
from pathlib import Path

import torch
import torch.distributed as dist

import lce
from lce.distributed import (
    VocabParallelLinearCrossEntropyLoss,
    even_shard_sizes,
    shard_bounds,
    vocab_parallel_linear_cross_entropy,
)

TIMEOUT = datetime.timedelta(seconds=60)
SHARDS = {2: [20, 17], 3: [10, 15, 12]}  # uneven, C = 37
N, D, C = 29, 8, 37
IGNORE = 3


def run_group(rank: int, world: int, rendezvous: str, scenario: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world,
                            timeout=TIMEOUT)
    try:
        torch.save(SCENARIOS[scenario](rank, world), Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _problem(dtype=torch.float64, seed=0, n=N, d=D, c=C):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    w = torch.randn(c, d, generator=g, dtype=torch.float64) * (2 / d**0.5)
    b = torch.randn(c, generator=g, dtype=torch.float64) * 0.5
    class_weight = torch.rand(c, generator=g, dtype=torch.float64) + 0.5
    target = torch.randint(0, c, (n,), generator=g)
    target[1::5] = IGNORE
    grad_rows = torch.randn(n, generator=g, dtype=torch.float64)
    return [t.to(dtype) for t in (x, w, b, class_weight)] + [target, grad_rows.to(dtype)]


def _run(fn, x, w, b, target, grad_rows, reduction, **kw):
    """loss, grad of x, w and b (b may be None) of ``fn`` on fresh leaves; "none" backpropagates ``grad_rows``."""
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (x, w, b)]
    loss = fn(leaves[0], leaves[1], target, linear_bias=leaves[2], reduction=reduction, **kw)
    if loss.requires_grad:
        loss.backward(grad_rows[: loss.numel()].reshape(loss.shape) if reduction == "none" else None)
    return loss.detach(), *[None if t is None else t.grad for t in leaves]


def _rel(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    if a is None and b is None:
        return 0.0
    scale = b.abs().max().double()
    return float((a.double() - b.double()).abs().max() / (scale if scale > 0 else 1.0))


def fp64_parity(rank: int, world: int) -> list[dict]:
    """Sharded against single-process lce on the unsharded weight, fp64, every policy and reduction, with bias,
    class weights, ignore_index, label smoothing, soft-capping, z-loss, 1-D input and class tiling per shard."""
    start, stop = shard_bounds(SHARDS[world])[rank]
    x, w, b, class_weight, target, grad_rows = _problem()
    results = []
    cases = itertools.product(("accurate", "balanced", "compact"), ("mean", "sum", "none"),
                              ("plain", "everything", "features", "one_d", "tiled"))
    for policy, reduction, variant in cases:
        options = lce.LinearCrossEntropyOptions(acc_policy=policy, batch_chunk_size=7,
                                                class_chunk_size=4 if variant == "tiled" else None)
        kw = dict(options=options)
        if variant in ("everything", "features", "tiled"):
            kw.update(weight=class_weight, ignore_index=IGNORE, label_smoothing=0.1)
        if variant == "features":
            kw.update(softcap=2.0, z_loss=0.05)
        xs, ts, bias = (x[0], target[0], b) if variant == "one_d" else (x, target, b if variant != "plain" else None)
        single = _run(lce.linear_cross_entropy, xs, w, bias, ts, grad_rows, reduction, **kw)
        shard_kw = {**kw, "weight": kw["weight"][start:stop]} if "weight" in kw else kw
        sharded = _run(vocab_parallel_linear_cross_entropy, xs, w[start:stop], None if bias is None else
                       bias[start:stop], ts, grad_rows, reduction, num_classes=C, **shard_kw)
        results.append(dict(label=f"{policy} {reduction} {variant}", loss=_rel(sharded[0], single[0]),
                            grad_input=_rel(sharded[1], single[1]),
                            grad_weight=_rel(sharded[2], single[2][start:stop]),
                            grad_bias=_rel(sharded[3], None if single[3] is None else single[3][start:stop])))
    return results


def _gathered(shard: torch.Tensor) -> torch.Tensor:
    pieces: list[torch.Tensor | None] = [None] * dist.get_world_size()
    dist.all_gather_object(pieces, shard)
    return torch.cat(pieces)


def low_precision(rank: int, world: int) -> list[dict]:
    """Floors (against fp64 lce on the upcast inputs) of sharded and single-process lce in bf16 and fp16, per
    policy and layout table."""
    from analysis.metrics import report
    from lce.testing import emulate_device_kind

    c = 1000
    start, stop = shard_bounds(even_shard_sizes(c, world))[rank]
    rows = []
    for dtype, kind, policy in itertools.product((torch.bfloat16, torch.float16), ("cpu", "cuda"),
                                                 ("accurate", "balanced", "compact")):
        x, w, b, _, target, grad_rows = _problem(dtype, seed=1, n=256, d=64, c=c)
        target = target.clamp_max(c - 1)
        options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=torch.float32, batch_chunk_size=32)
        exact = _run(lce.linear_cross_entropy, x.double(), w.double(), None, target, grad_rows, "mean",
                     options=lce.LinearCrossEntropyOptions())
        with emulate_device_kind(kind):
            single = _run(lce.linear_cross_entropy, x, w, None, target, grad_rows, "mean", options=options)
            sharded = _run(vocab_parallel_linear_cross_entropy, x, w[start:stop], None, target, grad_rows, "mean",
                           options=options)
        full_weight_grad = _gathered(sharded[2])
        row = dict(label=f"{dtype} {kind} {policy}")
        for name, got, want in (("single", single, exact), ("sharded", (sharded[0], sharded[1], full_weight_grad),
                                                            exact)):
            row[f"{name}_grad_input"] = report(got[1], want[1], dtype).fro_in_floors
            row[f"{name}_grad_weight"] = report(got[2], want[2], dtype).fro_in_floors
        rows.append(row)
    return rows


def all_ignored(rank: int, world: int) -> list[dict]:
    start, stop = shard_bounds(SHARDS[world])[rank]
    x, w, b, class_weight, target, grad_rows = _problem()
    target = torch.full_like(target, -100)
    out = []
    for reduction in ("mean", "sum", "none"):
        loss, gx, gw, gb = _run(vocab_parallel_linear_cross_entropy, x, w[start:stop], b[start:stop], target,
                                grad_rows, reduction, options=lce.LinearCrossEntropyOptions(batch_chunk_size=8),
                                z_loss=0.1)
        out.append(dict(reduction=reduction, loss=loss, max_grad=max(float(g.abs().max()) for g in (gx, gw, gb))))
    return out


def bad_inputs(rank: int, world: int) -> list[dict]:
    """Each case is bad on one rank only (or on all); every rank must raise, and the group must still work."""
    start, stop = shard_bounds(SHARDS[world])[rank]
    x, w, b, class_weight, target, grad_rows = _problem()
    mine = w[start:stop]
    cases = {
        "rows differ": dict(input=x[:-1] if rank == 1 else x, target=target[:-1] if rank == 1 else target),
        "dtype differs": dict(input=x.float() if rank == 0 else x, weight_shard=mine.float() if rank == 0 else mine),
        "shards do not add up": dict(num_classes=C + 1),
        "target out of range": dict(target=torch.where(torch.arange(N) == 4, C, target)),
        "targets differ": dict(target=torch.roll(target, 1) if rank == world - 1 else target),
        "bad bias shard": dict(linear_bias=b[start:stop - 1] if rank == 0 else b[start:stop]),
        "bad softcap": dict(softcap=-1.0),
    }
    out = []
    for name, change in cases.items():
        call = dict(input=x, weight_shard=mine, target=target, num_classes=C) | change
        try:
            vocab_parallel_linear_cross_entropy(call.pop("input"), call.pop("weight_shard"), call.pop("target"),
                                                **call)
            out.append(dict(case=name, error=None, message=""))
        except (ValueError, TypeError, RuntimeError) as error:
            out.append(dict(case=name, error=type(error).__name__, message=str(error)))
    # the group is still in step: a good call completes on every rank
    loss = vocab_parallel_linear_cross_entropy(x, mine, target, options=lce.LinearCrossEntropyOptions())
    out.append(dict(case="good call after", error=None, message=f"{float(loss):.17g}"))
    return out


def module(rank: int, world: int) -> list[dict]:
    sizes = SHARDS[world]
    start, stop = shard_bounds(sizes)[rank]
    x, w, b, class_weight, target, grad_rows = _problem()
    head = VocabParallelLinearCrossEntropyLoss(D, sizes, bias=True, dtype=torch.float64, ignore_index=IGNORE,
                                               options=lce.LinearCrossEntropyOptions(batch_chunk_size=5),
                                               softcap=3.0)
    with torch.no_grad():
        head.linear.weight.copy_(w[start:stop])
        head.linear.bias.copy_(b[start:stop])
    loss = head(x, target)
    loss.backward()
    single = _run(lce.linear_cross_entropy, x, w, b, target, grad_rows, "mean", ignore_index=IGNORE, softcap=3.0,
                  options=lce.LinearCrossEntropyOptions())
    return [dict(loss=_rel(loss.detach(), single[0]), grad_weight=_rel(head.linear.weight.grad,
                                                                        single[2][start:stop]),
                 repr=repr(head))]


SCENARIOS = {"fp64": fp64_parity, "low_precision": low_precision, "all_ignored": all_ignored,
             "bad_inputs": bad_inputs, "module": module}
