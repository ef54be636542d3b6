"""The direction of imports: ``musketeers.cli`` → ``musketeers`` → ``musketeers.cache``, the
method never reads the run that trains it, and no two parts of ``musketeers`` (its folders and
its top-level modules: config, config_checks, teams, budgets) import each other, however
indirectly. Imports inside functions count: a deferred import is still a dependency, it only
hides the loop until the function runs. An import under ``if TYPE_CHECKING:`` never runs: it
names a type for the checker, as the method names ``TrainConfig`` in its signatures."""

from __future__ import annotations

from pathlib import Path

from test_module_rules import imported, modules

CACHE, CLI = "musketeers.cache", "musketeers.cli"


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _ours(name: str) -> bool:
    return _in(name, "musketeers")


def offenders(mods: dict[str, Path], source: str, target: str,
              allowed: str | None = None) -> dict[str, list[str]]:
    """{module under ``source``: its imports of ``target`` (outside ``allowed``)}."""
    out = {}
    for m, path in mods.items():
        if not _in(m, source):
            continue
        bad = sorted(n for n in imported(path) if _in(n, target)
                     and not (allowed and _in(n, allowed)))
        if bad:
            out[m] = bad
    return out


def part(name: str) -> str | None:
    """The part of ``musketeers`` a module belongs to: its top-level folder (``method`` for
    musketeers.method.policy), or itself for a module at the package's top (``config``);
    None for the package itself."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "musketeers" else None


def part_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """{part: the parts it imports}: the graph of musketeers' folders and top-level modules."""
    graph: dict[str, set[str]] = {p: set() for m in mods if (p := part(m)) is not None}
    for m, path in mods.items():
        src = part(m)
        if src is None:
            continue
        for n in imported(path, type_checking=False):
            dst = part(n)
            if dst in graph and dst != src:
                graph[src].add(dst)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as [a, b, ..., a], or None (depth-first, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_cache_imports_nothing_from_musketeers_or_the_cli():
    mods = modules()
    assert offenders(mods, CACHE, "musketeers", allowed=CACHE) == {}


def test_musketeers_imports_nothing_from_the_cli():
    mods = {m: p for m, p in modules().items() if not _in(m, CLI)}
    assert offenders(mods, "musketeers", CLI) == {}


def test_the_method_imports_nothing_from_the_run():
    assert offenders(modules(), "musketeers.method", "musketeers.run") == {}


def test_no_cycle_between_folders():
    """Nor between a folder and a top-level module (config → method → config), nor between two
    top-level modules (config → config_checks → config)."""
    graph = part_graph(modules())
    assert {"config", "config_checks", "teams", "budgets", "method", "run"} <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, "parts of musketeers import each other: " + " → ".join(cycle or [])


def test_the_graph_sees_a_module_and_a_folder_importing_each_other(tmp_path: Path):
    """A top-level module and a folder that read each other, even through a function-local
    import, are a loop; an import under ``if TYPE_CHECKING:`` is no edge."""
    (tmp_path / "policy.py").write_text("def f():\n    from musketeers.config import X\n")
    (tmp_path / "config.py").write_text("from musketeers.method.placement import X\n")
    (tmp_path / "typed.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                                       "    from musketeers.config import TrainConfig\n")
    mods = {"musketeers.method.policy": tmp_path / "policy.py",
            "musketeers.config": tmp_path / "config.py"}
    assert find_cycle(part_graph(mods)) == ["config", "method", "config"]
    mods["musketeers.method.policy"] = tmp_path / "typed.py"
    assert part_graph(mods) == {"config": {"method"}, "method": set()}
    assert find_cycle(part_graph(mods)) is None


def test_the_cycle_finder_reports_a_planted_loop():
    """The folder check would catch a loop of three folders, and passes a chain."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_rules_see_a_function_local_import(tmp_path: Path):
    """A deferred import of the run from the method is still an offence."""
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from musketeers.run.data import SplitData\n")
    assert offenders({"musketeers.method.m": path}, "musketeers.method", "musketeers.run") \
        == {"musketeers.method.m": ["musketeers.run.data", "musketeers.run.data.SplitData"]}
