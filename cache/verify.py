"""Re-read every chunk of a store: report corrupt chunks (crc32c) and incomplete experts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import zarr

from musketeers.cache import store as st


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
    bad = set(st.missing_chunks(arr))
    for c in range(st.n_chunks(arr.shape[0], rows)):
        if c in bad:
            continue
        try:
            arr[c * rows : (c + 1) * rows]
        except Exception:  # noqa: BLE001 - crc32c mismatch, truncated zstd frame, ...
            bad.add(c)
    return sorted(bad)


def corrupt_chunks(g: zarr.Group, arrays: tuple[str, ...] | None = None,
                   flag: str = "done") -> set[int]:
    """Chunks of a group with any unreadable or absent array chunk of the unit ``flag`` guards;
    only finished chunks count for progress-tracked groups, since unfinished ones are
    recomputed anyway."""
    names = arrays or st.unit_arrays(g, flag)
    flags = st.done_flags(g, flag) if flag in g else None
    bad: set[int] = set()
    for name in names:
        if name in g:
            bad.update(c for c in bad_chunks(g[name]) if flags is None or flags[c])
    return bad


def verify_group(g: zarr.Group, progress_tracked: bool) -> list[Problem]:
    damage = st.unit_damage(g)
    if damage:
        return [Problem(g.path, damage)]
    if not progress_tracked:
        return _verify_unit(g, tuple(sorted(g.array_keys())), None, None)
    problems = _verify_unit(g, st.unit_arrays(g), "done", "complete")
    if st.HINTS_FLAG in g:
        problems += _verify_unit(g, ("hints",), st.HINTS_FLAG, "hints_complete")
    return problems


def _verify_unit(g: zarr.Group, names: tuple[str, ...], flag: str | None,
                 attr: str | None) -> list[Problem]:
    """Corrupt or absent finished chunks of ``names``, and the unit's completeness when ``flag``
    tracks it."""
    problems = []
    flags = st.done_flags(g, flag) if flag else None
    for name in sorted(n for n in names if n in g):
        arr = g[name]
        rows = _chunk_rows(arr)
        missing = set(st.missing_chunks(arr))
        for c in bad_chunks(arr):
            if flags is not None and not flags[c]:
                continue
            lo, hi = st.chunk_range(c, arr.shape[0], rows)
            what = "missing" if c in missing else "corrupt"
            problems.append(Problem(f"{g.path}/{name}", f"{what} chunk {c}, rows {lo}:{hi}"))
    if flag and not g.attrs.get(attr):
        what = "hints incomplete" if flag == st.HINTS_FLAG else "incomplete"
        problems.append(Problem(g.path, f"{what} ({int(flags.sum())}/{len(flags)} chunks done)"))
    return problems


def _members(g: zarr.Group, problems: list[Problem]) -> list[zarr.Group]:
    """The readable member groups of ``g``; each unreadable one becomes a problem."""
    out = []
    for name in st.child_names(g):
        try:
            out.append(st.child(g, name))
        except st.Damaged as exc:
            problems.append(Problem(exc.where, "unreadable metadata"))
    return out


def verify_store(path: Path) -> list[Problem]:
    """Every problem in one task store, one line each; an empty list means it is sound."""
    if path.is_dir() and not any(p.suffix != ".partial" for p in path.iterdir()):
        return [Problem(str(path), "empty store folder (killed before anything was written)")]
    try:
        root = zarr.open_group(path, mode="r")
    except Exception as exc:  # noqa: BLE001
        return [Problem(str(path), f"not a readable store ({st.one_line(exc)})")]
    problems: list[Problem] = []
    for sg in _members(root, problems):
        if "items" not in st.child_names(sg):
            problems.append(Problem(sg.path, "missing items"))
        for g in _members(sg, problems):
            if g.basename == "items":
                problems += verify_group(g, progress_tracked=False)
                if not st.unit_damage(g) and g.attrs.get("items_fingerprint") is None:
                    problems.append(Problem(g.path, "items were never finished"))
            elif g.basename in ("experts", "router"):
                for unit in _members(g, problems):
                    problems += verify_group(unit, progress_tracked=True)
    if any(p.name.endswith(".partial") for p in path.rglob("*.partial")):
        problems.append(Problem(str(path), "leftover *.partial files of a killed write"))
    return problems
