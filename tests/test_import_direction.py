"""The direction of imports: ``musketeers.cli`` → ``musketeers`` → ``musketeers.cache``, the
method never reads the run that trains it, and no two folders of ``musketeers`` import each
other, however indirectly. Imports inside functions count: a deferred import is still a
dependency, it only hides the loop until the function runs."""

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


def folder(name: str) -> str | None:
    """The top-level subpackage of ``musketeers`` a module belongs to (None: a module at the
    package's top, such as musketeers.config, which is no folder)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 2 else None


def folder_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """{folder: the folders its modules import}: the graph of top-level subpackages."""
    folders = {m.split(".")[1] for m, p in mods.items()
               if len(m.split(".")) == 2 and p.name == "__init__.py"}
    graph: dict[str, set[str]] = {f: set() for f in folders}
    for m, path in mods.items():
        src = folder(m)
        if src not in graph:
            continue
        for n in imported(path):
            dst = n.split(".")[1] if _ours(n) and n.count(".") >= 1 else None
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
    cycle = find_cycle(folder_graph(modules()))
    assert cycle is None, "folders import each other: " + " → ".join(cycle or [])


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
