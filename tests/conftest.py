"""pytest setup for the lce tests: import paths, determinism, markers."""

from __future__ import annotations

import os
import sys

import pytest

_TESTS = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_TESTS)
for _p in (_ROOT, _TESTS):  # `import lce` and `import helpers` regardless of import mode
    if _p not in sys.path:
        sys.path.insert(0, _p)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running accuracy checks (still run by default)")


@pytest.fixture(autouse=True)
def _seed_everything():
    """Every test starts from the same global RNG state (helpers also use explicit generators)."""
    import torch

    torch.manual_seed(0)
    yield
