"""A GRPO-style update of the repo's small language model, its log-probabilities and entropy through lce's chunked
head (``lce.linear_log_probs``) or through materialized logits.

    python examples/grpo_update.py [--vocab 151936] [--csv analysis/results/rl_example.csv]

Part 1 (fp64): one batch of prompts, a group of completions per prompt sampled from the policy at temperature T,
a toy reward, group-normalised advantages, and two clipped policy-gradient updates with an entropy bonus and a
k3 KL penalty against a frozen reference model: once with lce's head, once with the materialized logits, from the
same weights. Every loss and every parameter's gradient agree to fp64's rounding.

Part 2 (memory): one such update of the same model with a Qwen-size vocabulary (151,936 classes) in fp32 on this
CPU, 16 sequences x 64 tokens: the peak extra bytes of each head, measured by the allocator.

The model is :class:`analysis.lm.model.TinyLM` (the architecture of the ``trained`` family's model, randomly
initialised here: its trained checkpoint is not in the repository).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import time

import torch

import lce
from analysis.lm.model import ModelConfig, TinyLM

IGNORE = -100


@dataclasses.dataclass(frozen=True)
class GrpoSettings:
    """One GRPO batch: ``prompts`` prompts of ``prompt_length`` tokens, ``group`` completions of ``new_tokens`` each,
    sampled at ``temperature``; the PPO clip ``clip``, entropy bonus ``entropy_coef`` and KL penalty ``kl_coef``."""

    prompts: int = 4
    group: int = 4
    prompt_length: int = 8
    new_tokens: int = 24
    temperature: float = 0.8
    clip: float = 0.2
    entropy_coef: float = 0.01
    kl_coef: float = 0.04
    learning_rate: float = 0.5


def token_stats_lce(model: TinyLM, sequences: torch.Tensor, targets: torch.Tensor, temperature: float,
                    options: lce.LinearCrossEntropyOptions | None = None):
    """Per-token log p(target) and entropy through lce's chunked head: the (B, L, V) logits never exist."""
    hidden = model.hidden(sequences)
    return lce.linear_log_probs(hidden, model.head.weight, targets, temperature=temperature, return_entropy=True,
                                ignore_index=IGNORE, options=options)


