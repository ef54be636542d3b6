"""Rules of the source tree: the analysis imports nothing from the grid runner, no module
imports one that imports it back, and no module passes 400 lines."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# source folder → the package it installs as (pyproject's package-dir)
PACKAGES = {"musketeers": "musketeers", "cache": "musketeers.cache", "cli": "musketeers.cli"}
MAX_LINES = 400


def modules() -> dict[str, Path]:
    """{dotted module name: file} for every module of the installed packages."""
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def _type_checking(node: ast.stmt) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _drop_type_checking(tree: ast.AST) -> None:
    """Replace each ``if TYPE_CHECKING:`` block of ``tree`` by its ``else`` branch."""
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list):
                setattr(node, name, [k for s in block
                                     for k in (s.orelse if _type_checking(s) else [s])])


def imported(path: Path, top_level_only: bool = False, type_checking: bool = True) -> set[str]:
    """Every module name ``path`` imports (``from a import b`` counts as a and a.b).
    ``type_checking=False``: without those under ``if TYPE_CHECKING:``, which never run."""
    tree = ast.parse(path.read_text(), filename=str(path))
    if not type_checking:
        _drop_type_checking(tree)
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_the_analysis_imports_nothing_from_the_grid_runner():
    analysis = {m: p for m, p in modules().items() if m.startswith("musketeers.reports")}
    assert analysis, "no analysis modules found"
    offenders = {m: sorted(n for n in imported(p)
                           if n == "musketeers.grid" or n.startswith("musketeers.grid."))
                 for m, p in analysis.items()}
    assert {m: v for m, v in offenders.items() if v} == {}


def test_the_rule_sees_a_runner_import(tmp_path: Path):
    """The check above would catch a function-local import of the runner."""
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from musketeers.grid.ledger import totals\n")
    assert "musketeers.grid.ledger" in imported(path)


def test_no_two_modules_import_each_other_at_load():
    mods = modules()
    graph = {m: {n for n in imported(p, top_level_only=True) if n in mods} - {m}
             for m, p in mods.items()}
    pairs = sorted((a, b) for a, deps in graph.items() for b in deps
                   if a < b and a in graph.get(b, set())
                   and not mods[a].name == "__init__.py" and not mods[b].name == "__init__.py")
    assert pairs == []


@pytest.mark.parametrize("module", sorted(modules()))
def test_no_module_passes_the_line_limit(module: str):
    n = len(modules()[module].read_text().splitlines())
    assert n <= MAX_LINES, f"{module} has {n} lines; split it along a seam"


def test_every_package_folder_is_installed():
    """pyproject lists its packages by hand: a folder left out imports from a checkout but
    not from a wheel."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    packages = {m for m, path in modules().items() if path.name == "__init__.py"}
    assert packages - listed == set()
