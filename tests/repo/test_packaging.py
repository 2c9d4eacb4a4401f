"""What `pip install` gives a user of lce (issue 33): the library with its type marker, and no top-level
`analysis` package; the research code still imports from a checkout (analysis/checkout.py, run by make setup)."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from analysis.paths import ROOT


@pytest.mark.slow
def test_the_wheel_holds_the_library_alone(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("lce_lab-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"lce"}, top
    assert "lce/py.typed" in names and "lce/decide/error_model.json" in names
    assert "lce/integrations/transformers.py" in names


def test_the_checkout_writes_its_path_for_the_interpreter(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "analysis"))
    try:
        import checkout
    finally:
        sys.path.pop(0)
    monkeypatch.setattr(checkout.site, "getsitepackages", lambda: [str(tmp_path)])
    written = checkout.install(ROOT)
    assert written == tmp_path / "lce-lab-checkout.pth"
    assert written.read_text().strip() == str(ROOT.resolve())
