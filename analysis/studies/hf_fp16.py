"""Training a Hugging Face causal LM in fp16 with a loss scale, patched by ``lce.integrations.transformers`` or not
(issue 31): does a ``GradScaler`` train lce's head as it trains the unpatched one?

The model (:data:`SETTING`): a small Llama (fp32 parameters) trained from one seed with AdamW under
``torch.autocast("cpu", dtype=torch.float16)`` and ``torch.amp.GradScaler`` at its defaults (initial scale 2^16,
halved on an overflow, doubled after 2000 clean steps), what the ``Trainer``'s ``fp16=True`` does. The data: token
sequences from a seeded bigram chain whose next-token distributions share a Zipfian prior over the vocabulary
(most tokens rare, as in text), the held-out sequences from the same chain. Arms (:data:`ARMS`):

* ``fp32``: no autocast, no scaler (the reference every gap is measured against);
* ``unpatched``: the model as it is under fp16 autocast (the head's logits an fp16 GEMM, the loss in fp32);
* ``lce``: ``patch(model)`` (lce's defaults; the integration returns the loss in fp32 for an fp16 head, so the
  scale reaches backward whole), on the CPU layouts;
* ``lce cuda-layouts``: the same with the CUDA layouts emulated (fp16's CUDA auto: compact, its running fp16
  sum kept near fp16's top by :mod:`lce.passes.headroom`);
* ``lce cuda-layouts before``: that arm with lce's arithmetic before the headroom
  (:func:`lce.testing.without_headroom`).

Every arm of a seed starts from the same weights and sees the same batches. Rows (kind ``hf_fp16``): per arm,
seed and evaluated step, the mean training loss since the last evaluation, the held-out loss (fp32, no
autocast), the scaler's scale and the steps it skipped so far.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pandas as pd
import torch

__all__ = ["Setting", "SETTING", "QUICK", "ARMS", "HF_FP16_FILE", "bigram_chain", "train_arm", "record"]


@dataclasses.dataclass(frozen=True)
class Setting:
    """The model, the data and the run: a Llama trunk of ``hidden`` features and ``layers`` layers over ``vocab``
    tokens, ``batch`` sequences of ``seq_len`` tokens per step, ``steps`` AdamW steps at ``lr``, evaluated every
    ``every`` steps on ``heldout`` sequences."""

    hidden: int = 64
    layers: int = 2
    vocab: int = 4096
    batch: int = 8
    seq_len: int = 64
    steps: int = 300
    every: int = 50
    lr: float = 3e-3
    heldout: int = 64
    zipf: float = 1.1


SETTING = Setting()
QUICK = Setting(hidden=32, layers=1, vocab=512, batch=4, seq_len=32, steps=12, every=6, heldout=8)
"""A run of seconds (the tests)."""
ARMS: tuple[str, ...] = ("fp32", "unpatched", "lce", "lce cuda-layouts", "lce cuda-layouts before")
HF_FP16_FILE = "hf_fp16.csv"
SEEDS: tuple[int, ...] = (0, 1, 2)


def bigram_chain(setting: Setting, seed: int) -> torch.Tensor:
    """A (vocab, vocab) row-stochastic matrix: each token's next-token distribution is the Zipfian prior times a
    seeded log-normal factor per pair, renormalised, so some pairs are likely and most tokens rare."""
    g = torch.Generator().manual_seed(10_000 + seed)
    prior = torch.arange(1, setting.vocab + 1, dtype=torch.float64) ** -setting.zipf
    factor = torch.exp(2.0 * torch.randn(setting.vocab, setting.vocab, generator=g, dtype=torch.float64))
    chain = prior * factor
    return chain / chain.sum(1, keepdim=True)


def sample(chain: torch.Tensor, count: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` sequences of ``seq_len`` tokens from ``chain``, the first token from its stationary-ish prior."""
    tokens = torch.empty(count, seq_len, dtype=torch.int64)
    tokens[:, 0] = torch.multinomial(chain.mean(0), count, replacement=True, generator=generator)
    for t in range(1, seq_len):
        tokens[:, t] = torch.multinomial(chain[tokens[:, t - 1]], 1, generator=generator).squeeze(1)
    return tokens


def build_model(setting: Setting, seed: int):
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=setting.vocab, hidden_size=setting.hidden,
                                      intermediate_size=4 * setting.hidden, num_hidden_layers=setting.layers,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=setting.seq_len, tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(config).train()


