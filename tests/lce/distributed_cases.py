"""What each spawned rank of tests/lce/test_distributed.py runs (a module, so spawned processes import it by name).

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
    vocab_parallel_linear_log_probs,
)
from lce.unfused import unfused_linear_log_probs

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


UNEVEN = {2: [1, 36], 3: [5, 1, 31], 4: [1, 20, 3, 13]}
"""Uneven shards of the C = 37 classes: a rank with a single class, ranks with fewer classes than D = 8."""

CHUNKINGS = {
    "automatic": {},
    "explicit rows": dict(batch_chunk_size=7),
    "aspect_ratio": dict(chunking_method="aspect_ratio"),
    "automatic, class tiled": dict(class_chunk_size=3),
    "explicit rows, class tiled": dict(batch_chunk_size=5, chunking_method=None, class_chunk_size=2),
}
"""Row chunkings whose automatic forms size the chunks from the class count (the shard's, before issue 24)."""


def _compare(label: str, start: int, stop: int, single, sharded) -> dict:
    return dict(label=label, loss=_rel(sharded[0], single[0]), grad_input=_rel(sharded[1], single[1]),
                grad_weight=_rel(sharded[2], single[2][start:stop]),
                grad_bias=_rel(sharded[3], None if single[3] is None else single[3][start:stop]))


def uneven_parity(rank: int, world: int) -> list[dict]:
    """Uneven shards (:data:`UNEVEN`), fp64, every policy, reduction and chunking of :data:`CHUNKINGS`, with a
    bias: sharded against single-process lce on the unsharded weight."""
    sizes = UNEVEN[world]
    start, stop = shard_bounds(sizes)[rank]
    x, w, b, class_weight, target, grad_rows = _problem()
    results = []
    for policy, reduction, (chunking, fields) in itertools.product(("accurate", "balanced", "compact"),
                                                                   ("mean", "sum", "none"), CHUNKINGS.items()):
        options = lce.LinearCrossEntropyOptions(acc_policy=policy, **fields)
        single = _run(lce.linear_cross_entropy, x, w, b, target, grad_rows, reduction, options=options)
        sharded = _run(vocab_parallel_linear_cross_entropy, x, w[start:stop], b[start:stop], target, grad_rows,
                       reduction, options=options, num_classes=C)
        results.append(_compare(f"{policy} {reduction} {chunking}", start, stop, single, sharded))
    return results


def reported_case(rank: int, world: int) -> list[dict]:
    """Issue 24 as reported: 3 ranks, shards of 10, 3 and 19 classes, N=40, D=4, fp64, reduction "none", a bias,
    acc_policy="accurate" with automatic chunking (5, 2 and 10 chunks had each rank planned its own)."""
    sizes = [10, 3, 19]
    start, stop = shard_bounds(sizes)[rank]
    x, w, b, _, target, grad_rows = _problem(n=40, d=4, c=32)
    target = target.clamp_max(31)
    options = lce.LinearCrossEntropyOptions(acc_policy="accurate")
    single = _run(lce.linear_cross_entropy, x, w, b, target, grad_rows, "none", options=options)
    sharded = _run(vocab_parallel_linear_cross_entropy, x, w[start:stop], b[start:stop], target, grad_rows, "none",
                   options=options)
    return [_compare("reported", start, stop, single, sharded)]


RANDOM_CASES = 24


def random_parity(rank: int, world: int) -> list[dict]:
    """:data:`RANDOM_CASES` calls drawn from one seed (the same draws on every rank): shard sizes from 1 to 3 D,
    N, D, policy, reduction, row and class chunking, bias, class weights, ignored rows, smoothing, soft-capping
    and z-loss; sharded against single-process lce in fp64."""
    draw = torch.Generator().manual_seed(24)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=draw))]

    def integer(low, high):
        return int(torch.randint(low, high + 1, (1,), generator=draw))

    results = []
    for case in range(RANDOM_CASES):
        n, d = integer(1, 48), integer(2, 10)
        sizes = [integer(1, 3 * d) for _ in range(world)]
        c = sum(sizes)
        start, stop = shard_bounds(sizes)[rank]
        fields = dict(acc_policy=pick(("accurate", "balanced", "compact", "auto")))
        row_chunking = pick(("auto", "explicit", "aspect_ratio", "aspect_ratio:4"))
        if row_chunking == "explicit":
            fields.update(chunking_method=None, batch_chunk_size=integer(1, n))
        elif row_chunking.startswith("aspect"):
            fields.update(chunking_method=row_chunking)
        if pick((False, True)):
            fields.update(class_chunk_size=integer(1, max(sizes)))
        options = lce.LinearCrossEntropyOptions(**fields)
        x, w, b, class_weight, target, grad_rows = _problem(seed=100 + case, n=n, d=d, c=c)
        target = torch.where(target >= c, c - 1, target)
        kw = dict(options=options, ignore_index=IGNORE)
        if pick((False, True)):
            kw.update(weight=class_weight)
        if pick((False, True)):
            kw.update(label_smoothing=0.1)
        if pick((False, True)):
            kw.update(softcap=3.0)
        if pick((False, True)):
            kw.update(z_loss=0.01)
        bias = b if pick((False, True)) else None
        reduction = pick(("mean", "sum", "none"))
        single = _run(lce.linear_cross_entropy, x, w, bias, target, grad_rows, reduction, **kw)
        shard_kw = {**kw, "weight": kw["weight"][start:stop]} if "weight" in kw else kw
        sharded = _run(vocab_parallel_linear_cross_entropy, x, w[start:stop],
                       None if bias is None else bias[start:stop], target, grad_rows, reduction, **shard_kw)
        label = (f"case {case}: shards {sizes}, N={n} D={d}, {reduction}, {fields}, "
                 f"{sorted(k for k in kw if k != 'options')}, bias {bias is not None}")
        results.append(_compare(label, start, stop, single, sharded))
    return results


