"""Results files: what each kind holds, the one row writer, and reading them back.

Every results file (``analysis/results/*.csv``, or ``*.csv.gz``, below) starts with a ``kind`` column
naming what it holds, one of :data:`KINDS`: ``sweep`` rows (one run of a grid
each), the ``bench`` and ``chunk_sweep`` measurements of
:mod:`analysis.studies.bench`, the ``memory_breakdown`` and ``memory_trace``
of :mod:`analysis.studies.memory_study`, ``margins`` and ``rare_rows`` (:mod:`analysis.studies.margins`,
:mod:`analysis.studies.rare_rows`), and ``reproduce`` (the wall time of a
whole reproduction). Readers choose files by kind
(:func:`paths_of_kind`), never by file name. Every kind ends with the
provenance columns.

:func:`append_rows` is the only writer (:func:`replace_rows`, for a study that
rewrites its file whole, appends to a fresh one). It opens the file in append mode,
writes the header only when the file is new, writes the rows as one block (one
line per row; line breaks inside a value become spaces), then flushes and
fsyncs, holding an exclusive lock on the file meanwhile (the sweep's worker
processes append to one file). Appending costs O(rows written), however long
the file already is. A
row whose columns are not the file's header, in order, is refused with a
``ValueError``. A crash mid-write leaves at most one unfinished last line (no
newline): readers ignore it, and the next append cuts it off before writing.

A file named ``<name>.csv.gz`` holds the same text gzip-compressed: the name says the form, and every
function here takes either (a large study's results shrink ten- to fifty-fold, which keeps the checkout
small enough to copy to a GPU machine). Each append writes its block as one
more gzip member (gzip readers, pandas' included, read concatenated members as one text), under the
same lock, flush and fsync. A crash mid-write leaves at most one unfinished last member: readers ignore
it, and the next append cuts it off. What differs: finding where the last complete member ends means
decompressing the whole file, so appending to a ``.csv.gz`` costs O(file) rather than O(rows written)
(milliseconds for the committed files, next to the seconds a study spends on each problem it appends),
and each member is compressed on its own (a file grown by many small appends packs less tightly than
one written whole; ``gzip -dc x.csv.gz | gzip -n > y.csv.gz`` packs it again). The sweep's files, which
parallel workers grow one row at a time, stay plain.
"""

from __future__ import annotations

import csv
import dataclasses
import fcntl
import gzip
import io
import os
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from analysis.core.inputs import OUTPUT_NAMES
from analysis.core.metrics import ERROR_SUFFIXES
from analysis.core.provenance import PROVENANCE_COLUMNS
from analysis.core.run_config import RunConfig

__all__ = ["Kind", "KINDS", "SWEEP", "BENCH", "CHUNK_SWEEP", "MEMORY_BREAKDOWN", "MEMORY_TRACE", "FAMILY_STATS",
           "REPRODUCE", "MARGINS", "RARE_ROWS", "NOISE", "NOISE_SCALING", "TRAINING", "BUDGETS", "CLASS_TILING",
           "FEATURES", "FEATURE_COST", "VOCAB_PARALLEL", "CPU_GEMM_RATES", "CPU_GEMM_PROBE", "RECOMMEND_CHECK",
           "GPU_BENCH", "GPU_MEMORY", "HF_STEP", "HEAD_TRAINING", "LOSS_SCALE", "HF_FP16", "RL_LOGPROBS",
           "RL_CHUNKING", "RL_COST", "RL_EXAMPLE", "HEAD_MISMATCH", "HEAD_BATCH", "INVARIANCE_COST", "TEST_TIME",
           "COLUMNS",
           "COMPRESSED_SUFFIX", "is_compressed", "results_stem", "append_rows", "append_row", "replace_rows",
           "write_csv_atomically", "set_aside", "read_rows", "read_table", "file_kind", "paths_of_kind", "load_kind",
           "done_keys", "latest", "load_results"]


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of results file: its name (the value of its ``kind`` column) and its columns, in file order."""

    name: str
    columns: tuple[str, ...]
    description: str

    def row(self, values: Mapping[str, object] | None = None, **more: object) -> dict[str, object]:
        """A complete row of this kind: every column in file order, ``None`` (an empty cell) where not given.

        ``ValueError`` naming the columns this kind does not have.
        """
        given = {**(values or {}), **more}
        unknown = [column for column in given if column not in self.columns]
        if unknown:
            raise ValueError(f"a {self.name!r} row has no columns {unknown}; its columns are {list(self.columns)}")
        if given.get("kind", self.name) != self.name:
            raise ValueError(f"a {self.name!r} row cannot have kind={given['kind']!r}")
        return {column: self.name if column == "kind" else given.get(column) for column in self.columns}

    def rows(self, table: pd.DataFrame) -> list[dict[str, object]]:
        """Complete rows from ``table``; pandas' missing values (NaN, None) become empty cells."""
        records = table.astype(object).where(table.notna(), None).to_dict("records")
        return [self.row(record) for record in records]


