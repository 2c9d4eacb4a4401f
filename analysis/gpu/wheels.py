"""The lent GPU's extra packages: Liger-Kernel and Cut Cross-Entropy wheels for its Python, and transformers at
the release constraints.txt pins (the machine's image has an older one), fetched here (``make gpu-wheels``) into
the ignored ``.gpu/wheels`` and unpacked there (the GPU reaches no registry).

transformers' own dependencies (huggingface-hub, tokenizers, safetensors, numpy, ...) are on the GPU machine's
image already (its package list: /work/.library/device/KINDS.md when this was written), so only its wheel
travels: 13 MiB, which with the tracked tree (about 47 MiB) stays inside the 64 MiB a device call carries; the
whole dependency closure (about 44 MiB) would not.
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
    pinned: bool = False
    """Take the release constraints.txt pins (and unpack it over another release the machine has)."""

    @property
    def wheel_prefix(self) -> str:
        """How its wheels' file names begin (a wheel spells ``-`` as ``_``)."""
        return self.name.replace("-", "_") + "-"

    @property
    def requirement(self) -> str:
        """What ``pip download`` is asked for: the name, or ``name==version`` when pinned."""
        return f"{self.name}=={pinned_version(self.name)}" if self.pinned else self.name


GPU_PACKAGES: tuple[GpuPackage, ...] = (GpuPackage("liger-kernel", "liger_kernel", "liger"),
                                        GpuPackage("cut-cross-entropy", "cut_cross_entropy", "cce"),
                                        GpuPackage("transformers", "transformers", "hf", pinned=True))
"""Liger-Kernel and Cut Cross-Entropy: pure-Python packages of Triton kernels; their only dependencies, torch
and Triton, are on the GPU machine already. transformers (pure Python too): the hf-step study and
lce.integrations.transformers at the pinned release."""


def pinned_version(name: str, constraints: Path = ROOT / "constraints.txt") -> str:
    """The version constraints.txt pins ``name`` to (``ValueError`` when it pins none)."""
    for raw in constraints.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.partition("==")[0].strip().lower() == name.lower() and "==" in line:
            return line.partition("==")[2].strip()
    raise ValueError(f"constraints.txt pins no version of {name}")


def installed_version(package: GpuPackage) -> str | None:
    """The version of ``package`` this Python imports, or None when it imports none."""
    if importlib.util.find_spec(package.module) is None:
        return None
    try:
        return importlib.metadata.version(package.name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


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
                      "--python-version", python_version, "--dest", str(folder), package.requirement])
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
    """Unpack the pure-Python wheels of every :data:`GPU_PACKAGES` whose module is not importable yet (a pinned one:
    not at its wheel's version) into ``target`` (what pip would install, without pip or a registry; ``target``
    goes first on the steps' PYTHONPATH); returns one line per package."""
    lines = []
    for package in GPU_PACKAGES:
        wheel = wheel_status(folder)[package.name]
        installed = installed_version(package)
        wheel_version = wheel.name.split("-")[1] if wheel is not None else None
        if installed is not None and not (package.pinned and wheel_version not in (None, installed)):
            lines.append(f"{package.name}: importable already ({installed})")
        elif wheel is None:
            lines.append(f"{package.name}: no wheel in {folder}; {package.op} is skipped")
        elif not wheel.name.endswith("-none-any.whl"):
            lines.append(f"{package.name}: {wheel.name} is not a pure-Python wheel; {package.op} is skipped")
        else:
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(target)
            over = f" over the machine's {installed}" if installed is not None else ""
            lines.append(f"{package.name}: unpacked {wheel.name}{over}")
    return lines


# ---- python -m analysis gpu-wheels ---------------------------------------------------------------------------

DESCRIPTION = ("liger-kernel, cut-cross-entropy and transformers (the release constraints.txt pins), pure-Python "
               "wheels for Python 3.12 without their dependencies (torch, Triton and transformers' own are on the "
               "GPU machine); fails when one has no wheel or they weigh 60 MiB or more (make gpu-wheels).")


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
