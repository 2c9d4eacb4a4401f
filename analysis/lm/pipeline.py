"""The whole ``trained`` family: corpus -> tokenizer -> token streams -> training -> head dumps.

Every stage caches its product in the cache folder (tokenizer JSON, token streams, checkpoints),
keyed by what it was made from, so a rerun only does what is missing and an interrupted training
run continues from its last checkpoint.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
from dataclasses import dataclass, replace
from pathlib import Path

import numpy
import torch

from analysis.core.head_dumps import MAKE_COMMAND, save_head_dump
from analysis.core.provenance import cpu_model, git_revision
from analysis.lm.corpus import HELDOUT_FRACTION, Corpus, load_corpus
from analysis.lm.dumps import DUMP_ROWS, DUMP_WINDOWS, compute_head_dump
from analysis.lm.model import ModelConfig
from analysis.lm.tokenizer import encode_files, load_or_train_tokenizer
from analysis.lm.train import TrainConfig, load_snapshot, train
from analysis.paths import LM_CACHE_DIR, LM_DATA_DIR, display_path

__all__ = ["DEFAULT_STEPS", "DEFAULT_VOCAB", "EARLY_FRACTION", "PipelineResult", "token_streams", "unigram_entropy",
           "run_pipeline"]

DEFAULT_STEPS = 800
"""Training steps of the committed run: about 10 minutes with one thread on one core of this
2-core machine while another process keeps the other core busy (the measured time is the
``train_wall_s`` of ``analysis/data/lm/head-final.json``)."""
DEFAULT_VOCAB = 16384
EARLY_FRACTION = 0.08
"""The "early" dump is taken after this share of the steps (just past the warm-up)."""


@dataclass(frozen=True)
class PipelineResult:
    """What a pipeline run wrote: the dump files per checkpoint name and the training result."""

    dumps: dict[str, tuple[Path, Path]]
    train_wall_s: float
    heldout_losses: dict[str, float]
    unigram_entropy: float
    run_dir: Path


def token_streams(corpus: Corpus, tokenizer, tokenizer_path: Path, cache: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The (train, held-out) int64 token streams of ``corpus``, cached beside the tokenizer."""
    path = cache / f"tokens-{tokenizer_path.stem}-{corpus.sha256[:16]}.pt"
    if path.exists():
        saved = torch.load(path, weights_only=True)
        return saved["train"], saved["heldout"]
    streams = {"train": encode_files(tokenizer, [f.text for f in corpus.train_files]),
               "heldout": encode_files(tokenizer, [f.text for f in corpus.heldout_files])}
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # processes building it at once do not collide
    torch.save(streams, partial)
    os.replace(partial, path)
    return streams["train"], streams["heldout"]


def unigram_entropy(tokens: torch.Tensor, vocab_size: int) -> float:
    """Entropy (nats) of the token frequencies of ``tokens``: the loss of the best context-free model."""
    counts = torch.bincount(tokens, minlength=vocab_size).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


def _run_key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode("utf-8")).hexdigest()[:12]