_SWEEP_CONFIG = ["kind", "key", "grid"] + [field.name for field in dataclasses.fields(RunConfig)]
_SWEEP_RESOLVED = ["resolved_policy", "resolved_acc_dtype", "chunk_size", "num_chunks"]
_SWEEP_ERRORS = [f"{name}_{suffix}" for name in OUTPUT_NAMES for suffix in ERROR_SUFFIXES]
_SWEEP_COSTS = ["peak_bytes_measured", "peak_bytes_modeled", "memory_method", "time_median_s", "time_spread_s",
                "time_repeats"]
_SWEEP_STATUS = ["status", "note"]
_BENCH = ["kind", "impl", "dtype", "N", "D", "C", "metric", "value", "spread_s", "repeats", "chunk_size", "num_chunks",
          "modeled_peak_bytes", "resolved_policy", "resolved_acc_dtype"]
_STUDY_PROBLEM = ["config", "dtype", "N", "D", "C"]

SWEEP = Kind("sweep", tuple(_SWEEP_CONFIG + _SWEEP_RESOLVED + _SWEEP_ERRORS + _SWEEP_COSTS + _SWEEP_STATUS
                            + list(PROVENANCE_COLUMNS)),
             "one run of a grid per row: config, resolved plan, errors vs fp64, costs, status (analysis.sweep.run)")
BENCH = Kind("bench", tuple(_BENCH + list(PROVENANCE_COLUMNS)),
             "one measurement per row (metric time_s or peak_bytes) of an implementation at one problem "
             "(python -m analysis bench [--scaling])")
CHUNK_SWEEP = Kind("chunk_sweep", BENCH.columns,
                   "lce's time per policy and explicit chunk size at one problem (python -m analysis bench "
                   "--chunk-sweep)")
MEMORY_BREAKDOWN = Kind("memory_breakdown", tuple(["kind", *_STUDY_PROBLEM, "buffer", "buffer_dtype", "stage", "span",
                                                   "nbytes", "predicted_peak_bytes", *PROVENANCE_COLUMNS]),
                        "every buffer lce's plan allocates, per configuration (python -m analysis memory-study)")
MEMORY_TRACE = Kind("memory_trace", tuple(["kind", *_STUDY_PROBLEM, "event", "live_bytes", *PROVENANCE_COLUMNS]),
                    "live extra memory after each allocator event of one forward+backward, per configuration "
                    "(python -m analysis memory-study)")

FAMILY_STATS = Kind("family_stats", tuple(["kind", "family", "statistic", "rank", "value", "N", "D", "C", "seed",
                                           *PROVENANCE_COLUMNS]),
                    "what each input family looks like: mean loss, p_target and margin quantiles, feature outliers, "
                    "target rank-frequency (python -m analysis family-stats)")

_CONTENDER = ["impl", "op", "policy", "layout", "acc_dtype", "resolved_policy", "resolved_acc_dtype", "num_chunks"]
MARGINS = Kind("margins", tuple(["kind", *_CONTENDER, "dtype", "N", "D", "C", "seed", "margin", "realized_margin",
                                 "grad_input_floors", "grad_weight_floors", "loss_ulps", "wall_s", "cpu_s",
                                 *PROVENANCE_COLUMNS]),
               "error vs fp64 on rows whose target leads by a margin (nats), per implementation, dtype and seed: "
               "Frobenius floors of both gradients, loss ulps (python -m analysis margins)")

RARE_ROWS = Kind("rare_rows", tuple(["kind", *_CONTENDER, "chunking", "dtype", "family", "N", "D", "C", "seed",
                                     "grad_weight_floors", "grad_weight_bias_in_floors", "grad_input_floors", "bin",
                                     "rows", "row_median", "row_p99", "row_max", "wall_s", "cpu_s",
                                     *PROVENANCE_COLUMNS]),
                 "grad_weight's per-row error in floors, binned by how often the class is a target in the batch, "
                 "per implementation, dtype and seed (python -m analysis rare-rows)")

NOISE = Kind("noise", tuple(["kind", "impl", "op", "policy", "chunking", "num_chunks", "layout", "device", "dtype",
                             "family", "N", "D", "C", "seed", "step", "grad_weight_floors",
                             "grad_weight_bias_in_floors", "grad_input_floors", "weight_noise", "weight_noise_along",
                             "input_noise", "weight_error_over_noise", "weight_bias_over_noise", "steps_to_matter",
                             "input_error_over_noise", "weight_floor_over_noise", "input_floor_over_noise", "wall_s",
                             "cpu_s", *PROVENANCE_COLUMNS]),
             "gradient error against the sampling noise of the same batch, per policy, chunk count, family, dtype "
             "and seed; step is the training step of a checkpoint's hidden states (python -m analysis noise, "
             "python -m analysis train)")

