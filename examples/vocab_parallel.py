"""Vocab-parallel linear cross-entropy on CPU processes: the loss and the gradient error against one process.

    torchrun --standalone --nproc-per-node 2 examples/vocab_parallel.py [--classes 32000] [--dtype bfloat16]

Every rank builds the same inputs from one seed, keeps its slice of the classifier rows, and calls
lce.distributed.vocab_parallel_linear_cross_entropy; rank 0 then runs lce.linear_cross_entropy on the whole
weight in one process and prints how far the sharded loss and gradients are from it (the gradient of the
weight gathered from every rank).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import lce
from lce.distributed import even_shard_sizes, shard_bounds, vocab_parallel_linear_cross_entropy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--classes", type=int, default=32000)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16", "float64"])
    args = parser.parse_args()
    dist.init_process_group("gloo")  # torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dtype = getattr(torch, args.dtype)

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.rows, args.features, generator=generator).to(dtype)
    weight = (torch.randn(args.classes, args.features, generator=generator) / args.features**0.5).to(dtype)
    target = torch.randint(0, args.classes, (args.rows,), generator=generator)
    start, stop = shard_bounds(even_shard_sizes(args.classes, world))[rank]
    options = lce.LinearCrossEntropyOptions()

    x_here = x.clone().requires_grad_()
    shard = weight[start:stop].clone().requires_grad_()
    loss = vocab_parallel_linear_cross_entropy(x_here, shard, target, options=options)
    loss.backward()
    pieces: list[torch.Tensor | None] = [None] * world
    dist.all_gather_object(pieces, shard.grad)
    print(f"rank {rank}: classes [{start}, {stop}), loss {float(loss.detach()):.6f}", flush=True)

    if rank == 0:
        x_one, weight_one = x.clone().requires_grad_(), weight.clone().requires_grad_()
        reference = lce.linear_cross_entropy(x_one, weight_one, target, options=options)
        reference.backward()

        def relative(a: torch.Tensor, b: torch.Tensor) -> float:
            return float((a.double() - b.double()).norm() / b.double().norm())

        loss_difference = abs(float(loss.detach()) - float(reference.detach()))
        input_error = relative(x_here.grad, x_one.grad)
        weight_error = relative(torch.cat(pieces), weight_one.grad)
        print(f"one process: loss {float(reference.detach()):.6f}; sharded over {world} ranks ({args.dtype}): loss "
              f"differs by {loss_difference:.3g}, grad_input by {input_error:.3g} and grad_weight by "
              f"{weight_error:.3g} (relative Frobenius)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
