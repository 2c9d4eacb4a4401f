"""The lent GPU's extra packages: Liger-Kernel and Cut Cross-Entropy wheels for its Python, fetched here
(``make gpu-wheels``) into the ignored ``.gpu/wheels`` and unpacked there (the GPU reaches no registry).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

from analysis.paths import ROOT

# --------------------------------------------------------------------------------------------- wheels

WHEELS_DIR = ROOT / ".gpu" / "wheels"
WHEELS_LIMIT_BYTES = 60 * 2**20
"""What the wheels may weigh: the device tool carries 64 MiB per call, the working tree included."""
GPU_PYTHON = "3.12"


@dataclasses.dataclass(frozen=True)
class GpuPackage:
    """A package the GPU machine lacks: its distribution name (pip's), its module, the op that needs it."""

    name: str
    module: str
    op: str

    @property
    def wheel_prefix(self) -> str:
        """How its wheels' file names begin (a wheel spells ``-`` as ``_``)."""
        return self.name.replace("-", "_") + "-"


GPU_PACKAGES: tuple[GpuPackage, ...] = (GpuPackage("liger-kernel", "liger_kernel", "liger"),
                                        GpuPackage("cut-cross-entropy", "cut_cross_entropy", "cce"))
"""Liger-Kernel and Cut Cross-Entropy: pure-Python packages of Triton kernels; their only dependencies, torch
and Triton, are on the GPU machine already."""


def wheel_status(folder: Path = WHEELS_DIR) -> dict[str, Path | None]:
    """Each :data:`GPU_PACKAGES` name -> its newest wheel in ``folder``, or None when missing."""
    found: dict[str, Path | None] = {}
    for package in GPU_PACKAGES:
        wheels = sorted(Path(folder).glob(f"{package.wheel_prefix}*.whl")) if Path(folder).is_dir() else []
        found[package.name] = wheels[-1] if wheels else None
    return found


def _folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in Path(folder).glob("*.whl"))


def download_wheels(folder: Path = WHEELS_DIR, *, python_version: str = GPU_PYTHON,
                    limit_bytes: int = WHEELS_LIMIT_BYTES,
                    runner: Callable[[list[str]], subprocess.CompletedProcess] | None = None) -> list[str]:
    """Download a wheel of each :data:`GPU_PACKAGES` for the GPU machine's Python into ``folder``.

    ``pip download --no-deps --only-binary=:all: --python-version`` (torch and Triton are there already).
    Returns one line per package saying what happened; raises ``RuntimeError`` naming every package with
    no wheel, and when the folder's wheels weigh ``limit_bytes`` or more (what the device tool carries).
    ``runner`` replaces ``subprocess.run`` (tests).
    """
    run = runner or (lambda command: subprocess.run(command, capture_output=True, text=True, check=False))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lines, missing = [], []
    for package in GPU_PACKAGES:
        result = run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                      "--python-version", python_version, "--dest", str(folder), package.name])
        wheel = wheel_status(folder)[package.name]
        if result.returncode != 0 or wheel is None:
            reason = (result.stderr or result.stdout or "").strip().splitlines()
            missing.append(package.name)
            lines.append(f"{package.name}: NO WHEEL for Python {python_version} "
                         f"({reason[-1] if reason else 'pip found none'}); the check will skip {package.op}")
        else:
            lines.append(f"{package.name}: {wheel.name} ({wheel.stat().st_size / 2**20:.2f} MiB)")
    total = _folder_bytes(folder)
    lines.append(f"{folder}: {total / 2**20:.2f} MiB of wheels (limit {limit_bytes / 2**20:.0f} MiB)")
    problems = []
    if missing:
        problems.append(f"no wheel could be downloaded for {', '.join(missing)}")
    if total >= limit_bytes:
        problems.append(f"the wheels weigh {total / 2**20:.1f} MiB, at or above the {limit_bytes / 2**20:.0f} MiB "
                        "limit the device tool carries")
    if problems:
        raise RuntimeError("; ".join(problems) + "\n" + "\n".join(lines))
    return lines


def unpack_wheels(folder: Path, target: Path) -> list[str]:
    """Unpack the pure-Python wheels of every :data:`GPU_PACKAGES` whose module is not importable yet into
    ``target`` (what pip would install, without pip or a registry); returns one line per package."""
    lines = []
    for package in GPU_PACKAGES:
        wheel = wheel_status(folder)[package.name]
        if importlib.util.find_spec(package.module) is not None:
            lines.append(f"{package.name}: importable already")
        elif wheel is None:
            lines.append(f"{package.name}: no wheel in {folder}; {package.op} is skipped")
        elif not wheel.name.endswith("-none-any.whl"):
            lines.append(f"{package.name}: {wheel.name} is not a pure-Python wheel; {package.op} is skipped")
        else:
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(target)
            lines.append(f"{package.name}: unpacked {wheel.name}")
    return lines


# ---- python -m analysis gpu-wheels ---------------------------------------------------------------------------

DESCRIPTION = ("liger-kernel and cut-cross-entropy, pure-Python wheels for Python 3.12 without their dependencies "
               "(torch and Triton are on the GPU machine); fails when one has no wheel or they weigh 60 MiB or "
               "more (make gpu-wheels).")


def add_arguments(parser) -> None:
    from analysis.paths import display_path

    parser.add_argument("--dest", type=Path, default=WHEELS_DIR,
                        help=f"folder (default: {display_path(WHEELS_DIR)}, ignored by git)")


def run(args) -> int:
    try:
        lines = download_wheels(args.dest)
    except RuntimeError as error:
        print(f"gpu-wheels: {error}")
        return 1
    print("\n".join(lines))
    return 0