NOISE_SCALING = Kind("noise_scaling", tuple(["kind", "candidate", "op", "policy", "chunking", "num_chunks", "layout",
                                             "device", "dtype", "family", "N", "D", "C", "seed",
                                             "gradient_over_noise", "grad_weight_floors",
                                             "grad_weight_bias_in_floors", "grad_input_floors", "weight_noise",
                                             "weight_noise_along", "input_noise", "weight_error_over_noise",
                                             "weight_bias_over_noise", "steps_to_matter", "input_error_over_noise",
                                             "weight_floor_over_noise", "input_floor_over_noise", "wall_s", "cpu_s",
                                             *PROVENANCE_COLUMNS]),
                     "the noise study's ratios over the batch size N (and D), per rule candidate, family, dtype and "
                     "seed; gradient_over_noise is the exact weight gradient's norm over its sampling noise "
                     "(python -m analysis noise-scaling)")

TRAINING = Kind("training", tuple(["kind", "setting", "arm", "dtype", "op", "policy", "chunking", "seed", "step",
                                   "steps", "batch_rows", "split", "loss", "skipped_steps", "elapsed_s", "device",
                                   *PROVENANCE_COLUMNS]),
                "train and held-out loss of the small language model per head arm, seed and step "
                "(python -m analysis train)")

_BUDGET_PLAN = ["dtype", "family", "N", "D", "C", "policy", "acc_dtype", "batch_chunk_size", "class_chunk_size"]
_MEASURED = ["predicted_peak_bytes", "measured_peak_bytes", "grad_input_floors", "grad_weight_floors",
             "time_median_s"]
BUDGETS = Kind("budgets", tuple(["kind", "budget", "budget_bytes", "gradients_bytes", "default_limit_met",
                                 *_BUDGET_PLAN, "predicted_grad_input_floors", "predicted_grad_weight_floors",
                                 *_MEASURED, "wall_s", "cpu_s", *PROVENANCE_COLUMNS]),
               "lce.recommend's options per memory budget, with predicted and measured (fresh process) peak, "
               "errors and time (python -m analysis budgets)")
CLASS_TILING = Kind("class_tiling", tuple(["kind", *_BUDGET_PLAN, "num_class_chunks", *_MEASURED, "time_ratio",
                                           "wall_s", "cpu_s", *PROVENANCE_COLUMNS]),
                    "time, peak and errors of each policy with the vocabulary whole and cut into blocks, one "
                    "process (python -m analysis budgets)")

FEATURES = Kind("features", tuple(["kind", *_CONTENDER, "dtype", "family", "N", "D", "C", "seed", "features",
                                   "softcap", "z_loss", "grad_input_floors", "grad_weight_floors", "grad_bias_floors",
                                   "loss_ulps", "lse_max_error", "stat_mean_lse", "stat_mean_max_logit",
                                   "stat_median_target_prob", "stat_share_target_prob_above_0.999", "wall_s", "cpu_s",
                                   *PROVENANCE_COLUMNS]),
                "error vs fp64 of lce's soft-capping and z-loss next to the plain op, per implementation, family, "
                "dtype and seed; the returned log-sum-exp's error (nats); the fp64 softmax statistics of each "
                "feature set (python -m analysis features)")
FEATURE_COST = Kind("feature_cost", tuple(["kind", "features", "softcap", "z_loss", "dtype", "N", "D", "C", "policy",
                                           "acc_dtype", "num_chunks", "time_median_s", "time_spread_s", "time_ratio",
                                           "repeats", "predicted_peak_bytes", "measured_peak_bytes", "wall_s", "cpu_s",
                                           *PROVENANCE_COLUMNS]),
                    "time (alternating rounds, one process) and measured vs modeled peak of lce's default options "
                    "per feature set at the bench shape (python -m analysis features --cost)")

VOCAB_PARALLEL = Kind("vocab_parallel", tuple(["kind", "ranks", "impl", "policy", "family", "dtype", "N", "D", "C",
                                               "seed", "grad_input_floors", "grad_weight_floors", "loss_ulps",
                                               "peak_bytes_max", "peak_bytes_min", "planned_shard_peak_bytes",
                                               "rank0_seconds", "loss_diff_to_single", "grad_input_diff_to_single",
                                               "grad_weight_diff_to_single", "wall_s", "cpu_s",
                                               *PROVENANCE_COLUMNS]),
                      "vocab-parallel lce on 1-4 CPU processes (gloo), per policy, family, dtype and seed: errors "
                      "against fp64 and the peak extra memory per rank (python -m analysis vocab-parallel)")