def run_pipeline(*, steps: int = DEFAULT_STEPS, seed: int = 0, out: Path | str = LM_DATA_DIR,
                 cache: Path | str = LM_CACHE_DIR, corpus_root: Path | str | None = None,
                 heldout_fraction: float = HELDOUT_FRACTION,
                 vocab_size: int = DEFAULT_VOCAB, model: ModelConfig | None = None,
                 train_config: TrainConfig | None = None, rows: int = DUMP_ROWS, windows: int = DUMP_WINDOWS,
                 progress: bool = True, stop_after: int | None = None) -> PipelineResult:
    """Run every stage and write ``head-early`` and ``head-final`` dumps into ``out``.

    ``corpus_root`` (default: the standard library) and ``heldout_fraction`` choose the text;
    ``model`` gives the sizes (its ``vocab_size`` is replaced by ``vocab_size``; default: D=128,
    4 layers, 4 heads, context 128); ``train_config`` the optimisation (its ``steps``, ``seed`` and
    ``snapshot_steps`` are replaced by ``steps``, ``seed`` and the early step). ``stop_after`` ends
    training early, as an interruption would, and then writes no dumps.
    """
    cache, out = Path(cache), Path(out)
    cache.mkdir(parents=True, exist_ok=True)
    corpus = load_corpus(corpus_root, heldout_fraction)
    tokenizer, tokenizer_path = load_or_train_tokenizer([f.text for f in corpus.train_files], vocab_size, cache)
    train_tokens, heldout_tokens = token_streams(corpus, tokenizer, tokenizer_path, cache)
    model_config = replace(model or ModelConfig(vocab_size), vocab_size=vocab_size)
    early = max(1, round(EARLY_FRACTION * steps))
    config = replace(train_config or TrainConfig(steps=steps), steps=steps, seed=seed,
                     snapshot_steps=(early,) if early < steps else ())
    run_dir = cache / f"run-{_run_key(corpus.sha256, tokenizer_path.name, model_config.as_dict(), config.as_dict())}"
    result = train(model_config, config, train_tokens, heldout_tokens, run_dir, progress=progress,
                   stop_after=stop_after)
    entropy = unigram_entropy(train_tokens, vocab_size)
    if result.step < steps:
        return PipelineResult({}, result.elapsed_s, {}, entropy, run_dir)
    provenance = {
        **corpus.provenance(), "tokenizer_vocab_size": vocab_size, "tokenizer_file": tokenizer_path.name,
        "train_tokens": train_tokens.numel(), "heldout_tokens": heldout_tokens.numel(),
        "unigram_entropy": entropy, "model_config": model_config.as_dict(), "train_config": config.as_dict(),
        "train_seed": seed, "train_steps": steps, "train_wall_s": result.elapsed_s,
        "num_threads": torch.get_num_threads(), "cpu_model": cpu_model(), "torch_version": torch.__version__,
        "numpy_version": numpy.__version__, "platform": platform.platform(),
        "git_revision": git_revision(), "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": MAKE_COMMAND + ("" if steps == DEFAULT_STEPS else f" --steps {steps}")
                   + ("" if seed == 0 else f" --seed {seed}") + f" --threads {torch.get_num_threads()}",
    }
    dumps, losses = {}, {}
    for name, step in (("early", early), ("final", steps)):
        if name == "early" and early >= steps:
            continue
        dump = compute_head_dump(load_snapshot(result.snapshots[step]), heldout_tokens, rows, windows)
        dump = replace(dump, meta={**provenance, **dump.meta, "checkpoint": name, "step": step})
        losses[name] = dump.meta["heldout_loss"]
        dumps[name] = save_head_dump(dump, name, out)
    return PipelineResult(dumps, result.elapsed_s, losses, entropy, run_dir)


# ---- python -m analysis lm -----------------------------------------------------------------------------------

DESCRIPTION = ("Corpus (this Python's standard library source) -> byte-level BPE tokenizer -> a small transformer "
               "trained on one core (about 10 minutes; resumes from its last checkpoint in analysis/cache/lm) -> "
               "head dumps of the early and final checkpoints on held-out text (analysis/data/lm; load them with "
               "analysis.core.head_dumps.load_head_dump).")


def add_arguments(parser) -> None:
    from analysis.core.arguments import progress_option
    from analysis.paths import LM_CACHE_DIR, LM_DATA_DIR

    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="N",
                        help=f"training steps (default: {DEFAULT_STEPS})")
    parser.add_argument("--seed", type=int, default=0, help="training seed (default: 0)")
    parser.add_argument("--out", type=Path, default=LM_DATA_DIR,
                        help=f"dump folder (default: {display_path(LM_DATA_DIR)})")
    parser.add_argument("--cache", type=Path, default=LM_CACHE_DIR,
                        help=f"tokenizer, tokens and checkpoints (default: {display_path(LM_CACHE_DIR)})")
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads; the result is bitwise reproducible for a fixed count (default: 1, "
                             "which the committed dumps used: with 2, a second busy process on a 2-core machine "
                             "made each step 4x slower, with 1 it cost nothing)")
    progress_option(parser)


def run(args) -> None:
    import time

    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    result = run_pipeline(steps=args.steps, seed=args.seed, out=args.out, cache=args.cache,
                          progress=not args.no_progress)
    for name, paths in result.dumps.items():
        print(f"{name}: held-out loss {result.heldout_losses[name]:.3f} nats -> "
              + ", ".join(f"{display_path(path)} ({path.stat().st_size / 2**20:.1f} MiB)" for path in paths))
    print(f"unigram entropy of the training tokens: {result.unigram_entropy:.3f} nats")
    print(f"lm: {time.perf_counter() - started:.0f} s in all (training {result.train_wall_s:.0f} s over all "
          f"sessions, {torch.get_num_threads()} thread(s); checkpoints in {display_path(result.run_dir)})")
