"""Does a head policy change training? The small language model trained with its head loss under each arm.

Every *arm* (:data:`ARMS`) trains :class:`~analysis.lm.model.TinyLM` from the same initialisation on
the same batches (both follow the seed, :mod:`analysis.lm.train`); only the head's loss differs:

* ``fp32`` -- the unfused fp32 head, the baseline every gap is measured against;
* ``bf16 unfused`` -- ``cross_entropy(hidden @ W.T)`` with hidden states and weight rounded to bf16;
* ``<dtype> <policy>`` -- lce with that ``acc_policy`` and ``acc_dtype=float32`` (what "auto" resolves to;
  an explicit policy would otherwise keep the input dtype) on hidden states and weight rounded to bf16
  or fp16 (fp16 with a dynamic loss scale), chunked with ``aspect_ratio:2``: at the study's 2048 rows,
  D=128 and C=16384 that is 256 chunks of 8 rows, the chunk count of LLM heads (64-256) and where
  compact's once-per-chunk rounding of the weight gradient is largest. The ``long`` setting's arms
  (:func:`chunked_arms`) instead fix the chunk count itself, 256 chunks of ``rows:K`` at its batch rows.

The body of the model stays fp32 and its master weights too (the rounding happens in the head
op, as under autocast). lce runs its **CUDA** layouts: on a CPU they are emulated
(:func:`lce.testing.emulate_device_kind`; exact products, fp32 sums), on a GPU they are the real
cuBLAS kernels. The CUDA table is where torch's claim that compact matches balanced was made
(on the CPU table compact with an fp32 ``acc_dtype`` runs balanced's arithmetic).

Each run writes ``log.csv`` in its folder under ``cache/``; :func:`collect` turns the logs into
tidy rows (arm, dtype, policy, seed, step, split, loss) for a ``training`` results file: split ``train``,
``heldout`` and, where the log has them, ``heldout:frequent``, ``heldout:middle`` and ``heldout:rare`` (the
held-out positions whose next token is in that target-frequency bucket, :mod:`analysis.core.buckets`; the
buckets' edges are in ``buckets.json`` beside the runs, :func:`bucket_edges_of`). Runs are resumable (the
trainer's checkpoints), so an interrupted study continues where it stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

import lce
import lce.planning.cpu_gemms
from analysis.core.buckets import BUCKETS, bucket_edges
from analysis.core.emulated_gemms import low_precision_linear
from analysis.core.implementations import ROWS_PREFIX, ImplSpec
from analysis.core.problem import DTYPES
from analysis.core.results_io import results_stem
from analysis.lm.model import ModelConfig
from analysis.lm.train import BUCKET_COLUMNS, HeadLoss, TrainConfig, fp32_head_loss, train
from analysis.paths import LM_CACHE_DIR
from lce.planning.options import EXPLICIT_POLICIES
from lce.testing import emulate_device_kind

__all__ = ["Arm", "ARMS", "Setting", "SETTINGS", "head_loss_of", "run_arm", "collect", "run_study",
           "STUDY_CHUNKING", "chunked_arms", "arm_options", "BUCKET_SPLITS", "bucket_rows", "write_bucket_edges",
           "bucket_edges_of"]

STUDY_CHUNKING = "aspect_ratio:2"
"""The chunking of every lce arm: torch 2.13's CUDA default, and lce's since notebook 05."""


@dataclasses.dataclass(frozen=True)
class Arm:
    """One way of computing the head's loss: ``op`` "unfused" or "lce", in ``dtype``, with ``policy`` and
    ``chunking`` (lce: a ``chunking_method`` such as ``aspect_ratio:2``, or ``rows:K`` for chunks of K rows)."""

    name: str
    dtype: str
    op: str
    policy: str = ""
    chunking: str = ""
    restated: bool = False
    """lce arms only: run lce's CUDA-layout arithmetic restated in whole-batch ops
    (:func:`analysis.studies.head_arithmetic.restated_loss`, checked against lce in the tests) instead of lce's
    emulated layouts, whose 256 chunks cost about 2.4 s per step on the CPU."""

    def __post_init__(self) -> None:
        if (self.op == "lce") != bool(self.chunking):
            raise ValueError(f"Arm {self.name!r}: an lce arm needs a chunking and an unfused one none, got op="
                             f"{self.op!r} chunking={self.chunking!r}")

    @property
    def loss_scaling(self) -> bool:
        """fp16 heads train with a dynamic loss scale; bf16 and fp32 need none."""
        return self.dtype == "float16"

    @property
    def slug(self) -> str:
        """The arm's name as a folder name."""
        return self.name.replace(" ", "-")