_GPU_ERRORS = ["loss_ulps", "grad_input_fro_in_floors", "grad_weight_fro_in_floors", "grad_bias_fro_in_floors"]
CPU_GEMM_RATES = Kind("cpu_gemm_rates", ("kind", "dtype", "m", "k", "n", "seconds", "gflops", "rate_over_fp32",
                                         "support", "probe_slowdown", "probe_cost_s", "isa_caps", *PROVENANCE_COLUMNS),
                      "GEMM rate of one dtype on this CPU and lce.planning.cpu_gemms' verdict (python -m analysis "
                      "cpu-kinds)")
CPU_GEMM_PROBE = Kind("cpu_gemm_probe", ("kind", "method", "dtype", "threads", "load", "process", "support", "source",
                                         "slowdown", "probe_s", "isa_caps", *PROVENANCE_COLUMNS),
                      "one fresh process's bf16 or fp16 verdict by lce.planning.cpu_gemms or the earlier probe, at a "
                      "thread "
                      "count, idle or with every core busy (python -m analysis cpu-probe)")
RECOMMEND_CHECK = Kind("recommend_check", ("kind", "dtype", "N", "D", "C", "budget", "budget_bytes", "role", "label",
                                           "policy", "acc_dtype", "batch_chunk_size", "class_chunk_size",
                                           "bf16_gemms_assumed", "predicted_peak_bytes", "predicted_error",
                                           "estimated_s", "timing", "time_median_s", "time_spread_s", "repeats",
                                           "time_over_fastest", "blind_estimate_s", "isa_caps",
                                           *PROVENANCE_COLUMNS),
                       "an option set timed for one shape and budget: lce.recommend's pick, measure=True's, a "
                       "capability-blind one, or a feasible alternative (python -m analysis cpu-kinds)")
GPU_BENCH = Kind("gpu_bench", tuple(["kind", "impl", "op", "policy", "acc_dtype", "dtype", "family", "N", "D", "C",
                                     "resolved_policy", "num_chunks", "time_median_s", "time_spread_s", "repeats",
                                     "peak_allocated_bytes", "peak_reserved_bytes", "modeled_peak_bytes",
                                     *_GPU_ERRORS, "status", "note", *PROVENANCE_COLUMNS]),
                 "one implementation's forward+backward at the bench shape on a GPU: CUDA-event time (median after "
                 "warm-up), allocator peaks, errors vs fp64 (python -m analysis gpu-check)")
GPU_MEMORY = Kind("gpu_memory", tuple(["kind", "policy", "acc_dtype", "dtype", "N", "D", "C", "resolved_policy",
                                       "num_chunks", "modeled_peak_bytes", "peak_allocated_bytes",
                                       "peak_reserved_bytes", "measured_over_modeled", "status", "note",
                                       *PROVENANCE_COLUMNS]),
                  "lce's modeled peak (lce.plan(...).peak_extra_bytes) against the CUDA allocator's measured peaks, "
                  "per policy and shape (python -m analysis gpu-check)")

HF_STEP = Kind("hf_step", tuple(["kind", "arm", "model", "optimizer", "device", "param_dtype", "compute_dtype",
                                 "hidden", "layers", "vocab", "batch", "seq_len", "tokens", "logits_bytes", "policy",
                                 "acc_dtype", "batch_chunk_size", "class_chunk_size", "budget_bytes",
                                 "predicted_head_peak_bytes", "measured_peak_bytes", "memory_method", "peak_ratio",
                                 "time_median_s", "time_spread_s", "time_ratio", "rounds", "loss", "loss_diff",
                                 "status", "note", "wall_s", "cpu_s", *PROVENANCE_COLUMNS]),
               "one training step (forward, backward, optimizer) of a transformers Llama with a large vocabulary, per "
               "arm (unpatched, lce.integrations.transformers' patch with each kind of options, Liger-Kernel's): "
               "peak memory (a fresh process), median time over alternating rounds, ratios to the unpatched "
               "model (python -m analysis hf-step)")

HEAD_TRAINING = Kind("head_training", tuple(["kind", "setting", "optimizer", "arm", "dtype", "op", "policy",
                                             "num_chunks", "rule", "seed", "step", "steps", "batch_rows", "pool_rows",
                                             "heldout_rows", "D", "C", "metric", "bucket", "value",
                                             *PROVENANCE_COLUMNS]),
                     "head-only training of a calibrated teacher's head per arm, optimizer, seed and step: held-out "
                     "loss per target-frequency bucket, distance to the fp32 arm's head, bias/noise along the run "
                     "(python -m analysis head-train)")

