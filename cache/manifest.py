"""Per-chunk sha256 of a store unit's rows, recorded when the unit is finished.

Each chunk file's crc32c finds flipped bits, but not a chunk file replaced by another valid one
(a train chunk copied over val's, an array re-encoded by hand). A sha256 per row chunk, over
the decoded rows of every array of the unit and bound to the unit's path and fingerprint, does:
the same bytes under another split, unit or fingerprint give another digest. Which arrays form
a unit and where the digests live is ``layout``'s business; this module only hashes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import zarr

from musketeers.cache.zarrio import chunk_range, n_chunks


def binding(path: str, fingerprint: Any) -> str:
    """What a digest is bound to: the unit's place in the store and what it was computed from."""
    return json.dumps([path, fingerprint], sort_keys=True, default=str)


def _bytes(values: np.ndarray) -> bytes:
    if values.dtype.kind in "OTU":  # strings: their text, not the object pointers
        return json.dumps([str(v) for v in values.reshape(-1)]).encode()
    return np.ascontiguousarray(values).tobytes()


def chunk_digest(g: zarr.Group, names: tuple[str, ...], chunk: int, bound: str) -> str:
    """sha256 of row chunk ``chunk`` of the arrays ``names``; raises where a chunk won't decode."""
    h = hashlib.sha256(bound.encode())
    for name in sorted(names):
        arr = g[name]
        lo, hi = chunk_range(chunk, arr.shape[0], arr.chunks[0])
        values = arr[lo:hi]
        h.update(f"\0{name}\0{values.dtype.str}\0{values.shape}\0".encode())
        h.update(_bytes(values))
    return h.hexdigest()


def digests(g: zarr.Group, names: tuple[str, ...], bound: str) -> list[str]:
    """One digest per row chunk of the arrays ``names`` (all chunked alike)."""
    first = g[sorted(names)[0]]
    return [chunk_digest(g, names, c, bound)
            for c in range(n_chunks(first.shape[0], first.chunks[0]))]


def mismatches(g: zarr.Group, names: tuple[str, ...], bound: str, recorded: list[str],
               chunks: list[int]) -> list[int]:
    """Of ``chunks``, those whose rows no longer hash to the recorded digest. A chunk that
    cannot be decoded is left to the crc check, which names it as corrupt."""
    bad = []
    for c in chunks:
        try:
            now = chunk_digest(g, names, c, bound)
        except Exception:  # noqa: BLE001 - a decode failure is reported as a corrupt chunk
            continue
        if c >= len(recorded) or recorded[c] != now:
            bad.append(c)
    return bad
