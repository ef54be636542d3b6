"""Precompute's side of the token channels: the token units one pass fills for one expert.

The prompt-token states (``tokens``) come out of the same backbone pass as the poolings, the
answer states (``answer``) out of the same generation as the hints, so they ride along those
passes chunk by chunk. Each layer's token unit keeps its own flags (``token_layout``): a chunk
is computed again when the pooled unit or any token unit lacks it, and each unit writes only
the chunks it lacks, so a finished chunk's bytes (and digests) are never rewritten.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import numpy as np
import zarr

from musketeers.cache import token_layout as tl
from musketeers.cache.errors import UserError
from musketeers.cache.layout import done_flags
from musketeers.cache.zarrio import Damaged, chunk_range

log = logging.getLogger("musketeers.precompute")


def resolve_layers(layers: tuple[int, ...], n_layers: int, expert: str) -> dict[int, int]:
    """``--token-states`` layers as this expert's hidden-state indices (-1: its last layer),
    each mapped to the layer asked for (what a repair command passes again)."""
    out: dict[int, int] = {}
    for k in layers:
        if (r := tl.resolve_layer(k, n_layers)) is None:
            raise UserError(f"--token-states {k}: expert {expert!r} has hidden states 0..{n_layers}"
                            f" (0 = embeddings); pass a layer in {-n_layers - 1}..{n_layers}")
        out.setdefault(r, k)
    return out


def unit_fingerprint(expert_fp: Any, channel: str, layer: int, extra: dict | None = None) -> dict:
    """What a token unit was computed from: its expert unit's inputs, channel and layer."""
    blob = json.dumps(expert_fp, sort_keys=True, default=str).encode()
    return {"expert_sha256": hashlib.sha256(blob).hexdigest(), "channel": channel,
            "layer": layer, **(extra or {})}


class TokenUnits:
    """The token units of one channel, one per layer, inside one expert unit."""

    def __init__(self, units: dict[int, zarr.Group]):
        self.units = units

    @classmethod
    def prepare(cls, g: zarr.Group, channel: str, layers: tuple[int, ...], asked: dict[int, int],
                fingerprint: dict[int, dict], chunk_rows: int) -> list[str]:
        """Create (or repair) each layer's unit on rank 0; the paths of all of them."""
        n, d, dtype = g["n_tokens"].shape[0], g.attrs["d"], g.attrs["dtype"]
        for k in layers:
            try:
                u = tl.token_unit(g, channel, k)
                damage = tl.unit_damage(u) if u is not None else None
            except Damaged:
                u, damage = None, "unreadable metadata"
            if u is not None and not damage and u.attrs.get("fingerprint") == fingerprint[k]:
                if bad := tl.bad_chunks(u):
                    log.warning("%s: recomputing chunks %s (%s)", u.path, sorted(bad),
                                next(iter(bad.values())))
                    tl.reopen(u, sorted(bad))
                continue
            if u is not None:
                log.warning("%s: %s; recomputing it", u.path, damage or "built from other inputs")
            u = tl.create_token_unit(g, channel, k, n, d, dtype, chunk_rows, fingerprint[k])
            u.attrs["asked"] = asked[k]
        return [f"{g.path}/{tl.token_path(channel, k)}" for k in layers]

    @classmethod
    def open(cls, store, paths: list[str]) -> TokenUnits:
        units = {}
        for p in paths:
            u = zarr.open_group(store, path=p, mode="r+")
            units[int(u.attrs["layer"])] = u
        return cls(units)

    def todo(self) -> set[int]:
        """Row chunks some layer's unit still lacks."""
        return {c for u in self.units.values() for c in np.flatnonzero(done_flags(u) == 0)}

    def write(self, chunk: int, states: dict[int, list[np.ndarray]]) -> None:
        """The chunk's states into every unit that lacks them (each flags its own chunk)."""
        for k, u in self.units.items():
            if not done_flags(u)[chunk]:
                try:
                    tl.write_chunk(u, chunk, states[k])
                except ValueError as exc:
                    lo, hi = chunk_range(chunk, u["lengths"].shape[0], u["lengths"].chunks[0])
                    raise UserError(f"{exc}; precompute it in float32 (--dtype float32), rows "
                                    f"{lo}:{hi}") from None

    def finish(self) -> None:
        """Seal and mark complete every unit whose chunks are all done (rank 0)."""
        for u in self.units.values():
            if done_flags(u).all() and not tl.is_complete(u):
                tl.seal(u)
