"""A one-minute tour: the resolved plan, then lce's and torch's errors against fp64, per policy.

    python -m lce.demo [--rows 2048 --features 256 --classes 8192 --dtypes bfloat16 float16]

Inputs are drawn in fp32 and rounded to each dtype; the fp64 reference is
computed from those same rounded values, so every error below is the op's
own. Errors are relative Frobenius norms, also shown as multiples of the
rounding floor (the error of the exact answer merely rounded to the dtype).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from . import LinearCrossEntropyOptions, linear_cross_entropy, plan

OUTPUTS = ("loss", "grad_input", "grad_weight", "grad_bias")


def _problem(rows: int, features: int, classes: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, features, generator=g).to(dtype)
    w = (torch.randn(classes, features, generator=g) / features**0.5).to(dtype)
    b = (0.1 * torch.randn(classes, generator=g)).to(dtype)
    target = torch.randint(0, classes, (rows,), generator=g)
    return x, w, b, target


def _loss_and_grads(fn, x, w, b, target, **kwargs):
    x, w, b = (t.detach().clone().requires_grad_() for t in (x, w, b))
    start = time.perf_counter()
    loss = fn(x, w, target, linear_bias=b, **kwargs)
    loss.backward()
    elapsed = time.perf_counter() - start
    return (loss.detach(), x.grad, w.grad, b.grad), elapsed


def _fp64_reference(x, w, b, target):
    def reference(x, w, target, linear_bias):
        return F.cross_entropy(F.linear(x, w, linear_bias), target)

    outputs, _ = _loss_and_grads(reference, x.double(), w.double(), b.double(), target)
    return outputs


def _relative_error(got: torch.Tensor, exact: torch.Tensor) -> float:
    return float((got.double() - exact).norm() / exact.norm())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lce.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--classes", type=int, default=8192)
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    args = parser.parse_args(argv)

    peer = getattr(torch.nn.functional, "linear_cross_entropy", None)
    peer_options = getattr(torch.nn, "LinearCrossEntropyOptions", None)
    print(f"torch {torch.__version__}, N={args.rows} D={args.features} C={args.classes}, fwd+bwd on CPU")
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        x, w, b, target = _problem(args.rows, args.features, args.classes, dtype)
        exact = _fp64_reference(x, w, b, target)
        floors = [_relative_error(e.to(dtype), e) for e in exact]
        print(f"\n{plan(LinearCrossEntropyOptions(), x.requires_grad_(), w.requires_grad_())}\n")
        header = f"{'implementation':<12} {'options':<22} {'time':>7}  " + "  ".join(f"{o:>18}" for o in OUTPUTS)
        print(header)
        print(f"{'(floor)':<12} {'fp64 rounded to ' + dtype_name:<22} {'':>7}  "
              + "  ".join(f"{f:>18.2e}" for f in floors))
        settings = [("auto", {})] + [(f"{p}, acc fp32", {"acc_policy": p, "acc_dtype": torch.float32})
                                     for p in ("accurate", "balanced", "compact")]
        for label, fields in settings:
            runs = [("lce", linear_cross_entropy, LinearCrossEntropyOptions)]
            if peer is not None and peer_options is not None:
                runs.append(("torch", peer, peer_options))
            for name, fn, options_class in runs:
                outputs, elapsed = _loss_and_grads(fn, x, w, b, target, options=options_class(**fields))
                cells = [f"{_relative_error(o, e):.2e} ({_relative_error(o, e) / f:4.1f}x)"
                         for o, e, f in zip(outputs, exact, floors, strict=True)]
                print(f"{name:<12} {label:<22} {elapsed:6.2f}s  " + "  ".join(f"{c:>18}" for c in cells))


if __name__ == "__main__":
    main()
