"""Zarr primitives the store is built from, with no knowledge of what a store holds.

Arrays are chunked by rows and checksummed with crc32c, so corruption is found per chunk; every
chunk file is written (``dense_writes``), so an absent one is damage (``missing_chunks``). Group
members are listed and opened so that one unreadable ``zarr.json`` raises ``Damaged`` naming its
place instead of a JSON or KeyError from deep inside zarr. What lives where, and when a group
counts as finished, is ``layout``'s business; opening, locking and repairing a store, ``store``'s.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec
from zarr.core.sync import sync


def compressors() -> list:
    return [ZstdCodec(level=3), Crc32cCodec()]


def create_array(group: zarr.Group, name: str, shape: tuple, dtype, chunk_rows: int):
    """A row-chunked, checksummed array (strings have no fill value; numbers fill with 0)."""
    chunks = (min(chunk_rows, max(shape[0], 1)),) + tuple(shape[1:])
    kwargs = {} if dtype is str else {"fill_value": 0}
    return group.create_array(
        name, shape=shape, chunks=chunks, dtype=dtype, compressors=compressors(), overwrite=True,
        **kwargs,
    )


def n_chunks(n: int, chunk_rows: int) -> int:
    return max(1, -(-n // chunk_rows))


def chunk_range(chunk: int, n: int, chunk_rows: int) -> tuple[int, int]:
    return chunk * chunk_rows, min(n, (chunk + 1) * chunk_rows)


def missing_chunks(arr: zarr.Array, chunks: list[int] | None = None) -> list[int]:
    """Row chunks (of ``chunks``, default all) whose file is absent. Zarr reads an absent chunk
    as the fill value, silently; precompute writes every chunk (``dense_writes``), so absence
    is damage. Bool arrays are exempt: stores from before ``dense_writes`` left all-False
    ``truncated`` chunks unwritten."""
    if arr.dtype == np.bool_ or arr.shape[0] == 0:
        return []

    async def keys() -> set[str]:
        return {k async for k in arr.store.list_prefix(f"{arr.path}/")}

    present = sync(keys())
    tail = (0,) * (arr.ndim - 1)
    want = range(n_chunks(arr.shape[0], arr.chunks[0])) if chunks is None else chunks
    return [c for c in want
            if f"{arr.path}/{arr.metadata.encode_chunk_key((c, *tail))}" not in present]


def dense_writes():
    """Context in which every chunk is written, even one equal to the fill value, so that an
    absent chunk file always means damage (see ``missing_chunks``)."""
    return zarr.config.set({"array.write_empty_chunks": True})


def irregular_files(path: Path) -> list[str]:
    """Entries under ``path`` (relative) that are neither folders nor regular files once links
    are followed: opening a FIFO blocks for ever and a device reads without end, so every walk
    of a store asks here before zarr opens anything. Links to folders are not followed."""
    found = []
    for top, dirs, files in os.walk(path):
        for name in [*files, *(d for d in dirs if os.path.islink(os.path.join(top, d)))]:
            full = os.path.join(top, name)
            try:
                mode = os.stat(full).st_mode
            except OSError:  # a dangling link: zarr reads it as absent, which checks report
                continue
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                found.append(os.path.relpath(full, path))
    return sorted(found)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Damaged(Exception):
    """A node of the store whose metadata (its ``zarr.json``) cannot be read."""

    def __init__(self, where: str, exc: BaseException):
        super().__init__(f"{where}: unreadable metadata ({one_line(exc)})")
        self.where = where


def child(g: zarr.Group, name: str) -> zarr.Group | zarr.Array | None:
    """``g[name]``, None when absent; Damaged when its metadata (or a parent's) is unreadable,
    where zarr would raise a JSON or KeyError from deep inside."""
    try:
        return g[name] if name in g else None
    except Exception as exc:  # noqa: BLE001
        raise Damaged(f"{g.path}/{name}".lstrip("/"), exc) from None


def child_names(g: zarr.Group) -> list[str]:
    """Names of ``g``'s members, listed without parsing them (one bad member must not hide
    the others) and without zarr's interrupted-write leftovers."""
    async def names() -> list[str]:
        return [k async for k in g.store.list_dir(g.path)]

    return sorted(k for k in sync(names()) if k != "zarr.json" and not k.endswith(".partial"))


def require_container(g: zarr.Group, name: str) -> zarr.Group:
    """A member group that holds no attributes (a split, ``experts``, ``router``); an
    unreadable ``zarr.json`` of it is rewritten, its members kept."""
    try:
        return g.require_group(name)
    except Exception:  # noqa: BLE001 - unreadable metadata: nothing in it is lost by a rewrite
        sync(g.store.delete(f"{g.path}/{name}/zarr.json".lstrip("/")))
        return g.require_group(name)