def token_stats_materialized(model: TinyLM, sequences: torch.Tensor, targets: torch.Tensor, temperature: float):
    """The same from materialized logits: ``log_softmax(logits / T)``, the target's entry and ``-sum p log p``."""
    log_probs = torch.log_softmax(model(sequences) / temperature, -1)
    valid = targets != IGNORE
    picked = log_probs.gather(-1, torch.where(valid, targets, 0)[..., None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return torch.where(valid, picked, 0), torch.where(valid, entropy, 0)


@torch.no_grad()
def sample_group(model: TinyLM, settings: GrpoSettings, generator: torch.Generator) -> torch.Tensor:
    """``prompts x group`` sequences: a random prompt each (shared within a group), then ``new_tokens`` tokens drawn
    one at a time from ``softmax(logits / T)`` (the rollout)."""
    vocab = model.config.vocab_size
    prompts = torch.randint(0, vocab, (settings.prompts, settings.prompt_length), generator=generator)
    sequences = prompts.repeat_interleave(settings.group, 0)
    for _ in range(settings.new_tokens):
        logits = model(sequences)[:, -1].double() / settings.temperature
        token = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
        sequences = torch.cat([sequences, token], 1)
    return sequences


def advantages_of(sequences: torch.Tensor, settings: GrpoSettings) -> torch.Tensor:
    """A toy reward (the share of even token ids in the completion), normalised within each group (GRPO)."""
    completion = sequences[:, settings.prompt_length:]
    reward = (completion % 2 == 0).double().mean(1).reshape(settings.prompts, settings.group)
    normalised = (reward - reward.mean(1, keepdim=True)) / (reward.std(1, keepdim=True) + 1e-6)
    return normalised.reshape(-1)


def grpo_loss(log_probs, entropy, old_log_probs, ref_log_probs, advantages, mask, settings: GrpoSettings):
    """The clipped surrogate, minus the entropy bonus, plus the k3 KL penalty, averaged over completion tokens."""
    ratio = torch.exp(log_probs - old_log_probs)
    a = advantages[:, None]
    surrogate = torch.minimum(ratio * a, ratio.clamp(1 - settings.clip, 1 + settings.clip) * a)
    log_ref_ratio = ref_log_probs - log_probs
    kl = torch.exp(log_ref_ratio) - log_ref_ratio - 1
    per_token = -surrogate - settings.entropy_coef * entropy + settings.kl_coef * kl
    return (per_token * mask).sum() / mask.sum()


def grpo_batch(model: TinyLM, settings: GrpoSettings, seed: int):
    """Everything an update needs from the rollout: inputs, targets (prompt positions ignored), mask, advantages."""
    generator = torch.Generator().manual_seed(seed)
    sequences = sample_group(model, settings, generator)
    inputs, targets = sequences[:, :-1], sequences[:, 1:].clone()
    targets[:, : settings.prompt_length - 1] = IGNORE
    mask = (targets != IGNORE).to(torch.get_default_dtype())
    return inputs, targets, mask, advantages_of(sequences, settings)


def updates(model: TinyLM, reference: TinyLM, batch, settings: GrpoSettings, token_stats, steps: int = 2):
    """``steps`` SGD updates of ``model`` on one batch (the PPO epochs: from the second one the ratio moves off 1).
    Returns each step's loss and gradients (a dict of parameter name -> gradient)."""
    inputs, targets, mask, advantages = batch
    with torch.no_grad():
        old, _ = token_stats(model, inputs, targets, settings.temperature)
        ref, _ = token_stats(reference, inputs, targets, settings.temperature)
    history = []
    for _ in range(steps):
        model.zero_grad()
        log_probs, entropy = token_stats(model, inputs, targets, settings.temperature)
        loss = grpo_loss(log_probs, entropy, old, ref, advantages, mask, settings)
        loss.backward()
        history.append((float(loss.detach()), {name: p.grad.clone() for name, p in model.named_parameters()}))
        with torch.no_grad():
            for p in model.parameters():
                p -= settings.learning_rate * p.grad
    return history


def fp64_agreement(vocab: int = 16384, settings: GrpoSettings = GrpoSettings(), seed: int = 0) -> dict[str, float]:
    """Part 1: both heads from the same fp64 weights; the largest relative difference of the losses and of every
    parameter's gradient over two updates, and the losses."""
    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=vocab, d_model=64, n_layers=2, n_heads=4, context=64)
    policy = TinyLM(config).double()
    torch.manual_seed(seed + 1)
    reference = TinyLM(config).double()
    with torch.no_grad():  # a reference near the policy: the KL term is small and not zero
        for p, q in zip(reference.parameters(), policy.parameters(), strict=True):
            p.copy_(q + 0.01 * (p - q))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        batch = grpo_batch(policy, settings, seed)
        chunked = updates(copy.deepcopy(policy), reference, batch, settings,
                          lambda m, i, t, temperature: token_stats_lce(
                              m, i, t, temperature, lce.LinearCrossEntropyOptions(batch_chunk_size=64,
                                                                                  class_chunk_size=4096)))
        materialized = updates(copy.deepcopy(policy), reference, batch, settings, token_stats_materialized)
    finally:
        torch.set_default_dtype(previous)
    loss_difference = max(abs(a - b) / abs(b) for (a, _), (b, _) in zip(chunked, materialized, strict=True))
    grad_difference = max(float((a[name] - b[name]).abs().max() / b[name].abs().max().clamp_min(1e-300))
                          for (_, a), (_, b) in zip(chunked, materialized, strict=True) for name in a)
    return {"loss_rel_diff": loss_difference, "grad_rel_diff": grad_difference,
            "loss_step1": materialized[0][0], "loss_step2": materialized[1][0],
            "completion_tokens": int(batch[2].sum())}


def peak_memory(vocab: int, sequences: int = 16, length: int = 64, seed: int = 0) -> dict[str, float]:
    """Part 2: peak extra bytes of one fp32 update step (forward and backward) at ``vocab`` classes, per head, and
    the seconds it took."""
    from analysis.core.memory import measure_peak

    settings = GrpoSettings(prompts=sequences // 4, group=4, prompt_length=8, new_tokens=length - 8 + 1)
    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=vocab, d_model=128, n_layers=2, n_heads=4, context=length + 1)
    model = TinyLM(config)
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (sequences, length + 1), generator=generator)
    inputs, targets = tokens[:, :-1], tokens[:, 1:].clone()
    targets[:, : settings.prompt_length - 1] = IGNORE
    mask = (targets != IGNORE).float()
    advantages = torch.randn(sequences, generator=generator, dtype=torch.float32)
    out = {"tokens": sequences * length}
    for name, token_stats in (("lce", token_stats_lce), ("materialized", token_stats_materialized)):
        with torch.no_grad():
            old, _ = token_stats(model, inputs, targets, settings.temperature)

        def step(token_stats=token_stats, old=old) -> None:
            model.zero_grad(set_to_none=True)
            log_probs, entropy = token_stats(model, inputs, targets, settings.temperature)
            grpo_loss(log_probs, entropy, old, old, advantages, mask, settings).backward()

        step()  # gradients exist before the measured step, as in training
        started = time.perf_counter()
        _, measured = measure_peak(step)
        out[f"{name}_peak_bytes"] = measured.peak_bytes
        out[f"{name}_seconds"] = time.perf_counter() - started
    out["logits_bytes"] = sequences * length * vocab * 4
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151936, help="classes for the memory part (default: Qwen's)")
    parser.add_argument("--parity-vocab", type=int, default=16384, help="classes for the fp64 part")
    parser.add_argument("--csv", default=None, help="also append the numbers, with provenance, to this CSV")
    args = parser.parse_args()
    agreement = fp64_agreement(args.parity_vocab)
    print(f"fp64, vocabulary {args.parity_vocab}, {agreement['completion_tokens']} completion tokens, two updates: "
          f"losses {agreement['loss_step1']:.6f} and {agreement['loss_step2']:.6f}; lce against materialized logits: "
          f"loss {agreement['loss_rel_diff']:.1e}, gradients {agreement['grad_rel_diff']:.1e} (largest relative "
          "difference)")
    memory = peak_memory(args.vocab)
    lce_mib, materialized_mib = memory["lce_peak_bytes"] / 2**20, memory["materialized_peak_bytes"] / 2**20
    print(f"fp32 update step, vocabulary {args.vocab}, {memory['tokens']} tokens: peak extra memory lce "
          f"{lce_mib:.0f} MiB, materialized logits {materialized_mib:.0f} MiB ({materialized_mib / lce_mib:.1f}x; one "
          f"fp32 copy of the logits is {memory['logits_bytes'] / 2**20:.0f} MiB)")
    if args.csv:
        from pathlib import Path

        from analysis.core.provenance import provenance
        from analysis.core.results_io import RL_EXAMPLE, append_rows

        append_rows(Path(args.csv), [RL_EXAMPLE.row(parity_vocab=args.parity_vocab, vocab=args.vocab, **agreement,
                                                    **memory, **provenance("cpu"))])


if __name__ == "__main__":
    main()
