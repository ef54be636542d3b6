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
    """Row-chunk indices of ``arr`` whose bytes fail to decode (checksum or codec error)."""
    rows = _chunk_rows(arr)
    bad = []
    for c in range(st.n_chunks(arr.shape[0], rows)):
        try:
            arr[c * rows : (c + 1) * rows]
        except Exception:  # noqa: BLE001 - crc32c mismatch, truncated zstd frame, ...
            bad.append(c)
    return bad


def corrupt_chunks(g: zarr.Group, arrays: tuple[str, ...] | None = None,
                   flag: str = "done") -> set[int]:
    """Chunks of a group with any unreadable array of the unit ``flag`` guards; only finished
    chunks count for progress-tracked groups, since unfinished ones are recomputed anyway."""
    names = arrays or st.unit_arrays(g, flag)
    flags = st.done_flags(g, flag) if flag in g else None
    bad: set[int] = set()
    for name in names:
        if name in g:
            bad.update(c for c in bad_chunks(g[name]) if flags is None or flags[c])
    return bad


def verify_group(g: zarr.Group, progress_tracked: bool) -> list[Problem]:
    if not progress_tracked:
        return _verify_unit(g, tuple(sorted(g.array_keys())), None, None)
    problems = _verify_unit(g, st.unit_arrays(g), "done", "complete")
    if st.HINTS_FLAG in g:
        problems += _verify_unit(g, ("hints",), st.HINTS_FLAG, "hints_complete")
    return problems


def _verify_unit(g: zarr.Group, names: tuple[str, ...], flag: str | None,
                 attr: str | None) -> list[Problem]:
    """Corrupt finished chunks of ``names``, and the unit's completeness when ``flag`` tracks it."""
    problems = []
    flags = st.done_flags(g, flag) if flag else None
    for name in sorted(n for n in names if n in g):
        arr = g[name]
        rows = _chunk_rows(arr)
        for c in bad_chunks(arr):
            if flags is not None and not flags[c]:
                continue
            lo, hi = st.chunk_range(c, arr.shape[0], rows)
            problems.append(Problem(f"{g.path}/{name}", f"corrupt chunk {c}, rows {lo}:{hi}"))
    if flag and not g.attrs.get(attr):
        what = "hints incomplete" if flag == st.HINTS_FLAG else "incomplete"
        problems.append(Problem(g.path, f"{what} ({int(flags.sum())}/{len(flags)} chunks done)"))
    return problems


def verify_store(path: Path) -> list[Problem]:
    """Every problem in one task store; an empty list means it is sound."""
    try:
        root = zarr.open_group(path, mode="r")
    except Exception as exc:  # noqa: BLE001
        return [Problem(str(path), f"not a readable store ({exc})")]
    problems: list[Problem] = []
    for split in sorted(root.group_keys()):
        sg = root[split]
        if "items" in sg:
            problems += verify_group(sg["items"], progress_tracked=False)
            if sg["items"].attrs.get("items_fingerprint") is None:
                problems.append(Problem(sg["items"].path, "items were never finished"))
        for kind in ("experts", "router"):
            if kind in sg:
                for name in sorted(sg[kind].group_keys()):
                    problems += verify_group(sg[kind][name], progress_tracked=True)
    return problems