LOSS_SCALE = Kind("loss_scale", tuple(["kind", "impl", "op", "layout", "policy", "acc_dtype", "headroom",
                                       "resolved_policy", "resolved_acc_dtype", "num_chunks", "family", "dtype",
                                       "N", "D", "C", "seed",
                                       "scale_log2", "gradient", "eligible", "lost", "lost_fraction", "floors",
                                       "untargeted_floors", "finite", "wall_s", "cpu_s", *PROVENANCE_COLUMNS]),
                  "fp16 gradient entries lost to the subnormal range and floors under a loss scale, per "
                  "implementation (lce before and after lce.passes.headroom), scale, gradient and seed "
                  "(python -m analysis loss-scale)")

HF_FP16 = Kind("hf_fp16", tuple(["kind", "arm", "seed", "step", "train_loss", "heldout_loss", "loss_scale",
                                  "skipped_steps", "finite", "hidden", "layers", "vocab", "batch", "seq_len", "steps",
                                  "every", "lr", "heldout", "zipf", "wall_s", *PROVENANCE_COLUMNS]),
               "a small transformers Llama trained under fp16 autocast with a GradScaler, unpatched and patched by "
               "lce, per arm, seed and evaluated step: training and held-out loss, the scaler's scale, skipped "
               "steps (python -m analysis hf-fp16)")

REPRODUCE = Kind("reproduce", tuple(["kind", "grid", "runs", "workers", "sweep_s", "memory_study_s", "figures_s",
                                     "total_s", *PROVENANCE_COLUMNS]),
                 "the wall time of one whole `python -m analysis reproduce` (the READMEs quote it)")

_RL_PROBLEM = ["recipe", "op", "policy", "layout", "acc_dtype", "family", "margin", "dtype", "N", "D", "C"]
RL_LOGPROBS = Kind("rl_logprobs", tuple(["kind", *_RL_PROBLEM, "temperature", "seed", "output_dtype",
                                         "logp_err_median", "logp_err_p99", "logp_err_max", "ratio_err_median",
                                         "ratio_err_p99", "ratio_err_max", "ratio_share_over_1e-3",
                                         "ratio_share_over_clip", "kl_k3", "entropy_err_median", "entropy_err_p99",
                                         "entropy_err_max", "logp_rel_err_max", "entropy_rel_err_max",
                                         "worst_p_target", "worst_entropy", "worst_rank", "worst_ratio_err",
                                         "median_p_target", "mean_entropy", "grad_input_floors",
                                         "grad_weight_floors", "wall_s", *PROVENANCE_COLUMNS]),
                   "per-token log-probabilities and entropy of one recipe at one problem against fp64: the "
                   "importance-ratio error, implied KL, entropy error, policy-gradient floors "
                   "(python -m analysis rl-logprobs)")
RL_CHUNKING = Kind("rl_chunking", RL_LOGPROBS.columns,
                   "the rl_logprobs rows of lce at fixed row chunk counts and class-tiled (python -m analysis "
                   "rl-logprobs --chunking)")
RL_COST = Kind("rl_cost", tuple(["kind", "recipe", "op", "dtype", "N", "D", "C", "peak_bytes", "predicted_peak_bytes",
                                 "logits_bytes", "time_median_s", "time_spread_s", "repeats", "gemms", "note",
                                 *PROVENANCE_COLUMNS]),
               "peak extra memory and time of one recipe's forward and backward at a Qwen-size head "
               "(python -m analysis rl-logprobs --costs)")

RL_EXAMPLE = Kind("rl_example", tuple(["kind", "parity_vocab", "vocab", "loss_rel_diff", "grad_rel_diff", "loss_step1",
                                       "loss_step2", "completion_tokens", "tokens", "lce_peak_bytes", "lce_seconds",
                                       "materialized_peak_bytes", "materialized_seconds", "logits_bytes",
                                       *PROVENANCE_COLUMNS]),
                  "the worked GRPO example: fp64 agreement of lce's and the materialized head, and each one's peak "
                  "memory at a Qwen-size vocabulary (python examples/grpo_update.py --csv ...)")

_HEAD_CASE = ["family", "N", "D", "C", "dtype", "temperature", "seed"]
HEAD_MISMATCH = Kind("head_mismatch", tuple(["kind", *_HEAD_CASE, "trainer", "inference", "trainer_gemms",
                                             "inference_gemms", "tokens", "rms_nats", "mean_delta", "max_abs_delta",
                                             "ratio_err_p99", "ratio_err_max", "bitwise_equal_share",
                                             "sequence_tokens", "sequences", "seq_log_ratio_rms",
                                             "seq_log_ratio_max", "seq_mult_prob_error_max", "masked_trl_default",
                                             "masked_trl_two_sided", "masked_nemo_rl_2", "trainer_rms_exact",
                                             "inference_rms_exact", "trainer_ratio_p99_exact",
                                             "inference_ratio_p99_exact", "fp16_cast_changed", "case_wall_s",
                                             *PROVENANCE_COLUMNS]),
                     "one trainer head against one inference head on the same bf16 inputs and sampled targets: the "
                     "per-token log-ratio's RMS (nats), mean, p99 and max of |ratio - 1|, the sequences TRL's and "
                     "NeMo-RL's masks would drop, each side's own error against fp64 (python -m analysis "
                     "head-mismatch)")