def _gathered(shard: torch.Tensor) -> torch.Tensor:
    pieces: list[torch.Tensor | None] = [None] * dist.get_world_size()
    dist.all_gather_object(pieces, shard)
    return torch.cat(pieces)


def low_precision(rank: int, world: int) -> list[dict]:
    """Floors (against fp64 lce on the upcast inputs) of sharded and single-process lce in bf16 and fp16, per
    policy and layout table."""
    from analysis.core.metrics import report
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
        "bad loss_dtype": dict(loss_dtype=torch.int32 if rank == 0 else None),
        "options differ": dict(options=lce.LinearCrossEntropyOptions(acc_policy="accurate" if rank == 1
                                                                      else "balanced")),
        "chunking differs": dict(options=lce.LinearCrossEntropyOptions(batch_chunk_size=4 + (rank == 0))),
        "bad options type": dict(options="fast" if rank == world - 1 else None),
        "requires grad differs": dict(input=x.clone().requires_grad_(rank == 0)),
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


def loss_scale(rank: int, world: int) -> list[dict]:
    """fp16 shards under a loss scale of 2**16 with an fp32 loss (lce.passes.headroom on every rank): gradient entries
    lost to fp16's subnormal range, sharded and single-process, against fp64; a Zipfian prior makes most classes
    rare."""
    from lce.testing import emulate_device_kind, without_headroom

    n, d, c = 512, 32, 2048
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    w = torch.randn(c, d, generator=g, dtype=torch.float64) * 0.1
    b = -torch.log(torch.arange(1, c + 1, dtype=torch.float64))
    target = torch.multinomial(torch.softmax(x @ w.T + b, 1), 1, generator=g).squeeze(1)
    start, stop = shard_bounds(even_shard_sizes(c, world))[rank]
    scale, tiny = 2.0 ** 16, torch.finfo(torch.float16).tiny

    def scaled(fn, dtype, weight, bias, **kw):
        leaves = [t.to(dtype).detach().requires_grad_() for t in (x, weight, bias)]
        loss = fn(leaves[0], leaves[1], target, linear_bias=leaves[2], **kw)
        (loss.to(torch.float64 if dtype == torch.float64 else torch.float32) * scale).backward()
        return loss.dtype, [t.grad for t in leaves]

    _, exact = scaled(lce.linear_cross_entropy, torch.float64, w, b, options=lce.LinearCrossEntropyOptions())
    rows = []
    for kind, policy in itertools.product(("cpu", "cuda"), ("auto", "balanced", "compact")):
        options = lce.LinearCrossEntropyOptions(acc_policy=policy, batch_chunk_size=64,
                                                acc_dtype=None if policy == "auto" else torch.float32)
        with emulate_device_kind(kind):
            loss_dtype, sharded = scaled(vocab_parallel_linear_cross_entropy, torch.float16, w[start:stop],
                                         b[start:stop], options=options, loss_dtype=torch.float32)
            _, single = scaled(lce.linear_cross_entropy, torch.float16, w, b, options=options,
                               loss_dtype=torch.float32)
            with without_headroom():  # the check can fail: lce's arithmetic before the headroom loses entries
                _, before = scaled(vocab_parallel_linear_cross_entropy, torch.float16, w[start:stop], b[start:stop],
                                   options=options, loss_dtype=torch.float32)
        full = [sharded[0], _gathered(sharded[1]), _gathered(sharded[2])]
        row = dict(label=f"{kind} {policy}", loss_dtype=str(loss_dtype),
                   weight_lost_before=int(((_gathered(before[1]).double().abs() < tiny)
                                           & (exact[1].abs() >= tiny)).sum()))
        for name, mine, theirs, truth in zip(("input", "weight", "bias"), full, single, exact, strict=True):
            normal = truth.abs() >= tiny
            row[f"{name}_finite"] = bool(torch.isfinite(mine).all())
            row[f"{name}_lost_sharded"] = int(((mine.double().abs() < tiny) & normal).sum())
            row[f"{name}_lost_single"] = int(((theirs.double().abs() < tiny) & normal).sum())
            row[f"{name}_rel"] = float((mine.double() - theirs.double()).norm() / truth.norm())
        rows.append(row)
    return rows


