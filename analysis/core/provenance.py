"""Where and with what a result was produced: the provenance columns of every CSV row."""

from __future__ import annotations

import datetime
import functools
import os
import platform
import subprocess

import torch

import lce
from analysis.paths import ROOT
from lce.planning.cpu_gemms import describe as describe_cpu_gemms

__all__ = ["PROVENANCE_COLUMNS", "NOT_RECORDED", "ISA_CAPS", "cpu_gemms", "provenance", "cpu_model", "git_revision",
           "device_name", "bf16_gemms", "cpu_kind", "cpu_kinds"]

PROVENANCE_COLUMNS: tuple[str, ...] = ("lce_version", "torch_version", "device_name", "cpu_model", "cpu_gemms",
                                       "num_threads", "git_revision", "date")
"""The columns :func:`provenance` fills, last in every results file. ``cpu_gemms`` says whether the CPU's bf16
and fp16 GEMMs are native or emulated, as lce plans with it (:func:`lce.planning.cpu_gemms.describe`); rows written
before it was recorded say :data:`NOT_RECORDED`."""

NOT_RECORDED = "not recorded"


@functools.cache
def cpu_model() -> str:
    """The CPU's marketing name from ``/proc/cpuinfo`` (``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# Outputs that a run itself rewrites: their changes say nothing about the code that made the data.
_NOT_RUN = (":!analysis/results", ":!figures", ":!notebooks", ":!tests", ":!docs", ":!*.md")
"""What a measurement never executes: generated outputs (results, figures, executed notebooks), the notebooks'
sources, the tests and the prose. An edit there leaves a row's revision clean."""


@functools.cache
def git_revision() -> str:
    """``$LCE_LAB_REVISION`` when set (a copy of the tree sent to another machine, whose ``.git`` may not name the
    revision sent), else ``git rev-parse --short HEAD`` with
    ``-dirty`` if tracked files that a measurement runs changed (anything but :data:`_NOT_RUN`); ``unknown``
    outside git."""
    sent = os.environ.get("LCE_LAB_REVISION")
    if sent:
        return sent
    try:
        revision = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                                  text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *_NOT_RUN],
                               cwd=ROOT, capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return revision + ("-dirty" if dirty else "")


def device_name(device: str) -> str:
    """The GPU's name for ``"cuda"`` and ``"cuda-tf32"``, else the CPU model (``"cuda-emulated"`` runs on the CPU)."""
    if device in ("cuda", "cuda-tf32") and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return cpu_model()


ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY")
"""Environment variables that limit the instruction sets torch's CPU back ends use (the AVX2 and AVX512F stand-ins
of ``python -m analysis cpu-kinds --avx2-stand-in | --avx512f-stand-in``): a row measured under them says so."""


def cpu_gemms() -> str:
    """The ``cpu_gemms`` column: :func:`lce.planning.cpu_gemms.describe`, and the ISA caps of the environment if any."""
    caps = " ".join(f"{name}={os.environ[name]}" for name in ISA_CAPS if name in os.environ)
    return describe_cpu_gemms() + (f"; ISA capped: {caps}" if caps else "")


def provenance(device: str) -> dict[str, str]:
    """The provenance columns (:data:`PROVENANCE_COLUMNS`) for a run on ``device``."""
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    values = (lce.__version__, torch.__version__, device_name(device), cpu_model(), cpu_gemms(),
              str(torch.get_num_threads()), git_revision(), date)
    return dict(zip(PROVENANCE_COLUMNS, values, strict=True))


def bf16_gemms(cpu_gemms_value: str) -> str:
    """How a row's CPU ran bf16 GEMMs, from its ``cpu_gemms`` column: "native", "slow", "emulated" or
    :data:`NOT_RECORDED`."""
    for part in str(cpu_gemms_value).split(";")[0].split(","):
        words = part.split()
        if len(words) >= 2 and words[0] == "bfloat16":
            return words[1]
    return NOT_RECORDED


def _stand_in(cpu_gemms_value: str) -> str:
    """", AVX2 stand-in", ", AVX512F stand-in" or ", ISA capped" for a row measured under ISA caps (else "")."""
    _, capped, caps = cpu_gemms_value.partition("ISA capped:")
    if not capped:
        return ""
    if "ONEDNN_MAX_CPU_ISA=AVX512_CORE" in caps:
        return ", AVX512F stand-in"
    return ", AVX2 stand-in" if "AVX2" in caps else ", ISA capped"


def cpu_kind(cpu_model_value: str, cpu_gemms_value: str, inferred: str | None = None) -> str:
    """A CPU kind as the README's tables name it: the model, which stand-in if ISA capped, and how its
    bf16 GEMMs run. ``inferred`` stands in for the support of rows written before it was recorded, with the
    evidence it was inferred from (for example "native, by its bf16 GEMM floor")."""
    support = bf16_gemms(cpu_gemms_value)
    if support == NOT_RECORDED:
        support = inferred or "not recorded"
    stand_in = _stand_in(str(cpu_gemms_value))
    return f"{cpu_model_value}{stand_in} (bf16 GEMMs {support})"


def cpu_kinds(table, bench=None):
    """Each row's :func:`cpu_kind` as a Series on ``table``'s index. Rows from before the capability was recorded
    take it from the ``bench`` rows of their CPU model that did not record it either: bf16 GEMMs native where their
    bf16 3-GEMM floor beat fp32's (otherwise "not recorded")."""
    import pandas as pd

    inferred: dict[str, str] = {}
    if bench is not None and not bench.empty:
        old = bench[(bench["cpu_gemms"] == NOT_RECORDED) & (bench["impl"] == "3-GEMM floor")
                    & (bench["metric"] == "time_s")]
        floor = old.groupby(["cpu_model", "dtype"])["value"].median()
        inferred = {model: "native, by its bf16 GEMM floor" for model in old["cpu_model"].unique()
                    if floor.get((model, "bfloat16"), float("inf")) < floor.get((model, "float32"), 0.0)}
    return pd.Series([cpu_kind(model, gemms, inferred.get(model)) for model, gemms
                      in zip(table["cpu_model"], table["cpu_gemms"], strict=True)], index=table.index, dtype=object)
