"""The setup files agree with each other.

environment.yml, constraints.txt, pyproject.toml and the Makefile describe
the same environment in four places; these tests keep them in step. They
only read files (no torch import, no make, no network), so they are fast.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PROJECT = canonicalize_name("lce-lab")

# Targets the README and .ci/run rely on.
REQUIRED_TARGETS = {"help", "setup", "demo", "lint", "test", "lab", "figures", "reproduce", "clean"}
# Targets that must install the project first (everything but help/clean).
INSTALLING_TARGETS = REQUIRED_TARGETS - {"help", "clean"}


# ---------------------------------------------------------------- loaders


@pytest.fixture(scope="module")
def pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


@pytest.fixture(scope="module")
def env() -> dict:
    with open(ROOT / "environment.yml") as f:
        return yaml.safe_load(f)


@pytest.fixture(scope="module")
def pip_lines(env) -> list[str]:
    sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(sections) == 1, "environment.yml must have exactly one pip: section"
    return [str(line).strip() for line in sections[0]]


@pytest.fixture(scope="module")
def constraints() -> dict[str, Requirement]:
    reqs = {}
    for raw in (ROOT / "constraints.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            reqs[canonicalize_name(req.name)] = req
    return reqs


@pytest.fixture(scope="module")
def makefile() -> str:
    return (ROOT / "Makefile").read_text()


def extras_closure(optional: dict[str, list[str]], start: set[str]) -> set[str]:
    """Extras reached from `start`, following `lce-lab[...]` self-references."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        assert extra in optional, f"extra {extra!r} is not defined in pyproject"
        seen.add(extra)
        for spec in optional[extra]:
            req = Requirement(spec)
            if canonicalize_name(req.name) == PROJECT:
                todo.extend(req.extras)
    return seen


def editable_extras(line: str) -> set[str] | None:
    """Extras of an `-e .[a,b]` pip line, or None if it is not an editable install of `.`."""
    m = re.fullmatch(r"""(?:-e|--editable)\s+['"]?\.(?:\[([^\]]*)\])?['"]?""", line)
    if m is None:
        return None
    return {e.strip() for e in (m.group(1) or "").split(",") if e.strip()}


def exact_pin(req: Requirement) -> Version:
    specs = list(req.specifier)
    assert len(specs) == 1 and specs[0].operator in ("==", "==="), f"{req} is not an exact pin"
    assert "*" not in specs[0].version, f"{req} is a wildcard, not an exact pin"
    return Version(specs[0].version)


# ---------------------------------------------------------------- environment.yml vs pyproject


def test_env_python_satisfies_requires_python(pyproject, env):
    requires = SpecifierSet(pyproject["project"]["requires-python"])
    pythons = [
        d for d in env["dependencies"] if isinstance(d, str) and re.match(r"python\b(?!-)", d)
    ]
    assert len(pythons) == 1, f"expected one python=X.Y entry, got {pythons}"
    m = re.fullmatch(r"python\s*=+\s*(\d+\.\d+(?:\.\d+)?)", pythons[0])
    assert m, f"python must be pinned as python=X.Y, got {pythons[0]!r}"
    assert Version(m.group(1)) in requires, f"{pythons[0]} violates requires-python {requires}"


def test_env_pip_installs_project_editable_with_all_extras(pyproject, env, pip_lines):
    assert "pip" in env["dependencies"], "environment.yml must list pip itself"
    editables = [e for e in map(editable_extras, pip_lines) if e is not None]
    assert len(editables) == 1, f"expected one `-e .[...]` line in the pip section: {pip_lines}"
    optional = pyproject["project"]["optional-dependencies"]
    covered = extras_closure(optional, editables[0])
    missing = set(optional) - covered
    assert not missing, f"environment.yml's `-e .{sorted(editables[0])}` misses extras {missing}"


def test_env_pip_uses_constraints(pip_lines):
    assert "-c constraints.txt" in pip_lines
    assert (ROOT / "constraints.txt").is_file()


# ---------------------------------------------------------------- constraints vs pyproject


def test_constraints_pin_torch_exactly_within_pyproject_range(pyproject, constraints):
    assert "torch" in constraints, "constraints.txt must pin torch"
    pinned = exact_pin(constraints["torch"])
    torch_reqs = [
        Requirement(d)
        for d in pyproject["project"]["dependencies"]
        if canonicalize_name(Requirement(d).name) == "torch"
    ]
    assert len(torch_reqs) == 1
    assert pinned in torch_reqs[0].specifier, (
        f"constraints pins torch=={pinned}, outside pyproject's {torch_reqs[0]}"
    )


