"""Whole expert units from arrays in memory, for stores not computed from models (the planted
check, the reads bench, tests), written through ``layout`` in precompute's format and order."""

from __future__ import annotations

from typing import Any

import numpy as np
import zarr

from musketeers.cache import layout
from musketeers.cache.zarrio import dense_writes, require_container


def write_expert(split_group: zarr.Group, name: str, arrays: dict[str, np.ndarray], *,
                 fingerprint: Any, n_layers: int, d: int, dtype: str, hints: bool = False,
                 chunk_rows: int = layout.CHUNK_ROWS) -> zarr.Group:
    """A whole, complete expert unit from arrays in memory, for stores not computed from
    models (the planted check, the reads bench), in precompute's format and order: created
    unfinished, arrays, fingerprint, every chunk file (an array not given is zeros: the reader
    takes an absent chunk for a lost one), the flags, then ``complete``. Replaces the unit."""
    allowed = set(layout.EXPERT_ARRAYS) | ({layout.HINTS} if hints else set())
    if unknown := sorted(set(arrays) - allowed):
        raise ValueError(f"not arrays of an expert unit: {unknown}")
    if not arrays or fingerprint is None or (hints and layout.HINTS not in arrays):
        raise ValueError("write_expert needs rows, a fingerprint, and hints when hints=True")
    if bad := sorted(k for k, v in arrays.items()
                     if np.asarray(v).dtype.kind == "f" and not np.isfinite(v).all()):
        raise ValueError(f"non-finite values (NaN or inf) in {bad}: the reader refuses them")
    n = len(next(iter(arrays.values())))
    parent = require_container(split_group, layout.EXPERTS)
    if name in parent:
        del parent[name]
    with dense_writes():
        g = layout.create_unit(parent, name, fingerprint, lambda g: layout.make_expert(
            g, n, n_layers=n_layers, d=d, dtype=dtype, chunk_rows=chunk_rows, hints=hints))
        for flag in layout.unit_flags(g):
            for arr in layout.unit_arrays(g, flag):
                g[arr][:] = arrays[arr] if arr in arrays else 0
            g[flag][:] = 1
            layout.seal(g, flag)
            layout.mark_complete(g, flag)
    return g