ARMS: tuple[Arm, ...] = (
    Arm("fp32", "float32", "unfused"),
    Arm("bf16 unfused", "bfloat16", "unfused"),
    *(Arm(f"bf16 {policy}", "bfloat16", "lce", policy, STUDY_CHUNKING) for policy in EXPLICIT_POLICIES),
    *(Arm(f"fp16 {policy}", "float16", "lce", policy, STUDY_CHUNKING) for policy in EXPLICIT_POLICIES),
)
ARM_NAMES: dict[str, Arm] = {arm.name: arm for arm in ARMS}

CONTEXT: int = ModelConfig.context
"""Tokens per window (the model's default context): a step's batch is ``batch_size * CONTEXT`` head rows."""


def chunked_arms(names: Sequence[str], batch_rows: int, chunks: int) -> tuple[Arm, ...]:
    """The arms of :data:`ARMS` called ``names``, their lce ones cut into exactly ``chunks`` chunks of
    ``rows:K`` (``K = batch_rows / chunks``, which must divide evenly) instead of :data:`STUDY_CHUNKING`."""
    if batch_rows % chunks:
        raise ValueError(f"batch_rows={batch_rows} must be a multiple of chunks={chunks} for equal chunks")
    return tuple(dataclasses.replace(ARM_NAMES[name], chunking=f"{ROWS_PREFIX}{batch_rows // chunks}", restated=True)
                 if ARM_NAMES[name].op == "lce" else ARM_NAMES[name] for name in names)


@dataclasses.dataclass(frozen=True)
class Setting:
    """How long and how large the study's runs are; ``model`` sizes the model (vocab from the tokenizer)."""

    name: str
    steps: int
    batch_size: int
    seeds: tuple[int, ...]
    eval_every: int
    eval_windows: int = 16
    snapshot_steps: tuple[int, ...] = ()
    arms: tuple[Arm, ...] = ARMS

    @property
    def batch_rows(self) -> int:
        """Head rows per step: ``batch_size`` windows of :data:`CONTEXT` tokens."""
        return self.batch_size * CONTEXT

    def arm(self, name: str) -> Arm:
        """This setting's arm called ``name`` (its chunking may differ from :data:`ARMS`')."""
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise ValueError(f"setting {self.name!r} has no arm {name!r}; it has {[arm.name for arm in self.arms]}")

    def train_config(self, seed: int) -> TrainConfig:
        return TrainConfig(steps=self.steps, batch_size=self.batch_size, seed=seed, eval_every=self.eval_every,
                           eval_windows=self.eval_windows, checkpoint_every=self.eval_every,
                           snapshot_steps=self.snapshot_steps)


LONG_CHUNKS = 256
"""The long setting's chunk count: the top of LLM heads' 64-256, where compact's rounding is largest."""
LONG_BATCH = 4
"""The long setting's windows per step (512 rows, 2 per chunk): the cheapest batch measured, not one that fits
the hour hoped for. Seconds per step with 1 thread (this machine's Xeon; the process's CPU time equalled its
wall time) at 4 and 16 windows: fp32 0.24 and 0.88, bf16 balanced 2.4 and 2.3, bf16 compact 2.5 and 3.0; an
evaluation about 1 s. The lce arms cost about the same at any batch because the emulated CUDA layouts work on
the whole (C, D) = (16384, 128) weight gradient once per chunk, and there are 256 chunks whatever the rows. So
3000 steps of the three arms take about 4.4 h on one core at 4 windows (5.2 h at 16), not 1 h."""