def _log_probs_run(fn, x, w, b, target, grad_logp, grad_entropy, **kw):
    """log-probs, entropy and the gradients of x, w and b of ``sum(grad_logp * logp + grad_entropy * H)``."""
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    log_probs, entropy = fn(leaves[0], leaves[1], target, linear_bias=leaves[2], return_entropy=True, **kw)
    (grad_logp * log_probs + grad_entropy * entropy).sum().backward()
    return log_probs.detach(), entropy.detach(), *[t.grad for t in leaves]


def log_probs_parity(rank: int, world: int) -> list[dict]:
    """Issue 32: vocab-parallel per-token log-probabilities and entropy against the materialized fp64 formula on
    the unsharded weight, on uneven shards (:data:`UNEVEN`: a rank with one class), every policy, chunkings with
    and without class tiling, scalar and per-row temperatures, soft-capping and ignore_index; and a bad
    temperature failing on every rank."""
    sizes = UNEVEN[world]
    start, stop = shard_bounds(sizes)[rank]
    x, w, b, _, target, grad_rows = _problem()
    grad_entropy = torch.flip(grad_rows, (0,)) * 0.5
    per_row = torch.linspace(0.6, 1.2, N, dtype=torch.float64)
    results = []
    cases = itertools.product(("accurate", "balanced", "compact"), ("explicit rows", "automatic, class tiled"),
                              (("T=1", 1.0), ("T=0.7", 0.7), ("per-row T", per_row)), (None, 2.0))
    for policy, chunking, (t_label, temperature), softcap in cases:
        options = lce.LinearCrossEntropyOptions(acc_policy=policy, **CHUNKINGS[chunking])
        kw = dict(temperature=temperature, softcap=softcap, ignore_index=IGNORE)
        exact = _log_probs_run(unfused_linear_log_probs, x, w, b, target, grad_rows, grad_entropy, **kw)
        sharded = _log_probs_run(vocab_parallel_linear_log_probs, x, w[start:stop], b[start:stop], target, grad_rows,
                                 grad_entropy, options=options, num_classes=C, **kw)
        results.append(dict(label=f"{policy} {chunking} {t_label} softcap={softcap}",
                            log_probs=_rel(sharded[0], exact[0]), entropy=_rel(sharded[1], exact[1]),
                            grad_input=_rel(sharded[2], exact[2]), grad_weight=_rel(sharded[3], exact[3][start:stop]),
                            grad_bias=_rel(sharded[4], exact[4][start:stop])))
    try:
        vocab_parallel_linear_log_probs(x, w[start:stop], target, temperature=0.0 if rank == 0 else 1.0)
        results.append(dict(label="bad temperature", error=None))
    except ValueError as error:
        results.append(dict(label="bad temperature", error=str(error)))
    return results


