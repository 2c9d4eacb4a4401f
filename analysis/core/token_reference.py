"""The fp64 reference of per-token log-probabilities, entropy and a policy-gradient loss's gradient.

For tempered logits ``u = (x @ W.T + b) / T`` of the rounded inputs, evaluated in fp64 a chunk of rows at a time,
in the target-relative form ``v = u - u_y``:

    -log p_y = softplus(logsumexp over c != y of v_c)
    1 - p_y  = sigmoid(logsumexp over c != y of v_c)
    H        = -log p_y - sum over c != y of p_c v_c,       p_c = exp(v_c + log p_y)

Every term keeps fp64's relative precision on a confident row (its target leading by 40 nats), where fp64's own
``log_softmax`` rounds ``log(1 + 4e-18)`` to 0 and ``1 - p_y`` to 0. The sampler of a study draws targets from
``softmax(u)`` here (:func:`sample_targets`), as an RL rollout samples tokens from the policy.

The policy-gradient loss is ``L = -sum_i A_i log p_{y_i} / n`` over the ``n`` rows (advantages ``A``), whose
gradient with respect to the tempered logits is ``A_i / n (p - onehot(y))``, its target entry ``-A_i / n (1 - p_y)``
formed from the sum over the other classes.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

__all__ = ["TokenReference", "token_reference", "sample_targets", "sample_and_score", "REFERENCE_BLOCK_ELEMENTS"]

REFERENCE_BLOCK_ELEMENTS = 1 << 24
"""Logit entries per row chunk (128 MiB of fp64, a few of them alive at once)."""


@dataclasses.dataclass(frozen=True)
class TokenReference:
    """Exact per-row values (N,) fp64: ``log_probs``, ``entropy``, ``other_prob`` (``1 - p_y``), ``rank`` (how many
    classes have a larger tempered logit than the target), and the policy-gradient loss's gradients with respect to
    the input (N, D) and the weight (C, D), fp64."""

    log_probs: torch.Tensor
    entropy: torch.Tensor
    other_prob: torch.Tensor
    rank: torch.Tensor
    grad_input: torch.Tensor
    grad_weight: torch.Tensor


def _row_chunks(n: int, c: int, block_elements: int):
    rows = max(1, block_elements // max(c, 1))
    return (slice(start, min(start + rows, n)) for start in range(0, n, rows))


def _tempered(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, rows: slice, temperature) -> torch.Tensor:
    logits = x[rows].double() @ w.double().T
    if b is not None:
        logits += b.double()
    t = temperature[rows, None].double() if isinstance(temperature, torch.Tensor) else float(temperature)
    return logits / t


def sample_targets(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, temperature, *, seed: int,
                   block_elements: int = REFERENCE_BLOCK_ELEMENTS) -> torch.Tensor:
    """One token per row drawn from ``softmax((x @ W.T + b) / T)`` in fp64 (the rollout's sampler), seeded."""
    generator = torch.Generator().manual_seed(seed)
    out = torch.empty(x.shape[0], dtype=torch.int64)
    for rows in _row_chunks(x.shape[0], w.shape[0], block_elements):
        probs = torch.softmax(_tempered(x, w, b, rows, temperature), 1)
        out[rows] = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return out


def sample_and_score(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, temperatures, *, seed: int,
                     block_elements: int = REFERENCE_BLOCK_ELEMENTS) -> dict[float, tuple[torch.Tensor, torch.Tensor]]:
    """For each temperature ``T`` of ``temperatures``: the targets :func:`sample_targets` draws at ``T`` with
    ``seed`` (the same tokens: one generator per temperature, seeded alike, drawing row chunk by row chunk) and the
    log of the fp64 softmax they were drawn from at each target (absolute error about 1e-15 nats; on a row whose
    target leads by tens of nats that tiny ``log p`` keeps no relative precision: :func:`token_reference` keeps it),
    from one fp64 GEMM per row chunk that the temperatures share. Returns ``{T: (target (N,) int64, log_probs (N,)
    fp64)}``."""
    n, c = x.shape[0], w.shape[0]
    wide_w = w.double()
    wide_b = None if b is None else b.double()
    generators = {float(t): torch.Generator().manual_seed(seed) for t in temperatures}
    out = {t: (torch.empty(n, dtype=torch.int64), torch.empty(n, dtype=torch.float64)) for t in generators}
    for rows in _row_chunks(n, c, block_elements):
        logits = x[rows].double() @ wide_w.T
        if wide_b is not None:
            logits += wide_b
        for t, generator in generators.items():
            probs = torch.softmax(logits / t, 1)
            target = torch.multinomial(probs, 1, generator=generator)
            out[t][0][rows] = target.squeeze(1)
            out[t][1][rows] = probs.gather(1, target).squeeze(1).log()
    return out


def token_reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, target: torch.Tensor, temperature,
                    advantages: torch.Tensor, *, block_elements: int = REFERENCE_BLOCK_ELEMENTS) -> TokenReference:
    """The exact values of the module docstring for the rounded inputs (any dtype; upcast to fp64 exactly)."""
    n, c = x.shape[0], w.shape[0]
    f64 = torch.float64
    log_probs, entropy, other_prob = (torch.empty(n, dtype=f64) for _ in range(3))
    rank = torch.empty(n, dtype=torch.int64)
    grad_input = torch.empty(n, x.shape[1], dtype=f64)
    grad_weight = torch.zeros(c, x.shape[1], dtype=f64)
    coefficient = advantages.double() / n
    t = temperature.double() if isinstance(temperature, torch.Tensor) else torch.full((n,), float(temperature),
                                                                                       dtype=f64)
    for rows in _row_chunks(n, c, block_elements):
        u = _tempered(x, w, b, rows, temperature)
        index = target[rows, None]
        v = u - u.gather(1, index)
        rank[rows] = (v > 0).sum(1)
        others = v.scatter(1, index, -math.inf)
        spread = torch.logsumexp(others, 1)
        nll = F.softplus(spread)
        log_probs[rows], other_prob[rows] = -nll, torch.sigmoid(spread)
        probs = torch.exp(others - nll[:, None])  # 0 at the target
        entropy[rows] = nll - (probs * others.nan_to_num(neginf=0.0)).sum(1)
        # dL/du = A/n (p - onehot): the target's entry is -A/n (1 - p_y)
        grad_u = probs.mul_(coefficient[rows, None])
        grad_u.scatter_(1, index, (-coefficient[rows] * other_prob[rows])[:, None])
        grad_z = grad_u.div_(t[rows, None])
        grad_input[rows] = grad_z @ w.double()
        grad_weight += grad_z.T @ x[rows].double()
    return TokenReference(log_probs, entropy, other_prob, rank, grad_input, grad_weight)
