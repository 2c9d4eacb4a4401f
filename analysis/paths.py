"""Where the analysis reads and writes: the repository root, the results files and the figures."""

from __future__ import annotations

from pathlib import Path

__all__ = ["ROOT", "RESULTS_DIR", "FIGURES_DIR", "LM_DATA_DIR", "LM_CACHE_DIR", "display_path"]

ROOT: Path = Path(__file__).resolve().parent.parent
"""The repository root (the folder holding ``lce/`` and ``analysis/``)."""
RESULTS_DIR: Path = ROOT / "analysis" / "results"
"""Where sweeps and studies write their results files (committed)."""
FIGURES_DIR: Path = ROOT / "figures"
"""Where ``python -m analysis figures`` writes a PNG per figure and ``README.md``."""
LM_DATA_DIR: Path = ROOT / "analysis" / "data" / "lm"
"""The small language model's head dumps ``(x, W, y)`` and their metadata (committed; ``python -m analysis lm``)."""
LM_CACHE_DIR: Path = ROOT / "analysis" / "cache" / "lm"
"""The language model pipeline's tokenizer, token streams and checkpoints (ignored by git; safe to delete)."""


def display_path(path: Path) -> str:
    """``path`` relative to :data:`ROOT` when it lies inside the repository (as README files cite it), else as is."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)
