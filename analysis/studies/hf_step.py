"""One training step of a Hugging Face causal LM, patched by ``lce.integrations.transformers`` or not: peak memory
and time.

The model (:data:`SETTINGS`): a Llama with a small trunk and Llama 3's vocabulary (128256 classes), fp32
parameters, the step run under ``torch.autocast`` in bf16 (what the ``Trainer``'s ``bf16=True`` does), fused
AdamW (the ``Trainer``'s default optimizer on torch >= 2.8; the for-each AdamW's temporaries, twice the largest
parameters' bytes, would set the peak of every patched step alike and hide what the head's options change).
One step is forward (``model(input_ids, labels=...)``), backward and the optimizer's step. Arms
(:data:`ARMS`): the unpatched model, ``patch(model)`` (lce's default options), ``patch(model,
options="recommend")`` and ``patch(model, options=Recommended(memory_budget=...))`` with the budget
:data:`BUDGET_MULTIPLE` times the head's gradients (input and weight, bf16), and on a GPU Liger-Kernel's own
patch (``apply_liger_kernel_to_llama`` on the instance, its fused linear cross-entropy alone).

Each arm runs in a fresh process per round (so no allocator state or earlier model carries over), the rounds
alternating the arms (a busy spell of the shared machine hits them alike): the process builds the model from
one seed, takes a warm-up step (AdamW allocates its state there), then, in the first round, measures the peak of
one step (:func:`analysis.core.memory.measure_peak`: the profiler's allocator events on CPU, the CUDA
allocator's counters on a GPU; the bytes live before the step -- parameters, optimizer state -- excluded), then
times one step. Rows (kind ``hf_step``): per arm, the median time over the rounds, the peak, their ratios to
the unpatched model measured in the same run, the loss of the measured step, the head's options and lce's
predicted peak for them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
from collections.abc import Sequence

import pandas as pd
import torch

from analysis.paths import ROOT
from lce.planning.options import dtype_name

__all__ = ["StepSetting", "SETTINGS", "ARMS", "DEFAULT_ARMS", "BUDGET_MULTIPLE", "HF_STEP_FILE", "head_budget",
           "build_model", "apply_arm", "measure_arm", "measure", "record"]


@dataclasses.dataclass(frozen=True)
class StepSetting:
    """The model and the batch of one step: a Llama trunk (``hidden``, ``layers``, ``heads``, ``kv_heads``,
    ``intermediate``), ``vocab`` classes, ``batch`` sequences of ``seq_len`` tokens, under autocast to
    ``compute_dtype`` with fp32 parameters."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    batch: int
    seq_len: int
    compute_dtype: str = "bfloat16"
    budget_multiple: float = 1.2
    """The ``lce recommend budget`` arm's budget in multiples of the head's gradients' bytes (:func:`head_budget`)."""

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len


SETTINGS: dict[str, StepSetting] = {
    "cpu": StepSetting(hidden=512, layers=2, heads=8, kv_heads=4, intermediate=1376, vocab=128256, batch=2,
                       seq_len=1024),
    "cuda": StepSetting(hidden=512, layers=2, heads=8, kv_heads=4, intermediate=1376, vocab=128256, batch=8,
                        seq_len=2048),
    # at this tiny head a one-block fp32 temporary is a large share of the gradients: 1.2x fits no plan on a CPU
    "dry-run": StepSetting(hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64, vocab=512, batch=2,
                           seq_len=32, budget_multiple=1.5),
}
"""Per device, the step measured: on this CPU 2048 tokens (one unpatched step takes about 20 s on 2 cores), on
a GPU 16384; ``dry-run``: a tiny stand-in (the GPU check's dry run, the tests)."""

ARMS: tuple[str, ...] = ("unpatched", "lce", "lce recommend", "lce recommend budget", "liger")
"""Every arm: the model as it is, lce's default options, lce.recommend with its default budget and under
:func:`head_budget`, Liger-Kernel's patch (CUDA only)."""
DEFAULT_ARMS: tuple[str, ...] = ARMS[:4]
BUDGET_MULTIPLE = StepSetting.budget_multiple
"""The ``lce recommend budget`` arm's memory budget on the measured settings, in multiples of the head's gradients'
bytes."""
HF_STEP_FILE = "hf_step.csv"
SEED = 0


def head_budget(setting: StepSetting) -> int:
    """The budget of the ``lce recommend budget`` arm: the setting's ``budget_multiple`` times the bytes of the
    head's input and weight gradients in the compute dtype."""
    itemsize = torch.empty((), dtype=getattr(torch, setting.compute_dtype)).itemsize
    return int(setting.budget_multiple * (setting.tokens + setting.vocab) * setting.hidden * itemsize)


