"""Where the analysis reads and writes: the repository root, the results files and the figures."""

from __future__ import annotations

from pathlib import Path

__all__ = ["ROOT", "RESULTS_DIR", "FIGURES_DIR"]

ROOT: Path = Path(__file__).resolve().parent.parent
"""The repository root (the folder holding ``lce/`` and ``analysis/``)."""
RESULTS_DIR: Path = ROOT / "analysis" / "results"
"""Where sweeps and studies write their results files (committed)."""
FIGURES_DIR: Path = ROOT / "figures"
"""Where ``python -m analysis figures`` writes PNG/SVG and ``README.md``."""
