"""Train a tiny Hugging Face Llama on the repo's corpus twice, its loss through lce and through transformers.

    python examples/hf_finetune.py [--steps 300] [--dtype float32] [--csv curves.csv]

The corpus is the one behind the ``trained`` input family (analysis/lm: Python's standard library source), a
slice of its files, tokenized by a byte-level BPE with ``--vocab`` tokens (trained once, cached in
analysis/cache/lm). Two copies of one random-init ``LlamaForCausalLM`` see the same batches in the same order:
one patched with ``lce.integrations.transformers.patch`` (one line), one as transformers ships it. The
parameters are fp32; with ``--dtype bfloat16`` each step runs under bf16 autocast, as the ``Trainer``'s
``bf16=True`` does (on a CPU without native bf16 GEMMs that is the slower setting). Every ``--every`` steps both
models' training loss and held-out loss are printed side by side. The two heads round differently (lce sums in
another order, and in bf16 it does not round the logits), so the curves agree closely for the first steps and
then drift apart, as any two runs that round differently do; the end says until when they agreed to 1e-4 nats,
how far apart they ever were, and both final held-out losses. About 6 minutes on 2 shared CPU cores with the
defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import math
import time
from pathlib import Path

import torch
import transformers

from analysis.lm.corpus import is_heldout, load_corpus
from analysis.lm.tokenizer import encode_files, load_or_train_tokenizer
from analysis.paths import LM_CACHE_DIR
from lce.integrations.transformers import patch


def token_streams(vocab: int, corpus_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Train and held-out token streams: the corpus's files in path order, the training side's up to
    ``corpus_bytes`` and the held-out side's (the corpus's own split, by path) up to a sixteenth of that."""
    corpus = load_corpus()
    sides: dict[bool, list[str]] = {False: [], True: []}
    limits, taken = {False: corpus_bytes, True: corpus_bytes // 16}, {False: 0, True: 0}
    for file in corpus.files:
        side = is_heldout(file.path, corpus.heldout_fraction)
        if taken[side] < limits[side]:
            sides[side].append(file.text)
            taken[side] += len(file.text)
    tokenizer, _ = load_or_train_tokenizer(sides[False], vocab, LM_CACHE_DIR)
    return encode_files(tokenizer, sides[False]), encode_files(tokenizer, sides[True])


def windows(tokens: torch.Tensor, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, tokens.numel() - length, (batch,), generator=generator)
    return torch.stack([tokens[start:start + length] for start in starts.tolist()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=25, help="print (and record) the losses every N steps")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--corpus-mb", type=float, default=4.0, help="megabytes of the corpus to use")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="float32: no autocast; bfloat16: the fp32 parameters under bf16 autocast")
    parser.add_argument("--csv", type=Path, default=None, help="write step, split, lce and transformers losses")
    args = parser.parse_args()

    started = time.perf_counter()
    train_tokens, heldout_tokens = token_streams(args.vocab, int(args.corpus_mb * 2**20))
    print(f"corpus: {train_tokens.numel():,} training and {heldout_tokens.numel():,} held-out tokens, "
          f"vocabulary {args.vocab} ({time.perf_counter() - started:.0f} s)")

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=128, intermediate_size=344,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=args.length, tie_word_embeddings=False)
    reference = transformers.LlamaForCausalLM(config).train()
    patched = patch(copy.deepcopy(reference))  # the one line: the loss now runs through lce
    models = {"lce": patched, "transformers": reference}
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
                  for name, model in models.items()}
    warmup = max(1, args.steps // 10)

    def autocast():
        if args.dtype == "bfloat16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    g_train, g_heldout = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    heldout = windows(heldout_tokens, 4 * args.batch, args.length, g_heldout)
    rows, gap, agreed = [], 0.0, 0
    print(f"{'step':>6} {'split':>8} {'lce':>9} {'transformers':>13} {'difference':>11}")
    for step in range(1, args.steps + 1):
        batch = windows(train_tokens, args.batch, args.length, g_train)
        scale = min(1.0, step / warmup) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        losses = {}
        for name, model in models.items():
            for group in optimizers[name].param_groups:
                group["lr"] = 3e-3 * scale
            with autocast():
                loss = model(batch, labels=batch).loss
            loss.backward()
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)
            losses[name] = loss.item()
        if step % args.every and step != args.steps:
            continue
        with torch.no_grad(), autocast():
            held = {name: model(heldout, labels=heldout).loss.item() for name, model in models.items()}
        if gap <= 1e-4 and max(abs(losses["lce"] - losses["transformers"]), abs(held["lce"] - held["transformers"])) \
                <= 1e-4:
            agreed = step
        for split, values in (("train", losses), ("heldout", held)):
            difference = values["lce"] - values["transformers"]
            gap = max(gap, abs(difference))
            rows.append(dict(step=step, split=split, **values))
            print(f"{step:>6} {split:>8} {values['lce']:>9.4f} {values['transformers']:>13.4f} {difference:>+11.1e}")
    print(f"the curves agreed to 1e-4 nats up to step {agreed}; largest difference {gap:.1e} nats over "
          f"{args.steps} steps; final held-out loss: lce {held['lce']:.4f}, transformers {held['transformers']:.4f} "
          f"({args.dtype}, {time.perf_counter() - started:.0f} s)")
    if args.csv:
        with open(args.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=["step", "split", "lce", "transformers"])
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