def build_model(setting: StepSetting, device: str):
    """The Llama of ``setting``, fp32, seeded, in training mode on ``device``."""
    import transformers

    torch.manual_seed(SEED)
    config = transformers.LlamaConfig(vocab_size=setting.vocab, hidden_size=setting.hidden,
                                      intermediate_size=setting.intermediate, num_hidden_layers=setting.layers,
                                      num_attention_heads=setting.heads, num_key_value_heads=setting.kv_heads,
                                      max_position_embeddings=max(setting.seq_len, 2048), tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(config).to(device).train()


def apply_arm(model, arm: str, setting: StepSetting) -> dict[str, object]:
    """Patch ``model`` as ``arm`` says; returns what the rows record of it (the head's options, the budget)."""
    from lce.integrations.transformers import Recommended, patch

    if arm == "unpatched":
        return {}
    if arm == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama(rope=False, rms_norm=False, swiglu=False, cross_entropy=False,
                                    fused_linear_cross_entropy=True, model=model)
        return {}
    options = {"lce": None, "lce recommend": "recommend",
               "lce recommend budget": Recommended(memory_budget=head_budget(setting))}[arm]
    patch(model, options)
    return {"budget_bytes": head_budget(setting)} if arm == "lce recommend budget" else {}


def _head_options(model, setting: StepSetting, device: str) -> dict[str, object]:
    """The options the patched model's head ran with at this step's shape, and lce's predicted peak for them."""
    import lce

    dtype = getattr(torch, setting.compute_dtype)
    x = torch.empty(setting.tokens, setting.hidden, dtype=dtype, device=device, requires_grad=True)
    weight = torch.empty(setting.vocab, setting.hidden, dtype=dtype, device="meta", requires_grad=True)
    plan = lce.plan(x, weight, options=model.__dict__["_lce_patch"].options_for(x, weight))
    return dict(policy=plan.acc_policy, acc_dtype=dtype_name(plan.acc_dtype), batch_chunk_size=plan.batch_chunk_size,
                class_chunk_size=plan.class_chunk_size, predicted_head_peak_bytes=plan.peak_extra_bytes)


def _batch(setting: StepSetting, device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(SEED + 1)
    ids = torch.randint(0, setting.vocab, (setting.batch, setting.seq_len), generator=g).to(device)
    return dict(input_ids=ids, labels=ids)


def measure_arm(arm: str, setting: StepSetting, device: str, *, memory: bool = True) -> dict[str, object]:
    """In this process: build, patch as ``arm``, a warm-up step, the peak of one step (with ``memory``), the time
    of one more; returns the row's measured columns."""
    from analysis.core.memory import default_method, measure_peak
    from analysis.core.timing import time_call

    model = build_model(setting, device)
    described = apply_arm(model, arm, setting)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    batch = _batch(setting, device)
    dtype = getattr(torch, setting.compute_dtype)
    losses: list[float] = []

    def step() -> None:
        with torch.autocast(torch.device(device).type, dtype=dtype):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())

    step()  # warm-up: AdamW's state, the kernels' first calls
    if arm.startswith("lce"):
        described.update(_head_options(model, setting, device))
    if memory:
        method = default_method(device)
        _, measured = measure_peak(step, method=method, device=device)
        described.update(measured_peak_bytes=measured.peak_bytes, memory_method=method)
    timing = time_call(step, warmup=0, repeats=1, device=device)
    return dict(described, time_s=timing.median_s, loss=losses[1])


def _in_child(arm: str, setting: StepSetting, device: str, memory: bool) -> dict[str, object]:
    """:func:`measure_arm` in a fresh interpreter (``python -m analysis.studies.hf_step REQUEST``)."""
    request = json.dumps({"arm": arm, "setting": dataclasses.asdict(setting), "device": device, "memory": memory})
    done = subprocess.run([sys.executable, "-m", "analysis.studies.hf_step", request], cwd=ROOT, capture_output=True,
                          text=True, check=False, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"hf-step {arm} on {device} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _unavailable(arm: str, device: str) -> str | None:
    import importlib.util

    if arm == "liger" and torch.device(device).type != "cuda":
        return "Liger-Kernel's kernels are Triton, CUDA only"
    if arm == "liger" and importlib.util.find_spec("liger_kernel") is None:
        return "liger_kernel is not installed (make gpu-wheels carries it to a GPU)"
    return None


def measure(setting: StepSetting = SETTINGS["cpu"], device: str = "cpu", arms: Sequence[str] = DEFAULT_ARMS,
            rounds: int = 3, progress: bool = True) -> pd.DataFrame:
    """Every arm in a fresh process per round, rounds alternating the arms; the first round measures the peak
    too. One row per arm: median time over the rounds, the peak, their ratios to ``unpatched`` (if measured)."""
    unknown = [arm for arm in arms if arm not in ARMS]
    if unknown or not arms:
        raise ValueError(f"arms must name some of {ARMS}, got {tuple(arms)}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    runnable = [arm for arm in arms if _unavailable(arm, device) is None]
    results: dict[str, dict[str, object]] = {arm: {} for arm in runnable}
    times: dict[str, list[float]] = {arm: [] for arm in runnable}
    for round_number in range(rounds):
        for arm in runnable:
            measured = _in_child(arm, setting, device, memory=round_number == 0)
            times[arm].append(float(measured.pop("time_s")))
            if round_number == 0:
                results[arm] = measured
            if progress:
                print(f"hf-step round {round_number + 1}/{rounds} {arm}: {times[arm][-1]:.2f} s", flush=True)
    rows = []
    for arm in arms:
        row = dict(arm=arm, model="LlamaForCausalLM", optimizer="AdamW fused", device=device, param_dtype="float32",
                   compute_dtype=setting.compute_dtype, hidden=setting.hidden, layers=setting.layers,
                   vocab=setting.vocab, batch=setting.batch, seq_len=setting.seq_len, tokens=setting.tokens,
                   logits_bytes=setting.tokens * setting.vocab * 4, rounds=rounds)
        reason = _unavailable(arm, device)
        if reason is not None:
            rows.append(dict(row, status="skipped", note=reason))
            continue
        rows.append(dict(row, **results[arm], time_median_s=statistics.median(times[arm]),
                         time_spread_s=max(times[arm]) - min(times[arm]), status="ok"))
    table = pd.DataFrame(rows)
    for column in ("batch_chunk_size", "class_chunk_size", "budget_bytes", "predicted_head_peak_bytes",
                   "measured_peak_bytes"):
        if column in table:
            table[column] = table[column].astype("Int64")
    if "unpatched" in runnable:
        base = table.set_index("arm").loc["unpatched"]
        table["peak_ratio"] = table["measured_peak_bytes"] / base["measured_peak_bytes"]
        table["time_ratio"] = table["time_median_s"] / base["time_median_s"]
        table["loss_diff"] = table["loss"] - base["loss"]
    return table


def record(folder, *, file: str = HF_STEP_FILE, device: str = "cpu", **settings):
    """Measure (``settings``: :func:`measure`'s) and write ``folder/file`` (kind ``hf_step``) with provenance."""
    from analysis.core.results_io import HF_STEP
    from analysis.studies.peers import record_study

    return record_study(folder / file, HF_STEP, measure, provenance_device=device, device=device, **settings)


def _child(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="one arm of the hf-step study (its child process)")
    parser.add_argument("request", help="JSON: arm, setting, device, memory")
    request = json.loads(parser.parse_args(argv).request)
    result = measure_arm(request["arm"], StepSetting(**request["setting"]), request["device"],
                         memory=request["memory"])
    print(json.dumps(result))


if __name__ == "__main__":
    _child()


# ---- python -m analysis hf-step ------------------------------------------------------------------------------

DESCRIPTION = ("One training step (forward, backward, fused AdamW) of a Llama with a 2-layer, 512-wide trunk and a "
               "128256-class head, fp32 parameters under bf16 autocast, 2048 tokens (16384 on a GPU): the model "
               "unpatched, patched by lce.integrations.transformers with lce's default options, with "
               f"options='recommend', and with lce.recommend under {BUDGET_MULTIPLE:g}x the head's gradients, and "
               "Liger-Kernel's patch on a GPU. A fresh process per arm and round, rounds alternating: peak memory "
               "(first round) and the median time (hf_step.csv; about 12 minutes on 2 CPU cores).")


def add_arguments(parser) -> None:
    from analysis.core.arguments import names_of, progress_option, results_option

    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the step runs (default cpu)")
    parser.add_argument("--arms", type=names_of(ARMS), default=None, metavar="ARM[,ARM]",
                        help=f"arms (default: {','.join(DEFAULT_ARMS)}, and liger on cuda)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds, each arm timed once (default 3)")
    parser.add_argument("--dry-run", action="store_true", help="the tiny setting, one round (seconds)")
    parser.add_argument("--file", default=HF_STEP_FILE, help=f"results file name (default {HF_STEP_FILE})")
    progress_option(parser)
    results_option(parser)


def run(args) -> None:
    from analysis.core.arguments import print_study

    setting = SETTINGS["dry-run" if args.dry_run else args.device]
    arms = args.arms or (ARMS if args.device == "cuda" else DEFAULT_ARMS)
    print_study(*record(args.results, file=args.file, device=args.device, setting=setting, arms=arms,
                        rounds=1 if args.dry_run else args.rounds, progress=not args.no_progress))