def autocast(rank: int, world: int) -> list[dict]:
    """Issue 42: the vocab-parallel ops under CPU autocast (bf16, fp16) on fp32 shards against the same calls outside
    autocast on the shards cast to autocast's dtype (``loss_dtype`` fp32 for the loss): whether every output and
    gradient is bitwise equal, each reduction and the log-probabilities, backward run inside the autocast block."""
    start, stop = shard_bounds(SHARDS[world])[rank]
    x, w, b, class_weight, target, grad_rows = (t.float() if t.is_floating_point() else t for t in _problem())
    grad_entropy = torch.flip(grad_rows, (0,))
    options = lce.LinearCrossEntropyOptions(batch_chunk_size=5, class_chunk_size=4)

    def run(fn, dtype, under, seeds, **kw):
        leaves = [t.detach().clone().requires_grad_() for t in (x, w[start:stop], b[start:stop])]
        taken = leaves if under else [t.to(dtype) for t in leaves]
        with torch.autocast("cpu", dtype=dtype, enabled=under):
            out = fn(taken[0], taken[1], target, linear_bias=taken[2], options=options, **kw)
            outputs = out if isinstance(out, tuple) else (out,)
            torch.autograd.backward(list(outputs), [s[: o.numel()].reshape(o.shape).to(o.dtype)
                                                    for o, s in zip(outputs, seeds, strict=False)])
        return [o.detach() for o in outputs] + [t.grad for t in leaves]

    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        calls = {f"loss {reduction}": (vocab_parallel_linear_cross_entropy, [grad_rows],
                                       dict(reduction=reduction, weight=class_weight[start:stop], ignore_index=IGNORE,
                                            z_loss=1e-3, softcap=4.0))
                 for reduction in ("mean", "none")}
        calls["log_probs"] = (vocab_parallel_linear_log_probs, [grad_rows, grad_entropy],
                              dict(return_entropy=True, temperature=0.7, ignore_index=IGNORE))
        for label, (fn, seeds, kw) in calls.items():
            off_kw = dict(kw, loss_dtype=torch.float32) if fn is vocab_parallel_linear_cross_entropy else kw
            under, outside = run(fn, dtype, True, seeds, **kw), run(fn, dtype, False, seeds, **off_kw)
            rows.append(dict(label=f"{label} {dtype}", dtypes=[str(t.dtype) for t in under],
                             equal=[a.dtype == b.dtype and torch.equal(a, b)
                                    for a, b in zip(under, outside, strict=True)]))
    return rows


def batch_invariance(rank: int, world: int) -> list[dict]:
    """Issue 51: on uneven bf16 shards, the first rows, the rows reversed and the rows after others of another
    batch: whether each shared row's log-probabilities, entropy, per-row loss and input gradients are the bits of
    the full batch's (fixed rows of 64, batch_invariant=True; the last chunk padded)."""
    start, stop = shard_bounds(SHARDS[world])[rank]
    rows = 150  # three fixed chunks of 64 rows, the last one padded
    x, w, b, _, target, _ = (t.to(torch.bfloat16) if t.is_floating_point() else t for t in _problem(n=rows))
    other = torch.randn(7, D, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    other_target = torch.arange(7) % C
    options = lce.LinearCrossEntropyOptions(batch_chunk_size=64, batch_invariant=True)

    def outputs(xs, targets):
        leaf = xs.detach().clone().requires_grad_()
        log_probs, entropy = vocab_parallel_linear_log_probs(leaf, w[start:stop], targets, linear_bias=b[start:stop],
                                                             return_entropy=True, temperature=0.7,
                                                             ignore_index=IGNORE, options=options)
        (log_probs * 2 + entropy).sum().backward()
        leaf_loss = xs.detach().clone().requires_grad_()
        loss = vocab_parallel_linear_cross_entropy(leaf_loss, w[start:stop], targets, linear_bias=b[start:stop],
                                                   reduction="none", ignore_index=IGNORE, options=options)
        loss.sum().backward()
        return dict(log_probs=log_probs.detach(), entropy=entropy.detach(), grad_log_probs=leaf.grad,
                    loss=loss.detach(), grad_loss=leaf_loss.grad)

    full = outputs(x, target)
    variants = {"first 1": (torch.arange(1), 0), "first 65": (torch.arange(65), 0),
                "reversed": (torch.arange(rows - 1, -1, -1), 0), "after 7 other rows": (torch.arange(rows), 7)}
    results = []
    for label, (order, shift) in variants.items():
        xs, targets = x[order], target[order]
        if shift:
            xs, targets = torch.cat([other, xs]), torch.cat([other_target, targets])
        got = outputs(xs, targets)
        results.append(dict(label=label, equal={name: bool(torch.equal(got[name][shift:], full[name][order]))
                                                for name in full},
                            nonzero=bool(full["grad_loss"].abs().sum() > 0)))
    return results


SCENARIOS = {"autocast": autocast, "log_probs": log_probs_parity, "fp64": fp64_parity, "low_precision": low_precision,
             "all_ignored": all_ignored, "bad_inputs": bad_inputs, "module": module, "uneven": uneven_parity,
             "reported": reported_case, "random": random_parity, "loss_scale": loss_scale,
             "batch_invariance": batch_invariance}
