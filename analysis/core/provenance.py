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

__all__ = ["PROVENANCE_COLUMNS", "provenance", "cpu_model", "git_revision", "device_name"]

PROVENANCE_COLUMNS: tuple[str, ...] = ("lce_version", "torch_version", "device_name", "cpu_model", "num_threads",
                                       "git_revision", "date")
"""The columns :func:`provenance` fills, last in every results file."""


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
_GENERATED = (":!analysis/results", ":!figures", ":!notebooks/*.ipynb")


@functools.cache
def git_revision() -> str:
    """``$LCE_LAB_REVISION`` when set (a copy of the tree sent to another machine: a lent GPU's copy carried a
    stale ``.git`` that named the session's first commit), else ``git rev-parse --short HEAD`` with
    ``-dirty`` if tracked files other than generated outputs (results, figures, executed notebooks)
    changed; ``unknown`` outside git."""
    sent = os.environ.get("LCE_LAB_REVISION")
    if sent:
        return sent
    try:
        revision = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                                  text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *_GENERATED],
                               cwd=ROOT, capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return revision + ("-dirty" if dirty else "")


def device_name(device: str) -> str:
    """The GPU's name for ``"cuda"`` and ``"cuda-tf32"``, else the CPU model (``"cuda-emulated"`` runs on the CPU)."""
    if device in ("cuda", "cuda-tf32") and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return cpu_model()


def provenance(device: str) -> dict[str, str]:
    """The provenance columns (:data:`PROVENANCE_COLUMNS`) for a run on ``device``."""
    values = (lce.__version__, torch.__version__, device_name(device), cpu_model(), str(torch.get_num_threads()),
              git_revision(), datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
    return dict(zip(PROVENANCE_COLUMNS, values, strict=True))
