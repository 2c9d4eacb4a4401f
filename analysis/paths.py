"""Where the analysis reads and writes: the repository root, results, figures and notebooks."""

from __future__ import annotations

from pathlib import Path

__all__ = ["ROOT", "RESULTS_DIR", "FIGURES_DIR", "NOTEBOOKS_DIR"]

ROOT: Path = Path(__file__).resolve().parent.parent
"""The repository root (the folder holding ``lce/`` and ``analysis/``)."""
RESULTS_DIR: Path = ROOT / "analysis" / "results"
"""Where sweeps and studies write their results files (committed)."""
FIGURES_DIR: Path = ROOT / "figures"
"""Where ``python -m analysis figures`` writes PNG/SVG and ``README.md``."""
NOTEBOOKS_DIR: Path = ROOT / "notebooks"
"""The notebook sources ``NN_name.py`` and their executed ``.ipynb``."""
