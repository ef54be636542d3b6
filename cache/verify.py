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


def corrupt_chunks(g: zarr.Group, arrays: tuple[str, ...] | None = None) -> set[int]:
    """Chunks of a group with any unreadable array (flags excluded); only finished chunks
    count for progress-tracked groups, since unfinished ones are recomputed anyway."""
    names = arrays or tuple(k for k in g.array_keys() if k != "done")
    flags = st.done_flags(g) if "done" in g else None
    bad: set[int] = set()
    for name in names:
        if name in g:
            bad.update(c for c in bad_chunks(g[name]) if flags is None or flags[c])
    return bad


def verify_group(g: zarr.Group, progress_tracked: bool) -> list[Problem]:
    problems = []
    flags = st.done_flags(g) if progress_tracked else None
    for name in sorted(k for k in g.array_keys() if k != "done"):
        arr = g[name]
        rows = _chunk_rows(arr)
        for c in bad_chunks(arr):
            if flags is not None and not flags[c]:
                continue
            lo, hi = st.chunk_range(c, arr.shape[0], rows)
            problems.append(Problem(f"{g.path}/{name}", f"corrupt chunk {c}, rows {lo}:{hi}"))
    if progress_tracked and not g.attrs.get("complete"):
        done = int(flags.sum())
        problems.append(Problem(g.path, f"incomplete ({done}/{len(flags)} chunks done)"))
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
