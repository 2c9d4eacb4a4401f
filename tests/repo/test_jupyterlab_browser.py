"""A reader opens every committed notebook in JupyterLab and leaves it open: nothing is rewritten.

This drives a real JupyterLab (the venv's, with the kernel ``make setup`` registers) from headless
Chromium at a 1440 px window, as a reader of a fresh clone would, waits past JupyterLab's
two-minute autosave, and requires ``git status`` of the clone to stay clean. Playwright (the
``browser`` extra, part of ``dev``) drives Debian's ``chromium``, so nothing is downloaded. It takes
about three minutes and starts a server, so it runs only when asked (``make check-lab``, which sets
``LCE_BROWSER_TESTS=1``) and skips otherwise, CI included:

    apt-get install chromium && make check-lab
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
AUTOSAVE_S = 120  # JupyterLab's default autosave interval

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("LCE_BROWSER_TESTS") != "1", reason="runs on request: make check-lab"),
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)"),
]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_until_serving(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"JupyterLab did not answer at {url} within {timeout_s} s")


def test_opening_every_notebook_in_jupyterlab_leaves_git_status_clean(tmp_path):
    playwright = pytest.importorskip("playwright.sync_api", reason="needs the browser extra (Playwright)")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}",
         "--ServerApp.ip=127.0.0.1", "--IdentityProvider.token=", "--ServerApp.password=",
         f"--ServerApp.root_dir={clone}", f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_until_serving(f"http://127.0.0.1:{port}/lab")
        names = sorted(path.name for path in (clone / "notebooks").glob("*.ipynb"))
        assert names, "no committed notebooks"
        with playwright.sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=CHROMIUM, args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run"])
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            for name in names:
                page.goto(f"http://127.0.0.1:{port}/lab/tree/notebooks/{name}")
                page.wait_for_function(f"document.title.startsWith({name[:8]!r})", timeout=60_000)
                page.wait_for_selector(".jp-Notebook", state="attached", timeout=60_000)
                time.sleep(5)  # the kernel starts and reports its language_info
            time.sleep(AUTOSAVE_S + 30)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    status = subprocess.run(["git", "-C", str(clone), "status", "--porcelain"], capture_output=True, text=True,
                            check=True).stdout
    assert status == "", f"JupyterLab rewrote committed files on opening them:\n{status}"
