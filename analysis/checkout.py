"""Put this checkout on the running interpreter's path, for good: ``python analysis/checkout.py``.

``pip install`` of the project installs the library ``lce`` only; the research code (``analysis``) and the
tests' helpers run from a checkout. ``make setup`` runs this file after the install, so that the venv's
interpreter imports ``analysis`` from any folder (the notebooks' kernel starts in ``notebooks/``); a conda
environment built from ``environment.yml`` runs it once by hand. It writes ``lce-lab-checkout.pth`` (the
checkout's path) into the interpreter's site-packages and prints where.
"""

from __future__ import annotations

import site
import sys
from pathlib import Path

PTH_NAME = "lce-lab-checkout.pth"


def install(root: Path) -> Path:
    """Write the ``.pth`` naming ``root`` into the first site-packages folder; return its path."""
    folder = Path(site.getsitepackages()[0]) if hasattr(site, "getsitepackages") else Path(site.getusersitepackages())
    path = folder / PTH_NAME
    path.write_text(f"{root.resolve()}\n", encoding="utf-8")
    return path


if __name__ == "__main__":
    written = install(Path(__file__).resolve().parent.parent)
    print(f"{written}: {sys.executable} now imports analysis from {written.read_text().strip()}")