SETTINGS: dict[str, Setting] = {
    # a smoke run of every arm (CI's tests run part of it): 2 seeds, a few steps of 4 windows (512 rows), lce in 8
    # chunks of 64 rows: at the full setting's aspect_ratio:2 these 512 rows would be 256 chunks, each of which
    # touches the whole (C, D) weight gradient on the emulated CUDA layouts (about 2.4 s a step on one core)
    "quick": Setting("quick", steps=10, batch_size=4, seeds=(0, 1), eval_every=5, eval_windows=4,
                     arms=tuple(dataclasses.replace(arm, chunking=f"{ROWS_PREFIX}64") if arm.op == "lce" else arm
                                for arm in ARMS)),
    # the committed study: 16 windows of 128 tokens (2048 rows) per step, 3 seeds
    "full": Setting("full", steps=300, batch_size=16, seeds=(0, 1, 2), eval_every=50,
                    snapshot_steps=(25, 100, 300)),
    # 10x the full run's length, with the per-bucket held-out losses (issue 22): fp32 and the two policies torch's
    # claim is about, at exactly 256 chunks whatever the batch; one seed, as each run takes hours (LONG_BATCH)
    "long": Setting("long", steps=3000, batch_size=LONG_BATCH, seeds=(0,), eval_every=100,
                    arms=chunked_arms(("fp32", "bf16 balanced", "bf16 compact"), LONG_BATCH * CONTEXT, LONG_CHUNKS)),
}


def head_loss_of(arm: Arm) -> HeadLoss:
    """The ``(hidden, weight, targets) -> mean loss`` function of ``arm`` (a named function: the trainer keys
    its checkpoints on the name)."""
    if arm.op == "unfused" and arm.dtype == "float32":
        return fp32_head_loss
    dtype = DTYPES[arm.dtype]
    if arm.op == "unfused":
        def unfused_head_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            # F.linear, or its arithmetic on fp32 copies where this CPU emulates the dtype's GEMMs
            return F.cross_entropy(low_precision_linear(hidden.to(dtype), weight.to(dtype)), targets)

        unfused_head_loss.__qualname__ = f"unfused_head_loss[{arm.dtype}]"
        return unfused_head_loss
    if arm.restated:
        return _restated_head_loss(arm, dtype)
    options = arm_options(arm)

    def lce_head_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with _cuda_layouts(hidden.device):
            return lce.linear_cross_entropy(hidden.to(dtype), weight.to(dtype), targets, options=options)

    lce_head_loss.__qualname__ = f"lce_head_loss[{arm.dtype},{arm.policy},{arm.chunking},acc=float32]"
    return lce_head_loss