@contextlib.contextmanager
def _arm_context(arm: str) -> Iterator[None]:
    from lce.testing import emulate_device_kind, without_headroom

    with contextlib.ExitStack() as stack:
        if "cuda-layouts" in arm:
            stack.enter_context(emulate_device_kind("cuda"))
        if arm.endswith("before"):
            stack.enter_context(without_headroom())
        yield


def train_arm(arm: str, setting: Setting, seed: int) -> list[dict]:
    """One arm's run at one seed: its rows at every evaluation (see the module docstring)."""
    from lce.integrations.transformers import patch

    if arm not in ARMS:
        raise ValueError(f"arm must be one of {ARMS}, got {arm!r}")
    model = build_model(setting, seed)
    if arm.startswith("lce"):
        patch(model, logits="never")  # its held-out loss runs in eval mode: no logits wanted there
    chain = bigram_chain(setting, seed)
    heldout = sample(chain, setting.heldout, setting.seq_len, torch.Generator().manual_seed(20_000 + seed))
    batches = torch.Generator().manual_seed(30_000 + seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=setting.lr)
    half = arm != "fp32"
    scaler = torch.amp.GradScaler("cpu", enabled=half)
    rows, losses, skipped = [], [], 0
    with _arm_context(arm):
        for step in range(1, setting.steps + 1):
            ids = sample(chain, setting.batch, setting.seq_len, batches)
            with torch.autocast("cpu", dtype=torch.float16, enabled=half):
                loss = model(input_ids=ids, labels=ids).loss
            optimizer.zero_grad(set_to_none=True)
            scale_before = scaler.get_scale() if half else 1.0
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            if half and scaler.get_scale() < scale_before:
                skipped += 1
            losses.append(float(loss.detach()))
            if step % setting.every == 0 or step == setting.steps:
                with torch.no_grad():
                    model.eval()
                    held = float(model(input_ids=heldout, labels=heldout).loss)
                    model.train()
                rows.append({"arm": arm, "seed": seed, "step": step,
                             "train_loss": sum(losses) / len(losses), "heldout_loss": held,
                             "loss_scale": scaler.get_scale() if half else 1.0, "skipped_steps": skipped,
                             "finite": bool(torch.isfinite(torch.tensor(losses)).all())})
                losses = []
    return rows


def _done(path: Path) -> set[tuple[str, int]]:
    from analysis.core.results_io import read_table

    if not path.exists():
        return set()
    table = read_table(path)
    return {(r.arm, int(r.seed)) for r in table.itertuples()}


def record(folder: Path, file_name: str = HF_FP16_FILE, *, setting: Setting = SETTING,
           arms: Sequence[str] = ARMS, seeds: Sequence[int] = SEEDS, progress: bool = True) -> tuple[Path, float]:
    """Train every (arm, seed) not yet in ``folder/<file_name>`` and append its rows with the setting and provenance
    as each run finishes (resumable). Returns the path and the wall time in seconds."""
    from tqdm import tqdm

    from analysis.core.provenance import provenance
    from analysis.core.results_io import HF_FP16, append_rows

    path = folder / file_name
    done = _done(path)
    pending = [(arm, seed) for seed in seeds for arm in arms if (arm, seed) not in done]
    started = time.perf_counter()
    for arm, seed in tqdm(pending, desc="hf-fp16", disable=not progress, dynamic_ncols=True):
        wall = time.perf_counter()
        rows = pd.DataFrame(train_arm(arm, setting, seed))
        rows = rows.assign(wall_s=time.perf_counter() - wall, **dataclasses.asdict(setting), **provenance("cpu"))
        append_rows(path, HF_FP16.rows(rows))
    return path, time.perf_counter() - started


# ---- python -m analysis hf-fp16 ------------------------------------------------------------------------------

DESCRIPTION = ("a small transformers Llama trained under fp16 autocast with a GradScaler, unpatched and patched by "
               "lce (CPU and emulated CUDA layouts, before and after lce.passes.headroom), 3 seeds; appends "
               "hf_fp16.csv run "
               "by run and resumes. About 15 CPU-minutes where fp16 GEMMs are native, far longer where emulated.")


def add_arguments(parser) -> None:
    from analysis.core.arguments import progress_option, results_option

    parser.add_argument("--quick", action="store_true", help="a run of seconds (hf_fp16_quick.csv)")
    results_option(parser)
    progress_option(parser)


def run(args) -> None:
    from analysis.core.arguments import print_study

    if args.quick:
        print_study(*record(args.results, "hf_fp16_quick.csv", setting=QUICK, seeds=(0,),
                            progress=not args.no_progress))
        return
    print_study(*record(args.results, progress=not args.no_progress))
