"""Whole expert units from arrays in memory, for stores not computed from models (the planted
check, the reads bench, tests), written through ``layout`` in precompute's format and order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import zarr

from musketeers.cache import layout, token_layout
from musketeers.cache.channels import unit_fingerprint
from musketeers.cache.zarrio import chunk_range, dense_writes, require_container


def write_expert(split_group: zarr.Group, name: str, arrays: dict[str, np.ndarray], *,
                 fingerprint: Any, n_layers: int, d: int, dtype: str, hints: bool = False,
                 chunk_rows: int = layout.CHUNK_ROWS,
                 token_states: dict[tuple[str, int], Sequence[np.ndarray]] | None = None,
                 ) -> zarr.Group:
    """A whole, complete expert unit from arrays in memory, for stores not computed from
    models (the planted check, the reads bench), in precompute's format and order: created
    unfinished, arrays, fingerprint, every chunk file (an array not given is zeros: the reader
    takes an absent chunk for a lost one), the flags, then ``complete``. Replaces the unit.
    ``token_states`` {(channel, layer): one [T_i, d] array per row} adds token units; with
    ``hints``, ``hint_scores`` may be given among ``arrays``."""
    allowed = set(layout.EXPERT_ARRAYS) | ({layout.HINTS, layout.HINT_SCORES} if hints else set())
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
        if layout.HINT_SCORES in arrays:
            layout.add_hints(g, scores=True)
        for flag in layout.unit_flags(g):
            for arr in layout.unit_arrays(g, flag):
                g[arr][:] = arrays[arr] if arr in arrays else 0
            g[flag][:] = 1
            layout.seal(g, flag)
            layout.mark_complete(g, flag)
        for (channel, layer), rows in (token_states or {}).items():
            write_token_unit(g, channel, layer, rows, fingerprint)
    return g


def write_token_unit(g: zarr.Group, channel: str, layer: int, rows: Sequence[np.ndarray],
                     fingerprint: Any) -> zarr.Group:
    """A complete token unit of the expert unit ``g`` from one [T_i, d] array per row, in
    precompute's order: created, chunk by chunk (states, lengths, flag), sealed."""
    n, chunk_rows = g["n_tokens"].shape[0], g["n_tokens"].chunks[0]
    if len(rows) != n:
        raise ValueError(f"{channel} states for {len(rows)} rows, the unit holds {n}")
    fp = unit_fingerprint(fingerprint, channel, layer)
    u = token_layout.create_token_unit(g, channel, layer, n, g.attrs["d"], g.attrs["dtype"],
                                       chunk_rows, fp)
    u.attrs["asked"] = layer
    with dense_writes():
        for c in range(u[layout.DONE].shape[0]):
            lo, hi = chunk_range(c, n, chunk_rows)
            token_layout.write_chunk(u, c, rows[lo:hi])
    token_layout.seal(u)
    return u