def _restated_head_loss(arm: Arm, dtype: torch.dtype) -> HeadLoss:
    from analysis.studies.head_arithmetic import restated_loss

    if not arm.chunking.startswith(ROWS_PREFIX):
        raise ValueError(f"arm {arm.name!r}: the restated arithmetic needs rows:K chunks, got {arm.chunking!r}")
    rows = int(arm.chunking.removeprefix(ROWS_PREFIX))

    def restated_head_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return restated_loss(hidden, weight, targets, dtype, arm.policy, -(-hidden.shape[0] // rows))

    restated_head_loss.__qualname__ = f"restated_head_loss[{arm.dtype},{arm.policy},{arm.chunking},acc=float32]"
    return restated_head_loss


def arm_options(arm: Arm) -> lce.LinearCrossEntropyOptions:
    """lce's options of an lce ``arm``: its policy and chunking (``rows:K`` = ``batch_chunk_size=K``)."""
    if arm.op != "lce":
        raise ValueError(f"arm {arm.name!r} is {arm.op}, not lce: it has no lce options")
    # an explicit policy keeps acc_dtype = input dtype unless told (the options contract): fp32, as "auto" resolves
    return ImplSpec("lce", arm.policy, arm.chunking, "float32").options()


def _cuda_layouts(device: torch.device) -> contextlib.AbstractContextManager:
    """lce's CUDA layouts: real on a GPU, emulated on CPU tensors."""
    return contextlib.nullcontext() if device.type == "cuda" else emulate_device_kind("cuda")


def run_arm(arm: Arm, seed: int, setting: Setting, streams: tuple[torch.Tensor, torch.Tensor],
            model_config: ModelConfig, cache: Path, *, device: str = "cpu", progress: bool = False,
            stop_after: int | None = None) -> Path:
    """Train (or resume) one run; returns its folder (``cache/<setting>/<device>/<arm>/seed-<seed>``)."""
    if model_config.context != CONTEXT:
        raise ValueError(f"the study's settings count rows with context {CONTEXT}, got {model_config.context}")
    run_dir = cache / setting.name / device / arm.slug / f"seed-{seed}"
    train(model_config, setting.train_config(seed), *streams, run_dir, head_loss=head_loss_of(arm),
          progress=progress, stop_after=stop_after, loss_scaling=arm.loss_scaling, device=device)
    return run_dir


def runs(arms: Sequence[Arm], setting: Setting) -> Iterator[tuple[Arm, int]]:
    """The study's runs in the order they are trained: seed-major, so a partial study has whole seeds."""
    for seed in setting.seeds:
        for arm in arms:
            yield arm, seed


def _logs(cache: Path, setting: Setting, device: str) -> Iterator[tuple[Arm, int, Path]]:
    """``(arm, seed, log path)`` of every run of ``setting`` on ``device`` in ``cache``, in the setting's arm and
    seed order, whichever call trained it (a study can be trained in parts: some arms or seeds at a time)."""
    for arm in setting.arms:
        folder = cache / setting.name / device / arm.slug
        seeds = sorted(int(path.name.removeprefix("seed-")) for path in folder.glob("seed-*"))
        for seed in seeds:
            if (folder / f"seed-{seed}" / "log.csv").exists():
                yield arm, seed, folder / f"seed-{seed}" / "log.csv"


BUCKET_SPLITS: tuple[str, ...] = tuple(f"heldout:{bucket}" for bucket in BUCKETS)
"""The per-bucket held-out splits of :func:`collect`'s rows: ``heldout:frequent``, ``heldout:middle``,
``heldout:rare``."""
_SPLIT_OF_COLUMN = {"train_loss": "train", "heldout_loss": "heldout",
                    **dict(zip(BUCKET_COLUMNS, BUCKET_SPLITS, strict=True))}


def collect(cache: Path, setting: Setting, device: str = "cpu") -> pd.DataFrame:
    """Tidy rows of every finished or partial run's log of ``setting``: one row per (arm, seed, step, split),
    ``split`` one of ``train``, ``heldout`` and :data:`BUCKET_SPLITS` (those only from logs that have them)."""
    frames = []
    for arm, seed, log in _logs(cache, setting, device):
        table = pd.read_csv(log)
        columns = [column for column in _SPLIT_OF_COLUMN if column in table]  # older logs lack the buckets
        long = table.melt(id_vars=["step", "elapsed_s"], value_vars=columns, var_name="split",
                          value_name="loss").dropna(subset=["loss"])
        long["split"] = long["split"].map(_SPLIT_OF_COLUMN)
        skipped = table.set_index("step")["skipped"] if "skipped" in table else None
        long["skipped_steps"] = (0 if skipped is None else
                                 long["step"].map(skipped.fillna(0).cumsum()).fillna(0).astype(int))
        frames.append(long.assign(arm=arm.name, dtype=arm.dtype, op=arm.op, policy=arm.policy,
                                  chunking=arm.chunking, seed=seed, setting=setting.name, steps=setting.steps,
                                  batch_rows=setting.batch_rows))
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)


def bucket_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The per-bucket held-out rows of a ``training`` table (:func:`collect`'s or a results file's), with a
    ``bucket`` column (frequent, middle, rare) beside their ``split``."""
    rows = table[table["split"].isin(BUCKET_SPLITS)]
    return rows.assign(bucket=rows["split"].str.removeprefix("heldout:")).reset_index(drop=True)


BUCKET_EDGES_FILE = "buckets.json"


def write_bucket_edges(folder: Path, train_tokens: torch.Tensor, vocab_size: int) -> Path:
    """Write ``folder/buckets.json``: per bucket, the classes, their smallest and largest training count and
    their share of the training targets (:func:`analysis.core.buckets.bucket_edges`), with the stream's size."""
    from analysis.lm.train import training_buckets

    counts = torch.bincount(train_tokens, minlength=vocab_size)
    edges = bucket_edges(counts, training_buckets(train_tokens, vocab_size))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / BUCKET_EDGES_FILE
    payload = {"train_tokens": int(train_tokens.numel()), "vocab_size": vocab_size, "buckets": edges}
    path.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return path


def bucket_edges_of(where: Path | str | None = None, setting: str = "long", device: str = "cpu") -> pd.DataFrame:
    """The bucket edges a setting's per-bucket losses were measured with: one row per bucket (index frequent,
    middle, rare) with ``classes``, ``min_count``, ``max_count``, ``target_share``. ``where`` is a
    ``buckets.json`` (or a results file ``<name>.csv`` or ``<name>.csv.gz``, whose ``<name>_buckets.json`` beside it
    is read), else the run folder of ``setting`` on ``device`` in the default study cache."""
    if where is None:
        path = LM_CACHE_DIR / "study" / setting / device / BUCKET_EDGES_FILE
    else:
        path = Path(where)
        if path.suffix != ".json":
            path = path.with_name(f"{results_stem(path)}_buckets.json")
    edges = json.loads(path.read_text(encoding="utf-8"))["buckets"]
    return pd.DataFrame.from_dict(edges, orient="index").loc[list(BUCKETS)]


def _run_in_worker(arm: Arm, seed: int, setting: Setting, model_config: ModelConfig, cache: Path,
                   token_cache: Path, tokens_file: Path | None, threads: int, gemm_verdicts: dict) -> None:
    lce.planning.cpu_gemms.adopt(gemm_verdicts)  # the parent's CPU GEMM verdicts: every run plans as one process would
    torch.set_num_threads(threads)
    run_arm(arm, seed, setting, load_streams(token_cache, tokens_file), model_config, cache)


def run_study(setting: Setting, model_config: ModelConfig, cache: Path, *, arms: Sequence[Arm] | None = None,
              device: str = "cpu", workers: int = 1, token_cache: Path = LM_CACHE_DIR,
              tokens_file: Path | None = None, progress: bool = True,
              on_run_done: Callable[[pd.DataFrame], None] | None = None,
              deadline: float | None = None) -> pd.DataFrame:
    """Train every (arm, seed) of ``setting`` (resuming finished or partial runs) and return :func:`collect`'s
    rows: of every run of the setting in ``cache``, those of earlier calls with other arms or seeds too.
    ``arms`` defaults to the setting's; the buckets' edges are written to ``buckets.json`` beside the runs.

    ``cache`` is the study's folder; the token streams come from ``tokens_file`` or the pipeline's cache
    ``token_cache``. On the CPU, ``workers`` processes train runs side by side with one thread each; on a
    GPU one process trains them in turn. ``on_run_done`` receives the rows so far after each run (to write
    results as they come); ``deadline`` (a ``time.monotonic()`` value) starts no run after it.
    """
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from multiprocessing import get_context

    from tqdm import tqdm  # the plain bar: no ipywidgets warning inside a notebook

    pending = list(runs(setting.arms if arms is None else arms, setting))
    # built once here (from the corpus if not cached, about 30 s) before any worker reads them
    streams = load_streams(token_cache, tokens_file)
    write_bucket_edges(cache / setting.name / device, streams[0], model_config.vocab_size)
    bar = tqdm(total=len(pending), desc=f"train {setting.name} on {device}", unit="run", disable=not progress,
               dynamic_ncols=True)

    def finished() -> None:
        bar.update(1)
        if on_run_done is not None:
            on_run_done(collect(cache, setting, device))

    def out_of_time() -> bool:
        return deadline is not None and time.monotonic() > deadline

    if device != "cpu" or workers <= 1:
        for arm, seed in pending:
            if out_of_time():
                break
            bar.set_postfix(arm=arm.name, seed=seed, refresh=True)
            # one run at a time: its own bar shows the steps and their ETA
            run_arm(arm, seed, setting, streams, model_config, cache, device=device, progress=progress)
            finished()
    else:
        gemm_verdicts = lce.planning.cpu_gemms.verdicts()
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            running = set()
            while pending or running:
                while pending and len(running) < workers and not out_of_time():
                    arm, seed = pending.pop(0)
                    running.add(pool.submit(_run_in_worker, arm, seed, setting, model_config, cache, token_cache,
                                             tokens_file, 1, gemm_verdicts))
                if not running:
                    break
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    future.result()
                    finished()
    bar.close()
    return collect(cache, setting, device)


def final_losses(table: pd.DataFrame, split: str = "heldout") -> pd.DataFrame:
    """Each finished (arm, seed) run's ``split`` loss at its last step, and its gap to the fp32 arm of the same
    seed (``gap``, nats; positive = worse than fp32; NaN where that fp32 run is not finished)."""
    rows = table[(table["split"] == split) & (table["step"] <= table["steps"])].reset_index(drop=True)
    last = rows.loc[rows.groupby(["arm", "seed"])["step"].idxmax()]
    last = last[last["step"] == last["steps"]]  # finished runs only: a run in progress is not compared
    baseline = last[last["arm"] == ARMS[0].name].set_index("seed")["loss"]
    last = last.assign(gap=last["loss"] - last["seed"].map(baseline))
    return last[["arm", "seed", "step", "loss", "gap"]].reset_index(drop=True)


def summary(table: pd.DataFrame, split: str = "heldout") -> pd.DataFrame:
    """Per arm: final ``split`` loss (mean over seeds), its gap to the fp32 head (mean, min, max over seeds)
    and the seed-to-seed spread of the loss itself (max - min)."""
    last = final_losses(table, split)
    grouped = last.groupby("arm", sort=False)
    result = pd.DataFrame({"seeds": grouped["seed"].nunique(), "step": grouped["step"].max(),
                           "loss": grouped["loss"].mean(), "gap_mean": grouped["gap"].mean(),
                           "gap_min": grouped["gap"].min(), "gap_max": grouped["gap"].max(),
                           "seed_spread": grouped["loss"].max() - grouped["loss"].min()})
    order = [arm.name for arm in ARMS if arm.name in result.index]
    return result.loc[order]


def load_streams(cache: Path, tokens_file: Path | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The (train, held-out) int64 token streams: from ``tokens_file`` (a ``{"train", "heldout"}`` file, any
    integer dtype: a GPU machine gets them carried, as its Python's standard library differs), else the
    language-model pipeline's cached streams (built from the corpus if missing, about 30 s)."""
    if tokens_file is not None:
        saved = torch.load(tokens_file, weights_only=True)
        return saved["train"].long(), saved["heldout"].long()
    from analysis.lm.corpus import HELDOUT_FRACTION, load_corpus
    from analysis.lm.pipeline import DEFAULT_VOCAB, token_streams
    from analysis.lm.tokenizer import load_or_train_tokenizer

    cache.mkdir(parents=True, exist_ok=True)
    corpus = load_corpus(None, HELDOUT_FRACTION)
    tokenizer, path = load_or_train_tokenizer([f.text for f in corpus.train_files], DEFAULT_VOCAB, cache)
    return token_streams(corpus, tokenizer, path, cache)


def checkpoint_errors(cache: Path, setting: Setting, streams: tuple[torch.Tensor, torch.Tensor],
                      model_config: ModelConfig, *, device: str = "cpu", dtypes: Sequence[str] = ("bfloat16",),
                      chunk_counts: Sequence[int] = (1, 16, 256)) -> pd.DataFrame:
    """Gradient error against sampling noise on the fp32 arm's snapshots (:attr:`Setting.snapshot_steps`):
    the head's inputs are the model's hidden states on ``setting.batch_size`` held-out windows, its weight and
    the next tokens (family ``trained@step``), one row per (seed, step, dtype, contender) as
    :func:`analysis.studies.noise.measure_inputs` writes them."""
    from analysis.core.inputs import Inputs
    from analysis.lm.train import heldout_windows, load_snapshot
    from analysis.studies.noise import contenders, measure_inputs

    windows = heldout_windows(streams[1], model_config.context, setting.batch_size)
    noise_device = "cuda" if device == "cuda" else "cuda-emulated"
    runs = contenders(noise_device, chunk_counts=chunk_counts, num_rows=windows.shape[0] * model_config.context)
    rows = []
    for seed in setting.seeds:
        run_dir = cache / setting.name / device / ARMS[0].slug / f"seed-{seed}"
        for step in setting.snapshot_steps:
            path = run_dir / f"weights-step-{step:06d}.pt"
            if not path.exists():
                continue
            model = load_snapshot(path)
            with torch.no_grad():
                hidden = model.hidden(windows[:, :-1]).reshape(-1, model_config.d_model)
            targets = windows[:, 1:].reshape(-1)
            for dtype_text in dtypes:
                dtype = DTYPES[dtype_text]
                inputs = Inputs(*(t.detach().to(device=device, dtype=dtype).requires_grad_(True)
                                  for t in (hidden, model.head.weight)), None, targets.to(device))
                common = {"family": "trained@step", "dtype": dtype_text, "seed": seed, "step": step,
                          "N": hidden.shape[0], "D": hidden.shape[1], "C": model.head.weight.shape[0],
                          "device": noise_device}
                rows.extend({**common, **row} for row in measure_inputs(inputs, runs))
    return pd.DataFrame(rows)


# ---- python -m analysis train --------------------------------------------------------------------------------

DESCRIPTION = ("Arms: the fp32 head, the unfused bf16 head, lce accurate/balanced/compact in bf16 and fp16 "
               "(loss-scaled) on the CUDA layouts (emulated on a CPU), aspect_ratio:2 chunks. Same "
               "initialisation and batches per seed. Writes training.csv.gz (train and held-out loss per step) "
               "as runs finish, and noise_checkpoints.csv (gradient error vs noise on the fp32 arm's "
               "snapshots). Resumable (checkpoints in analysis/cache/lm/study). --quick: about 2 minutes (CI, "
               "notebook); full: about 100 minutes on 2 cores; --setting long (fp32, bf16 balanced and compact at 256 "
               "chunks, 3000 steps, held-out loss per target-frequency bucket): hours, see LONG_BATCH.")


def arm_names(text: str) -> tuple[Arm, ...]:
    """``fp32,bf16 compact`` -> the arms of those names."""
    from analysis.core.arguments import names_of

    return tuple(ARM_NAMES[name] for name in names_of(tuple(ARM_NAMES))(text))


def add_arguments(parser) -> None:
    from analysis.core.arguments import argument, progress_option, results_option, seed_list, workers_option
    from analysis.paths import LM_CACHE_DIR, display_path

    parser.add_argument("--quick", action="store_true", help="the quick setting (writes training_quick.csv.gz)")
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="full",
                        help="which setting without --quick (default: full)")
    parser.add_argument("--seeds", type=int, default=None, metavar="K", help="seeds 0..K-1 (default: the setting's)")
    parser.add_argument("--seed-list", type=argument(seed_list), default=None, metavar="S[,S]",
                        help="exactly these seeds (e.g. 1,2 to add seeds to a study whose seed 0 is done)")
    parser.add_argument("--arms", type=argument(arm_names), default=None, metavar="NAME[,NAME]",
                        help="arms to train (default: the setting's; quick and full have all): "
                             + ",".join(arm.name for arm in ARMS))
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to train (default: cpu)")
    workers_option(parser)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of the main process (default: 1)")
    parser.add_argument("--budget-s", type=float, default=None, metavar="S",
                        help="start no run after S seconds (the runs done are written; a rerun resumes)")
    parser.add_argument("--tokens", type=Path, default=None, metavar="FILE",
                        help="token streams file ({'train','heldout'}), e.g. carried to a GPU machine")
    parser.add_argument("--file", default=None, metavar="NAME",
                        help="results file name (default: training[_quick][_cuda].csv.gz; a .csv is written plain)")
    parser.add_argument("--cache", type=Path, default=LM_CACHE_DIR,
                        help=f"token streams and run folders (default: {display_path(LM_CACHE_DIR)})")
    parser.add_argument("--no-checkpoint-errors", action="store_true",
                        help="skip the gradient errors on the fp32 arm's snapshots")
    results_option(parser)
    progress_option(parser)


def run(args) -> None:
    import dataclasses
    import os
    import time

    from analysis.core.provenance import provenance
    from analysis.core.results_io import NOISE, TRAINING, append_rows, replace_rows, set_aside
    from analysis.lm.pipeline import DEFAULT_VOCAB
    from analysis.paths import display_path

    started = time.monotonic()
    setting = SETTINGS["quick" if args.quick else args.setting]
    if args.seeds is not None:
        setting = dataclasses.replace(setting, seeds=tuple(range(args.seeds)))
    if args.seed_list is not None:
        setting = dataclasses.replace(setting, seeds=args.seed_list)
    torch.set_num_threads(args.threads)
    suffix = "" if args.device == "cpu" else f"_{args.device}"
    path = args.results / (args.file or f"training{'_quick' if args.quick else ''}{suffix}.csv.gz")
    args.results.mkdir(parents=True, exist_ok=True)
    cache = args.cache / "study"
    model_config = ModelConfig(DEFAULT_VOCAB)
    set_aside(path)

    edges = path.with_name(f"{results_stem(path)}_buckets.json")  # beside the results, where bucket_edges_of looks

    def copy_edges() -> None:
        edges.write_text((cache / setting.name / args.device / BUCKET_EDGES_FILE).read_text(encoding="utf-8"),
                         encoding="utf-8")

    def write(table) -> None:
        replace_rows(path, TRAINING.rows(table.assign(device=args.device, **provenance(args.device))))
        copy_edges()

    deadline = None if args.budget_s is None else started + args.budget_s
    workers = args.workers or (len(os.sched_getaffinity(0)) if args.device == "cpu" else 1)
    arms = None if args.arms is None else tuple(setting.arm(arm.name) for arm in args.arms)
    table = run_study(setting, model_config, cache, arms=arms, device=args.device, workers=workers,
                      token_cache=args.cache, tokens_file=args.tokens, progress=not args.no_progress,
                      on_run_done=write, deadline=deadline)
    if not table.empty:
        write(table)
        print(summary(table).to_string(float_format="%.4f"))
    print(f"{display_path(path)}: {len(table)} rows, {time.monotonic() - started:.0f} s")
    copy_edges()
    print(f"{display_path(edges)}: the target-frequency buckets of the per-bucket held-out losses")
    print(bucket_edges_of(edges).to_string(float_format="%.4g"))
    if setting.snapshot_steps and not args.no_checkpoint_errors:
        errors = checkpoint_errors(cache, setting, load_streams(args.cache, args.tokens), model_config,
                                   device=args.device)
        if not errors.empty:
            errors_path = args.results / f"noise_checkpoints{suffix}.csv"
            set_aside(errors_path)
            noise_device = "cuda" if args.device == "cuda" else "cuda-emulated"
            append_rows(errors_path, NOISE.rows(errors.assign(**provenance(noise_device))))
            print(f"{display_path(errors_path)}: {len(errors)} rows")