# ---------------------------------------------------------------- pyproject itself


def test_core_dependencies_are_torch_only(pyproject):
    names = [canonicalize_name(Requirement(d).name) for d in pyproject["project"]["dependencies"]]
    assert names == ["torch"], f"the library must depend on torch alone, got {names}"


@pytest.mark.parametrize("package", ["numpy", "matplotlib", "seaborn", "tokenizers", "jupyterlab", "pytest",
                                     "transformers", "accelerate"])
def test_package_in_some_extra(pyproject, package):
    optional = pyproject["project"]["optional-dependencies"]
    where = [
        extra
        for extra, specs in optional.items()
        if any(canonicalize_name(Requirement(s).name) == package for s in specs)
    ]
    assert where, f"{package} is in no optional-dependency group"


def test_the_hf_extra_is_pinned_exactly_within_its_range(pyproject, constraints):
    """lce.integrations.transformers reproduces one release's loss code: setup installs that release."""
    for spec in pyproject["project"]["optional-dependencies"]["hf"]:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        assert name in constraints, f"constraints.txt must pin {name} (the hf extra)"
        assert exact_pin(constraints[name]) in requirement.specifier, f"{constraints[name]} outside {requirement}"


def test_dev_extra_covers_every_other_extra(pyproject):
    optional = pyproject["project"]["optional-dependencies"]
    assert extras_closure(optional, {"dev"}) == set(optional)


# ---------------------------------------------------------------- Makefile


def makefile_rules(text: str) -> dict[str, tuple[str, str | None]]:
    """Explicit rule lines: target -> (prerequisites, `## ` description or None)."""
    rules = {}
    for line in text.splitlines():
        if line.startswith(("\t", "#", ".")) or "=" in line.split(":", 1)[0]:
            continue
        m = re.match(r"^([A-Za-z0-9_./$()-]+)\s*:(?!=)(.*)$", line)
        if not m:
            continue
        prereqs, _, desc = m.group(2).partition("## ")
        rules[m.group(1)] = (prereqs.strip(), desc.strip() if _ else None)
    return rules


def help_targets(text: str) -> set[str]:
    """What `make help` lists: its awk keeps lines matching this regex."""
    return {
        line.split(":", 1)[0]
        for line in text.splitlines()
        if re.match(r"^[a-zA-Z0-9_.-]+:.*## ", line)
    }


def test_make_help_is_default_goal(makefile):
    assert re.search(r"^\.DEFAULT_GOAL\s*:=\s*help\s*$", makefile, re.M)


def test_every_public_target_listed_in_help_has_description(makefile):
    rules = makefile_rules(makefile)
    phony = set()
    for m in re.finditer(r"^\.PHONY\s*:(.*)$", makefile, re.M):
        phony.update(m.group(1).split())
    listed = help_targets(makefile)
    assert REQUIRED_TARGETS <= phony, f"missing .PHONY targets: {REQUIRED_TARGETS - phony}"
    for target in sorted(phony):
        assert target in rules, f".PHONY target {target!r} has no rule"
        desc = rules[target][1]
        assert desc, f"target {target!r} has no `## description`, so `make help` skips it"
        assert target in listed
    assert listed <= phony, f"`make help` lists non-phony targets: {listed - phony}"


def test_installing_targets_depend_on_stamp(makefile):
    rules = makefile_rules(makefile)
    stamp = re.search(r"^STAMP\s*:?=\s*(\S+)\s*$", makefile, re.M)
    assert stamp, "Makefile must define STAMP"
    stamp_rule = next((t for t in rules if t in ("$(STAMP)", stamp.group(1))), None)
    assert stamp_rule, "no rule builds the install stamp"
    assert {"pyproject.toml", "constraints.txt"} <= set(rules[stamp_rule][0].split())
    for target in sorted(INSTALLING_TARGETS):
        assert "$(STAMP)" in rules[target][0].split(), f"{target} does not depend on $(STAMP)"


def test_makefile_install_matches_environment_yml(makefile, pip_lines):
    """`make setup` and conda install the same thing."""
    m = re.search(r"pip install -c constraints\.txt -e '\.\[([^\]]*)\]'", makefile)
    assert m, "Makefile must run pip install -c constraints.txt -e '.[...]'"
    editables = [e for e in map(editable_extras, pip_lines) if e is not None]
    assert editables == [{e.strip() for e in m.group(1).split(",")}]