HEAD_BATCH = Kind("head_batch", tuple(["kind", *_HEAD_CASE, "head", "side", "gemms", "rows", "max_abs_diff",
                                       "rms_diff", "bitwise_equal", "case_wall_s", *PROVENANCE_COLUMNS]),
                  "one head's log p of a batch's leading rows scored alone against the same rows scored inside the "
                  "batch (python -m analysis head-mismatch)")

INVARIANCE_COST = Kind("invariance_cost", tuple(["kind", "op", "dtype", "N", "D", "C", "arm", "batch_invariant",
                                                 "batch_chunk_size", "loop_rows", "num_chunks", "time_s",
                                                 "time_samples", "predicted_time_s", "peak_bytes", "rounds",
                                                 *PROVENANCE_COLUMNS]),
                       "one forward and backward of lce with batch_invariant=False and True, timed in interleaved "
                       "rounds on this CPU, with the plan's rows and predicted peak (python -m analysis "
                       "invariance-cost)")

TEST_TIME = Kind("test_time", tuple(["kind", "tier", "command", "stand_in", "wall_s", "status", "passed", "failed",
                                     "skipped", *PROVENANCE_COLUMNS]),
                 "wall time of one test tier (make test-fast's, make test's) or train --quick on one CPU "
                 "(python -m analysis test-times)")

KINDS: dict[str, Kind] = {kind.name: kind for kind in (SWEEP, BENCH, CHUNK_SWEEP, MEMORY_BREAKDOWN, MEMORY_TRACE,
                                                       FAMILY_STATS, REPRODUCE, MARGINS, RARE_ROWS, NOISE,
                                                       NOISE_SCALING, TRAINING, BUDGETS, CLASS_TILING, FEATURES,
                                                       FEATURE_COST, VOCAB_PARALLEL, CPU_GEMM_RATES, CPU_GEMM_PROBE,
                                                       RECOMMEND_CHECK, GPU_BENCH, GPU_MEMORY, HF_STEP, HEAD_TRAINING,
                                                       LOSS_SCALE, HF_FP16, RL_LOGPROBS, RL_CHUNKING,
                                                       RL_COST, RL_EXAMPLE, HEAD_MISMATCH, HEAD_BATCH, INVARIANCE_COST,
                                                       TEST_TIME)}
"""Every kind of results file, by the name its ``kind`` column holds."""

COLUMNS: tuple[str, ...] = SWEEP.columns
"""The sweep's columns, in file order: kind and config, resolved plan, errors, costs, status, provenance."""


COMPRESSED_SUFFIX = ".gz"
"""The suffix, after ``.csv``, of a results file stored gzip-compressed (``<name>.csv.gz``)."""
_NAME_SUFFIXES = (".csv" + COMPRESSED_SUFFIX, ".csv")


def is_compressed(path: Path | str) -> bool:
    """Whether ``path`` names a gzip-compressed results file (``<name>.csv.gz``): the name alone says so."""
    return Path(path).name.endswith(COMPRESSED_SUFFIX)


def results_stem(path: Path | str) -> str:
    """The name of ``path`` without ``.csv`` or ``.csv.gz``: ``training_long`` for either form of that file.

    ``ValueError`` naming the path when it names neither form.
    """
    name = Path(path).name
    for suffix in _NAME_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[:-len(suffix)]
    raise ValueError(f"path must name a results file <name>.csv or <name>.csv.gz, got {str(path)!r}")


def _format(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):  # numpy's float64 too, whose repr() is not a number
        return repr(float(value))
    return " ".join(str(value).splitlines())  # one line per row


def _lines(rows: list[Mapping[str, object]]) -> tuple[list[str], str]:
    """The rows' columns (the same for every row, or ``ValueError``) and their CSV text, header line first."""
    header = list(rows[0])
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        if list(row) != header:
            raise ValueError(_mismatch(list(row), header, "the first row's"))
        writer.writerow([_format(value) for value in row.values()])
    return header, buffer.getvalue()


