"""The layout the READMEs describe is the tree's: every package folder is named in both, and imports run one way
(core <- sweep/studies/lm <- judge <- report <- cli, gpu beside report), so no module imports upward."""

from __future__ import annotations

import ast

from analysis.paths import ROOT

ANALYSIS = ROOT / "analysis"
LEVEL = {"paths": 0, "checkout": 0, "core": 1, "lm": 2, "sweep": 2, "studies": 2, "judge": 3, "report": 4, "gpu": 4,
         "reproduce": 5, "cli": 6, "__main__": 7}
"""How high each top-level part of analysis/ stands: a module may import only parts at its level or below
(``studies`` and ``sweep`` side by side; a study names grids, never a report)."""


def _packages() -> list[str]:
    return sorted(p.name for p in ANALYSIS.iterdir() if (p / "__init__.py").exists())


def _part(module: str) -> str:
    return module.split(".")[1] if module.count(".") else "analysis"


def test_every_analysis_folder_is_in_both_layout_sections():
    layout = (ROOT / "docs" / "code-layout.md").read_text(encoding="utf-8")
    table = (ANALYSIS / "README.md").read_text(encoding="utf-8")
    for package in _packages():
        assert f"analysis/{package}/" in layout, f"docs/code-layout.md does not name analysis/{package}/"
        assert f"`{package}/`" in table, f"analysis/README.md's layout table does not name {package}/"
    folders = [p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and not p.name.startswith((".", "_"))]
    for folder in sorted(folders):
        assert f"tests/{folder}/" in layout, f"docs/code-layout.md does not name tests/{folder}/"


def test_analysis_imports_run_one_way():
    every_part = set(_packages()) | {p.stem for p in ANALYSIS.glob("*.py")}
    assert every_part <= set(LEVEL) | {"__init__"}, f"a new part of analysis/ needs a level: {every_part - set(LEVEL)}"
    upward = []
    for path in ANALYSIS.rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        mine = module.split(".")[1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("analysis."):
                theirs = node.module.split(".")[1]
                if theirs in LEVEL and mine in LEVEL and LEVEL[theirs] > LEVEL[mine]:
                    upward.append(f"{module} imports {node.module}")
    assert not upward, "imports that run upward:\n" + "\n".join(upward)


def test_lce_never_imports_the_analysis():
    for path in (ROOT / "lce").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            assert not any(name.split(".")[0] in {"analysis", "pandas", "matplotlib"} for name in names), path


def test_lce_imports_an_integrations_library_only_when_it_is_used():
    """``import lce`` needs torch alone: no lce module imports lce.integrations, and an integration imports its
    library (transformers, ...) inside the functions that use it, never at module level."""
    import sys

    for path in (ROOT / "lce").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                assert "integrations" not in (node.module or "").split("."), f"{path.name} imports {node.module}"
    allowed = set(sys.stdlib_module_names) | {"__future__", "torch"}
    integrations = sorted((ROOT / "lce" / "integrations").glob("*.py"))
    assert [path.name for path in integrations] == ["__init__.py", "transformers.py", "trl.py"]
    for path in integrations:
        for node in ast.parse(path.read_text(encoding="utf-8")).body:  # module level only
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            assert all(name.split(".")[0] in allowed for name in names), f"{path.name} imports {names} at module level"


LCE_LEVEL = {"errors": 0, "checks": 0, "compiler": 0, "unfused": 0, "kernels": 0, "planning": 1, "passes": 2,
             "autocasting": 2, "autograd": 3, "functional": 4, "logprobs": 5, "modules": 5, "decide": 6,
             "testing": 6, "distributed": 7, "integrations": 7, "__init__": 8}
"""How high each top-level part of lce/ stands (docs/code-layout.md draws it): planning (what a call will run) under
the passes (how it runs) under autograd and the entry points, the decision procedure above them (recommend times
candidates through the op), vocab-parallel and the integrations on top. A module imports only parts at its level or
below; ``kernels`` is a leaf that the planner asks about and the passes launch."""


def _lce_imports() -> list[tuple[str, str]]:
    """Every (importing module, imported lce module) pair of lce/, relative imports resolved, in-function ones too."""
    pairs = []
    for path in (ROOT / "lce").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package[: len(package) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                names = [*([base] if node.module else []), *(f"{base}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            pairs += [(module, name) for name in names if name == "lce" or name.startswith("lce.")]
    return pairs


def _lce_part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_lce_imports_run_one_way():
    every_part = {p.name for p in (ROOT / "lce").iterdir() if (p / "__init__.py").exists()} | {
        p.stem for p in (ROOT / "lce").glob("*.py")}
    assert every_part <= set(LCE_LEVEL), f"a new part of lce/ needs a level: {every_part - set(LCE_LEVEL)}"
    upward = [f"{mine} imports {theirs}" for mine, theirs in _lce_imports()
              if LCE_LEVEL[_lce_part(theirs)] > LCE_LEVEL[_lce_part(mine)]]
    assert not upward, "imports that run upward:\n" + "\n".join(sorted(set(upward)))


def test_lce_modules_import_each_other_in_no_circle():
    """Within a level too: no module of lce reaches itself through its imports (TYPE_CHECKING ones included)."""
    graph: dict[str, set[str]] = {}
    for mine, theirs in _lce_imports():
        graph.setdefault(mine, set()).add(theirs)
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
               for p in (ROOT / "lce").rglob("*.py")}
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if target == module or target not in modules:  # a name imported from a module, not a module
                continue
            if state.get(target) == 1:
                return [*path, module, target]
            if state.get(target) is None and (circle := visit(target, [*path, module])):
                return circle
        state[module] = 2
        return None

    for module in sorted(graph):
        if state.get(module) is None:
            circle = visit(module, [])
            assert circle is None, "an import circle: " + " -> ".join(circle)


def test_no_library_module_imports_lce_testing_and_no_integration_a_private_name():
    """lce.testing is for tests and studies; an integration reaches lce through its public names."""
    for mine, theirs in _lce_imports():
        assert theirs != "lce.testing" or mine == "lce.testing", f"{mine} imports lce.testing"
    for path in (ROOT / "lce" / "integrations").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                private = [alias.name for alias in node.names if alias.name.startswith("_")]
                assert not private, f"{path.name} imports {private} from {node.module}"
