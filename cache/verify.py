"""Re-read every chunk of a store: report corrupt chunks (crc32c) and incomplete experts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import zarr

from musketeers.cache import layout
from musketeers.cache.zarrio import (
    Damaged,
    child,
    child_names,
    chunk_range,
    missing_chunks,
    n_chunks,
    one_line,
)


@dataclass(frozen=True)
class Problem:
    where: str  # array or group path inside the store
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def _chunk_rows(arr: zarr.Array) -> int:
    return arr.chunks[0]


def bad_chunks(arr: zarr.Array) -> list[int]:
    """Row-chunk indices of ``arr`` whose bytes fail to decode (checksum or codec error) or
    whose file is absent (zarr would read it as zeros)."""
    rows = _chunk_rows(arr)
    bad = set(missing_chunks(arr))
    for c in range(n_chunks(arr.shape[0], rows)):
        if c in bad:
            continue
        try:
            arr[c * rows : (c + 1) * rows]
        except Exception:  # noqa: BLE001 - crc32c mismatch, truncated zstd frame, ...
            bad.add(c)
    return sorted(bad)


def corrupt_chunks(g: zarr.Group, arrays: tuple[str, ...] | None = None,
                   flag: str = layout.DONE) -> set[int]:
    """Chunks of a group with any unreadable or absent array chunk of the unit ``flag`` guards;
    only finished chunks count for progress-tracked groups, since unfinished ones are
    recomputed anyway."""
    names = arrays or layout.unit_arrays(g, flag)
    flags = layout.done_flags(g, flag) if flag in g else None
    bad: set[int] = set()
    for name in names:
        if name in g:
            bad.update(c for c in bad_chunks(g[name]) if flags is None or flags[c])
    return bad


def verify_group(g: zarr.Group, progress_tracked: bool) -> list[Problem]:
    damage = layout.unit_damage(g)
    if damage:
        return [Problem(g.path, damage)]
    if not progress_tracked:
        return _verify_unit(g, tuple(sorted(g.array_keys())), None)
    return [p for flag in layout.unit_flags(g)
            for p in _verify_unit(g, layout.unit_arrays(g, flag), flag)]


def _verify_unit(g: zarr.Group, names: tuple[str, ...], flag: str | None) -> list[Problem]:
    """Corrupt or absent finished chunks of ``names``, and the unit's completeness when ``flag``
    tracks it."""
    problems = []
    flags = layout.done_flags(g, flag) if flag else None
    for name in sorted(n for n in names if n in g):
        arr = g[name]
        rows = _chunk_rows(arr)
        missing = set(missing_chunks(arr))
        for c in bad_chunks(arr):
            if flags is not None and not flags[c]:
                continue
            lo, hi = chunk_range(c, arr.shape[0], rows)
            what = "missing" if c in missing else "corrupt"
            problems.append(Problem(f"{g.path}/{name}", f"{what} chunk {c}, rows {lo}:{hi}"))
    if flag and not layout.is_complete(g, flag):
        what = "hints incomplete" if flag == layout.HINTS_FLAG else "incomplete"
        problems.append(Problem(g.path, f"{what} ({int(flags.sum())}/{len(flags)} chunks done)"))
    return problems


def _members(g: zarr.Group, problems: list[Problem]) -> list[zarr.Group]:
    """The readable member groups of ``g``; each unreadable one becomes a problem."""
    out = []
    for name in child_names(g):
        try:
            out.append(child(g, name))
        except Damaged as exc:
            problems.append(Problem(exc.where, "unreadable metadata"))
    return out


def verify_store(path: Path) -> list[Problem]:
    """Every problem in one task store, one line each; an empty list means it is sound."""
    if path.is_dir() and not any(p.suffix != ".partial" for p in path.iterdir()):
        return [Problem(str(path), "empty store folder (killed before anything was written)")]
    try:
        root = zarr.open_group(path, mode="r")
    except Exception as exc:  # noqa: BLE001
        return [Problem(str(path), f"not a readable store ({one_line(exc)})")]
    problems: list[Problem] = []
    for sg in _members(root, problems):
        if layout.ITEMS not in child_names(sg):
            problems.append(Problem(sg.path, "missing items"))
        for g in _members(sg, problems):
            if g.basename == layout.ITEMS:
                problems += verify_group(g, progress_tracked=False)
                if not layout.unit_damage(g) and layout.stored_items_fingerprint(g) is None:
                    problems.append(Problem(g.path, "items were never finished"))
            elif g.basename in (layout.EXPERTS, layout.ROUTER):
                for unit in _members(g, problems):
                    problems += verify_group(unit, progress_tracked=True)
    if any(p.name.endswith(".partial") for p in path.rglob("*.partial")):
        problems.append(Problem(str(path), "leftover *.partial files of a killed write"))
    return problems