def _mismatch(got: list[str], header: list[str], where: str) -> str:
    missing = [column for column in header if column not in got]
    extra = [column for column in got if column not in header]
    detail = f"missing {missing}, extra {extra}" if missing or extra else "same columns in another order"
    return f"row columns differ from {where}: {detail}"


def _cut_unfinished_line(handle, size: int) -> int:
    """Truncate ``handle`` after its last newline (a row cut short by a crash); return the new size."""
    end = size
    while end > 0:
        start = max(0, end - 4096)
        handle.seek(start)
        block = handle.read(end - start)
        newline = block.rfind(b"\n")
        if newline >= 0:
            end = start + newline + 1
            break
        end = start
    if end != size:
        handle.truncate(end)
    return end


def _complete_members(data: bytes) -> tuple[bytes, int]:
    """The decompressed bytes of ``data``'s complete gzip members, and the offset just past the last of them.

    Each append writes one member; one that a crash cut short (no end of stream, or its trailer missing or
    wrong) ends the file's rows, as an unfinished line ends a plain file's.
    """
    parts, view, end = [], memoryview(data), 0
    while end < len(data):
        member = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # one gzip member, its trailer checked
        try:
            parts.append(member.decompress(view[end:]))
        except zlib.error:
            break
        if not member.eof:
            break
        end = len(data) - len(member.unused_data)
    return b"".join(parts), end


def _cut_unfinished_member(handle, size: int) -> int:
    """Truncate ``handle`` (a ``.csv.gz``) after its last complete gzip member; return the new size."""
    handle.seek(0)
    _, end = _complete_members(handle.read(size))
    if end != size:
        handle.truncate(end)
    return end


def _first_lines(handle, compressed: bool) -> list[str]:
    """The first two lines of the file open in ``handle`` (binary; decompressed when ``compressed``); a line
    without its newline is unfinished, an empty one absent. Reads only as far as the second newline."""
    handle.seek(0)
    if compressed:
        member, text = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS), b""
        while text.count(b"\n") < 2 and not member.eof:
            block = handle.read(1 << 16)
            if not block:
                break
            try:
                text += member.decompress(block)
            except zlib.error:  # a first member a crash cut short: no complete row to read
                break
        handle = io.BytesIO(text)
    return [handle.readline().decode("utf-8") for _ in range(2)]


def _read_head(handle, compressed: bool) -> tuple[list[str], str | None]:
    """The file's header and the ``kind`` of its first row (None without a ``kind`` column or a row)."""
    header_line, first_line = _first_lines(handle, compressed)
    header = next(csv.reader([header_line]))
    kind = next(csv.reader([first_line]))[0] if first_line and header[0] == "kind" else None
    return header, kind


def append_rows(path: Path, rows: Iterable[Mapping[str, object]]) -> int:
    """Append ``rows`` (mappings with the same columns, in order) to the CSV at ``path``; return how many.

    A new (or empty) file gets the rows' columns as its header. ``ValueError``
    if a row's columns differ from the header, or its ``kind`` from the
    file's; nothing is written then. A ``<name>.csv.gz`` gets the block as one
    more gzip member (the module docstring says what that costs).
    """
    return _append(path, list(rows), compressed=is_compressed(path))


