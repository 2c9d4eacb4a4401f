"""lce and analysis stay within the torch range pyproject.toml declares (torch>=2.11; development runs 2.13).

What this checks, and what it cannot:

* a static scan (ast) of every module in ``lce/`` and ``analysis/`` for the torch names known to be newer
  than the declared minimum (:data:`NEWER_NAMES`, each with the release that brought it): every use must be
  guarded -- looked up with ``getattr(..., name, None)``, or inside a function that tests
  ``hasattr(..., name)``, or in a function that only runs after such a test elsewhere (:data:`GUARDED_BY`,
  each with the guard named);
* a run with those names removed from torch (monkeypatched, as on torch 2.11): lce's op in every policy, and
  the analysis recording torch's op as skipped, not failed;
* lce's public-API suites (:data:`API_SUITES`) run in a subprocess with those names deleted from torch: they
  pass, their comparisons with torch's op skipping.

It cannot see a name that is missing from :data:`NEWER_NAMES`, a keyword argument or behaviour an older torch
lacks (``torch.mm(out_dtype=...)`` is one: lce.passes.gemm falls back when it raises), nor run the suite on a real
torch 2.11; the GPU check (python -m analysis gpu-check) runs lce there.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.version import Version

import lce
from analysis.core.implementations import unavailable_reason
from analysis.gpu.check import API_TEST_FILES as API_SUITES
from analysis.paths import ROOT

DECLARED_MINIMUM = Version("2.11")
NEWER_NAMES: dict[str, str] = {
    "linear_cross_entropy": "2.13",  # torch.nn.functional
    "LinearCrossEntropyOptions": "2.13",  # torch.nn
    "LinearCrossEntropyLoss": "2.13",  # torch.nn
}
"""torch names newer than :data:`DECLARED_MINIMUM`, with the release that brought them."""

GUARDED_BY: dict[tuple[str, str], str] = {
    ("analysis/core/implementations.py", "_torch_loss"):
        "make_implementation refuses op 'torch' when unavailable_reason finds no "
        "torch.nn.functional.linear_cross_entropy",
    ("analysis/studies/loss_scale.py", "_chunked_gradients"):
        "contenders adds the 'torch' contender only when torch.nn.functional has linear_cross_entropy",
}
"""(file, function) -> the guard that runs before it, for uses guarded by their caller."""

_TORCH_BASES = {"torch.nn.functional", "torch.nn", "F", "nn", "functional"}


def test_pyproject_declares_the_minimum_this_test_checks():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_requirement = next(Requirement(d) for d in project["dependencies"] if Requirement(d).name == "torch")
    assert torch_requirement.specifier.contains(str(DECLARED_MINIMUM)), torch_requirement
    assert not torch_requirement.specifier.contains("2.10"), torch_requirement
    assert all(Version(release) > DECLARED_MINIMUM for release in NEWER_NAMES.values())


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _guards(scope: ast.AST) -> set[str]:
    """Names a scope tests for: ``hasattr(x, "name")`` or ``getattr(x, "name", default)``."""
    names = set()
    for node in ast.walk(scope):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and (node.func.id == "hasattr" or len(node.args) == 3)):
            names.add(node.args[1].value)
    return names


def unguarded_uses(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line name`` of every use of a :data:`NEWER_NAMES` name on a torch module that nothing guards."""
    tree = ast.parse(path.read_text(), filename=str(path))
    relative = path.relative_to(root).as_posix()
    found = []

    def visit(node: ast.AST, functions: list[ast.AST]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = functions + [child] if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else functions
            if (isinstance(child, ast.Attribute) and child.attr in NEWER_NAMES
                    and _dotted(child.value) in _TORCH_BASES):
                guarded = any(child.attr in _guards(function) for function in functions)
                guarded |= any((relative, f.name) in GUARDED_BY for f in functions)
                if not guarded:
                    found.append(f"{relative}:{child.lineno} {_dotted(child)}")
            visit(child, inner)

    visit(tree, [])
    return found


def test_lce_and_analysis_guard_every_torch_name_newer_than_the_minimum():
    files = sorted([*(ROOT / "lce").rglob("*.py"), *(ROOT / "analysis").rglob("*.py")])
    assert len(files) > 40
    problems = [use for path in files for use in unguarded_uses(path)]
    assert not problems, "unguarded uses of torch names newer than 2.11:\n" + "\n".join(problems)


def test_the_scan_finds_an_unguarded_use(tmp_path):
    module = tmp_path / "probe.py"
    module.write_text("import torch.nn.functional as F\n\ndef f(x):\n    return F.linear_cross_entropy(x)\n\n"
                      "def g(x):\n    if hasattr(F, 'linear_cross_entropy'):\n"
                      "        return F.linear_cross_entropy(x)\n\n"
                      "def h(x):\n    return lce.linear_cross_entropy(x)\n")
    assert unguarded_uses(module, tmp_path) == ["probe.py:4 F.linear_cross_entropy"]


@pytest.fixture
def torch_2_11(monkeypatch):
    """torch without the names torch 2.11 lacks."""
    monkeypatch.delattr(torch.nn.functional, "linear_cross_entropy", raising=False)
    monkeypatch.delattr(torch.nn, "LinearCrossEntropyOptions", raising=False)
    monkeypatch.delattr(torch.nn, "LinearCrossEntropyLoss", raising=False)


@pytest.mark.parametrize("policy", ["auto", "accurate", "balanced", "compact"])
def test_lce_runs_without_the_newer_names(torch_2_11, policy):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, 8, generator=g, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(40, 8, generator=g, dtype=torch.bfloat16, requires_grad=True)
    y = torch.randint(0, 40, (24,), generator=g)
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, batch_chunk_size=5)
    loss = lce.linear_cross_entropy(x, w, y, options=options)
    loss.backward()
    assert torch.isfinite(loss) and w.grad is not None
    assert lce.LinearCrossEntropyLoss(8, 40)(x.detach().float(), y).isfinite()
    with pytest.raises(RuntimeError, match="has no torch.nn.LinearCrossEntropyOptions"):
        options.to_torch()


def test_the_analysis_skips_torchs_op_without_it(torch_2_11):
    assert "has no torch.nn.functional.linear_cross_entropy" in unavailable_reason("torch", "cpu")
    assert unavailable_reason("lce", "cpu") is None



_WITHOUT_NEWER_NAMES = """
import sys, torch, torch.nn, torch.nn.functional
for module in (torch.nn.functional, torch.nn):
    for name in {names!r}:
        if hasattr(module, name):
            delattr(module, name)
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
"""


@pytest.mark.slow
def test_the_api_suites_pass_without_the_newer_names():
    import subprocess
    import sys

    script = _WITHOUT_NEWER_NAMES.format(names=tuple(NEWER_NAMES))
    done = subprocess.run([sys.executable, "-c", script, *API_SUITES], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "skipped" in summary and "failed" not in summary, summary
