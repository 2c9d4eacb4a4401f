"""pytest setup for every test: Hypothesis profiles and a seeded global RNG (import paths and markers are in
pyproject.toml's [tool.pytest.ini_options])."""

from __future__ import annotations

import os

import torch

# Without CUDA, Triton's kernels (lce.kernels) are tested through its interpreter, which triton reads when its jit
# functions are made: set it before anything (torch.compile included) imports triton, so every triton function of
# the session is interpreted alike. CPU tensors still run the PyTorch ops unless a test asks for the kernels
# (lce.testing.interpreted_kernels).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under a CPU-kind stand-in (oneDNN/MKL capped to an instruction set: analysis.studies.cpu_kinds) torch.compile's
# on-disk cache hands back code compiled in an uncapped process, whose results were garbage there (a target index
# of 4.6e18 in test_autograd's compiled log-probs, 2026-12-06, AMD EPYC; a fresh cache passes): one cache per caps.
_CAPS = "-".join(f"{name}={os.environ[name]}" for name in ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
                                                           "ATEN_CPU_CAPABILITY") if name in os.environ)
if _CAPS and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"torchinductor_lce_{_CAPS}")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# Hypothesis profiles. "ci" (the default, and what CI runs) is deterministic: the same examples
# every run, no example database. "explore" draws fresh random examples each run and keeps the
# failures it finds in .hypothesis/ so they are replayed first next time:
#     HYPOTHESIS_PROFILE=explore make test        (or: make explore)
settings.register_profile("ci", max_examples=500, derandomize=True, database=None, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", max_examples=5000, derandomize=False, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    """Under pytest-xdist (``make test`` runs ``-n auto``) the workers share the cores: one intra-op thread each
    keeps them from oversubscribing the machine. Results do not depend on the thread count."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


@pytest.fixture(autouse=True)
def _native_cpu_gemms():
    """Plans depend on whether this CPU's bf16/fp16 GEMMs are native or emulated (lce.planning.cpu_gemms): in this
    process
    every test plans as on a CPU with native ones, so plans and expectations are the same on every CPU kind (the
    emulated branch is driven by lce.testing.cpu_gemms, tests/lce/test_cpu_gemms.py). Subprocesses -- the CLI,
    notebook kernels, sweep workers -- measure the CPU they run on, as a user's would."""
    from lce.testing import cpu_gemms

    with cpu_gemms("native"):
        yield


@pytest.fixture(autouse=True)
def _seed_everything():
    """Every test starts from the same global RNG state (helpers also use explicit generators)."""
    import torch

    torch.manual_seed(0)
    yield