def _append(path: Path, rows: list[Mapping[str, object]], *, compressed: bool) -> int:
    if not rows:
        return 0
    columns, text = _lines(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # parallel sweep workers append to one file; released on close
        size = handle.seek(0, os.SEEK_END)
        if (_cut_unfinished_member if compressed else _cut_unfinished_line)(handle, size):
            header, kind = _read_head(handle, compressed)
            if columns != header:
                raise ValueError(_mismatch(columns, header, f"the header of {path.name}"))
            other = {str(row.get("kind")) for row in rows} - {kind} if kind is not None else set()
            if other:
                raise ValueError(f"{path.name} holds {kind!r} rows; refusing rows of kind {sorted(other)}")
            text = text[text.index("\n") + 1:]  # the file has its header
        block = text.encode("utf-8")
        handle.write(gzip.compress(block, mtime=0) if compressed else block)  # O_APPEND: lands at the end
        handle.flush()
        os.fsync(handle.fileno())
    return len(rows)


def append_row(path: Path, row: Mapping[str, object]) -> None:
    """Append one row to ``path`` (see :func:`append_rows`)."""
    append_rows(path, [row])


def replace_rows(path: Path, rows: Iterable[Mapping[str, object]]) -> int:
    """Write ``rows`` as the whole of the results file ``path``, in its form (plain or ``.csv.gz``); return how many.

    The rows are appended (:func:`append_rows`) to ``<name>.partial``, which no reader globs, then moved over
    ``path`` in one step: a reader never sees half of them (a study that rewrites its file as runs finish).
    With no rows ``path`` is left as it is.
    """
    rows = list(rows)
    if not rows:
        return 0
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    _append(partial, rows, compressed=is_compressed(path))
    partial.replace(path)
    return len(rows)


def write_csv_atomically(path: Path, rows: Iterable[Mapping[str, object]], columns: Iterable[str]) -> None:
    """Write ``rows`` (mappings over ``columns``) as a whole CSV at ``path``: through a ``.tmp`` file replaced in one
    step, so a reader or a crash never sees half a file (a run's log, rewritten at every checkpoint). A
    ``<name>.csv.gz`` is written compressed, as one gzip member."""
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")  # as every appender writes
    writer.writeheader()
    writer.writerows(rows)
    block = buffer.getvalue().encode("utf-8")
    partial = path.with_name(path.name + ".tmp")
    partial.write_bytes(gzip.compress(block, mtime=0) if is_compressed(path) else block)
    os.replace(partial, path)


def set_aside(path: Path) -> Path | None:
    """Rename ``path`` to ``<name>.previous`` (which no reader globs), so the next append starts a new file.

    Returns the new path, or None if ``path`` did not exist. For results that
    are re-measured as a whole (a reproduction, a study); an older
    ``.previous`` is replaced.
    """
    if not path.exists():
        return None
    previous = path.with_name(path.name + ".previous")
    path.replace(previous)
    return previous


def _complete_text(path: Path) -> str:
    """The file's text up to its last newline (an unfinished last line is not a row yet); a ``.csv.gz``'s from
    its complete members, decoded as :meth:`Path.read_text` decodes a plain file (universal newlines)."""
    if is_compressed(path):
        data, _ = _complete_members(path.read_bytes())
        text = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8").read()
    else:
        text = path.read_text(encoding="utf-8")
    return text[:text.rfind("\n") + 1]


def read_rows(path: Path) -> list[dict[str, str]]:
    """Every complete row of ``path`` as strings (``[]`` if it does not exist)."""
    if not path.exists():
        return []
    return list(csv.DictReader(io.StringIO(_complete_text(path))))


def read_table(path: Path) -> pd.DataFrame:
    """Every complete row of ``path`` as a table (types inferred by pandas)."""
    text = _complete_text(path)
    return pd.read_csv(io.StringIO(text)) if text else pd.DataFrame()


def file_kind(path: Path) -> str | None:
    """The ``kind`` of a results file (from its first row), or None without one or without a complete row."""
    with open(path, "rb") as handle:
        lines = _first_lines(handle, is_compressed(path))
    if not lines[1].endswith("\n"):
        return None
    header, first = csv.reader(lines)
    return first[0] if header and header[0] == "kind" and first else None


def paths_of_kind(folder: Path, kind: str) -> list[Path]:
    """The results files in ``folder`` holding ``kind``, plain and compressed, sorted by name.

    ``ValueError`` naming both when one results file is there in both forms (``x.csv`` and ``x.csv.gz``): its
    rows would be read twice.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    paths = sorted([*Path(folder).glob("*.csv"), *Path(folder).glob("*.csv" + COMPRESSED_SUFFIX)],
                   key=lambda path: path.name)
    twins = sorted({results_stem(path) for path in paths if path.with_name(path.name + COMPRESSED_SUFFIX).exists()})
    if twins:
        raise ValueError(f"{', '.join(f'{name}.csv and {name}.csv.gz' for name in twins)} in {folder}: one results "
                         "file in both forms, whose rows would be read twice; keep one")
    return [path for path in paths if file_kind(path) == kind]


def load_kind(folder: Path, kind: str) -> tuple[list[Path], pd.DataFrame]:
    """Every results file of ``kind`` in ``folder``, concatenated (empty, with the kind's columns, if none)."""
    paths = paths_of_kind(folder, kind)
    frames = [frame for frame in (read_table(path) for path in paths) if len(frame)]
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(KINDS[kind].columns))
    return paths, table


def done_keys(path: Path) -> set[str]:
    """Keys of the sweep runs ``path`` already holds."""
    return {row["key"] for row in read_rows(path)}


def latest(table: pd.DataFrame, keys: str | list[str]) -> pd.DataFrame:
    """One row per value of ``keys``: the most recently measured (by ``date``; ties keep file order)."""
    return table.sort_values("date", kind="stable").drop_duplicates(keys, keep="last")


def load_results(paths: Iterable[Path]) -> pd.DataFrame:
    """Concatenate sweep files (e.g. the shards of one grid), one row per key (the newest wins)."""
    frames = [read_table(Path(path)) for path in paths if Path(path).exists()]
    frames = [frame for frame in frames if len(frame)]
    if not frames:
        return pd.DataFrame(columns=list(COLUMNS))
    table = pd.concat(frames, ignore_index=True)
    return latest(table, "key").reset_index(drop=True)
