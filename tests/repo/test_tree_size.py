"""The checkout stays small enough to copy to a GPU machine: the tree and the GPU check's wheels (10-20 MiB,
``make gpu-wheels``) travel together within 64 MiB, so the files git tracks stay under 40 MiB.

What keeps them there: each figure is one PNG at 100 pixels per inch (``analysis/report/figures.py``), the large
results files are ``<name>.csv.gz`` (``analysis/core/results_io.py``) and the head dumps compressed byte planes
(``analysis/core/head_dumps.py``). When this fails, look at the largest files the message lists."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from analysis.paths import ROOT

LIMIT_BYTES = 40 * 2**20
"""The most the tracked files may take (``git ls-files -z | xargs -0 du -cb``)."""


def _git_files(root: Path) -> list[Path] | None:
    """The files of ``root``'s checkout that a copy of its working tree carries: tracked ones, and untracked ones git
    does not ignore (not yet added, but on their way); None when ``root`` is not a git checkout."""
    try:
        command = ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
        listed = subprocess.run(command, capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    names = dict.fromkeys(name for name in listed.stdout.decode("utf-8").split("\0") if name)
    return [root / name for name in names]


def _bytes(path: Path) -> int:
    """The size ``du -b`` counts for ``path`` (a link's own size); 0 for a tracked file deleted in the work tree."""
    return path.lstat().st_size if path.is_symlink() or path.exists() else 0


def test_the_tracked_files_stay_under_40_mib():
    files = _git_files(ROOT)
    if files is None:
        pytest.skip(f"{ROOT} is not a git checkout (or git is missing): nothing to measure")
    sizes = sorted(((_bytes(path), path) for path in files), reverse=True)
    total = sum(size for size, _ in sizes)
    largest = ", ".join(f"{path.relative_to(ROOT)} {size / 2**20:.1f} MiB" for size, path in sizes[:8])
    assert total < LIMIT_BYTES, (f"the checkout's files take {total / 2**20:.1f} MiB, more than "
                                 f"{LIMIT_BYTES / 2**20:.0f} MiB; largest: {largest}")


def test_the_measure_skips_outside_a_checkout(tmp_path):
    assert _git_files(tmp_path) is None
