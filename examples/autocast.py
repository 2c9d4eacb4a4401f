"""lce under ``torch.autocast``: the same errors against fp64 with autocast on and off.

    python examples/autocast.py [--rows 512 --features 128 --classes 8192 --seeds 3]

Autocast decides only the dtype lce takes the head's tensors in (autocast's, as ``linear`` takes them); lce's own
arithmetic runs as its plan says, with autocast off (:mod:`lce.autocasting`). This prints, per seed and for CPU
bf16 autocast, the worst per-token error of ``lce.linear_log_probs`` (nats) and the relative Frobenius error of
the default loss's input and weight gradients, each against fp64 on the tensors the op computed with:

* bf16 tensors, autocast off and on (the two must agree: the same bits);
* fp32 weights and hidden states under bf16 autocast (mixed-precision training): lce takes them in bf16, so the
  errors are those of the bf16 call, measured against fp64 on the bf16-rounded tensors; the gradients reach the
  fp32 leaves through the cast.

It exits with status 1 if an autocast run differs from its autocast-off counterpart.
"""

from __future__ import annotations

import argparse

import torch

import lce
from analysis.core.provenance import cpu_model


def draw(rows: int, features: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 hidden states, a head whose logits spread over a few nats, and targets."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, features, generator=g)
    w = 0.3 * torch.randn(classes, features, generator=g)
    return x, w, torch.randint(0, classes, (rows,), generator=g)


def errors(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, autocast: bool) -> dict[str, float | torch.Tensor]:
    """lce's log-probabilities and default loss's gradients on leaves ``x`` and ``w``, under CPU bf16 autocast or
    not, against fp64 on the bf16-rounded tensors (what lce computes with either way)."""
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        log_probs = lce.linear_log_probs(x, w, y)
        loss = lce.linear_cross_entropy(x, w, y, options=lce.LinearCrossEntropyOptions())
    loss.backward()
    x64, w64 = (t.detach().to(torch.bfloat16).double().requires_grad_() for t in (x, w))
    exact_log_probs = torch.log_softmax(x64 @ w64.T, -1).gather(1, y[:, None]).squeeze(1)
    torch.nn.functional.cross_entropy(x64 @ w64.T, y).backward()

    def rel(got: torch.Tensor, exact: torch.Tensor) -> float:
        return float((got.double() - exact).norm() / exact.norm())

    return {"log_probs": float((log_probs.detach().double() - exact_log_probs.detach()).abs().max()),
            "grad_input": rel(x.grad, x64.grad), "grad_weight": rel(w.grad, w64.grad),
            "loss dtype": str(loss.dtype).removeprefix("torch."), "bits": (log_probs.detach(), x.grad, w.grad)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--classes", type=int, default=8192)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {cpu_model()}, "
          f"{args.rows} x {args.features} x {args.classes}, CPU bf16 autocast")
    print(f"{'seed':>4}  {'tensors':<22} {'autocast':<8} {'log_probs (nats)':>16} {'grad_input':>11} "
          f"{'grad_weight':>11}  loss dtype")
    mismatches = 0
    for seed in range(args.seeds):
        x, w, y = draw(args.rows, args.features, args.classes, seed)
        runs = {("bf16", "off"): errors(x.bfloat16(), w.bfloat16(), y, False),
                ("bf16", "on"): errors(x.bfloat16(), w.bfloat16(), y, True),
                ("fp32 (mixed precision)", "on"): errors(x, w, y, True)}
        for (tensors, autocast), found in runs.items():
            print(f"{seed:>4}  {tensors:<22} {autocast:<8} {found['log_probs']:>16.3e} {found['grad_input']:>11.3e} "
                  f"{found['grad_weight']:>11.3e}  {found['loss dtype']}")
        off, on = runs[("bf16", "off")]["bits"], runs[("bf16", "on")]["bits"]
        mismatches += not all(torch.equal(a, b) for a, b in zip(off, on, strict=True))
    print("bf16 tensors: autocast on and off give the same bits" if not mismatches else
          f"bf16 tensors: autocast changed lce's results for {mismatches} seed(s)")
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
