"""Where a store keeps per-token states (channels ``tokens`` and ``answer``), and when a token
unit counts as finished.

An expert unit holds, per channel and layer, a *token unit*: ``experts/<name>/<channel>/L<k>``
with ``lengths`` [N] (tokens per row, row-chunked like every array), ``done`` flags per row
chunk and one array ``flat/<c>`` [T_c, d] per row chunk holding that chunk's rows' tokens back
to back. Rows are ragged, so a flat array shared by the whole split would let two row chunks
share one zarr chunk file: a killed (or another rank's) write of one would tear the other. One
array per row chunk keeps resume and sharding exactly as for every other unit: a chunk's
``flat/<c>`` and ``lengths`` rows are written, then its flag, and ``complete`` after every flag;
an answer's length is known only after generation, which this needs no offsets for up front.
Digests (``sha256``) are per row chunk, over its lengths and its tokens, bound to the unit's
path and fingerprint. bfloat16 has no numpy dtype: it is stored as its raw 16 bits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from musketeers.cache import manifest
from musketeers.cache.layout import DONE, create_done, done_flags
from musketeers.cache.tokens import ANSWER, TOKENS, TokenRows, offsets_from_lengths
from musketeers.cache.verified import Verified, chunk_key
from musketeers.cache.zarrio import (
    child,
    child_names,
    chunk_range,
    compressors,
    create_array,
    missing_chunks,
    n_chunks,
)

TOKEN_CHANNELS = (TOKENS, ANSWER)  # the channels stored as token units
LENGTHS, FLAT = "lengths", "flat"
TOKEN_CHUNK = 1024  # tokens per zarr chunk of ``flat/<c>``: a row's read touches few files
COMPLETE, SHA256 = "complete", "sha256"
BF16 = "bfloat16"
_STORED = {"float32": np.float32, "float16": np.float16, BF16: np.uint16}


def unit_name(layer: int) -> str:
    return f"L{layer}"


def token_path(channel: str, layer: int) -> str:
    """A token unit's path inside its expert unit."""
    return f"{channel}/{unit_name(layer)}"


def stored_layers(g: zarr.Group, channel: str) -> list[int]:
    """The layers an expert unit holds ``channel`` for (finished or not)."""
    container = child(g, channel) if channel in TOKEN_CHANNELS else None
    if container is None:
        return []
    return sorted(int(n[1:]) for n in child_names(container) if n[1:].isdigit())


def token_unit(g: zarr.Group, channel: str, layer: int) -> zarr.Group | None:
    """The expert unit's token unit, None when absent."""
    container = child(g, channel)
    return child(container, unit_name(layer)) if container is not None else None


def token_units(g: zarr.Group) -> list[zarr.Group]:
    """Every token unit of an expert unit, channel by channel, layer by layer."""
    return [u for ch in TOKEN_CHANNELS for k in stored_layers(g, ch)
            if (u := token_unit(g, ch, k)) is not None]


def find_token_unit(g: zarr.Group | None, channel: str, layer: int) -> zarr.Group | None:
    """The expert unit ``g``'s token unit of ``channel`` at ``layer`` (-1: its last), None when
    absent or unreadable: for callers that only record what is there (a run's fingerprints);
    the reader tells the cases apart."""
    n_layers = g.attrs.get("n_layers") if g is not None else None
    k = resolve_layer(layer, n_layers) if isinstance(n_layers, int) else None
    try:
        return token_unit(g, channel, k) if k is not None else None
    except Exception:  # noqa: BLE001 - Damaged metadata: the reader names the fix
        return None


def resolve_layer(layer: int, n_layers: int) -> int | None:
    """Hidden-state index 0..n_layers (0 = embeddings); negative counts from the last layer
    (-1 = last), so one layer argument fits experts of every depth. None when out of range."""
    k = layer + n_layers + 1 if layer < 0 else layer
    return k if 0 <= k <= n_layers else None


def create_token_unit(g: zarr.Group, channel: str, layer: int, n: int, d: int, dtype: str,
                      chunk_rows: int, fingerprint: Any) -> zarr.Group:
    """A new, unfinished token unit (fingerprint set last, as ``layout.create_unit``)."""
    if dtype not in _STORED:
        raise ValueError(f"token states are stored as {sorted(_STORED)}, not {dtype}")
    container = g.require_group(channel)
    name = unit_name(layer)
    if name in container:
        del container[name]
    u = container.require_group(name)
    u.attrs.update({COMPLETE: False, "fingerprint": None})
    create_array(u, LENGTHS, (n,), "int32", chunk_rows)
    create_done(u, n, chunk_rows)
    u.require_group(FLAT)
    u.attrs.update({"d": d, "dtype": dtype, "layer": layer, "channel": channel,
                    "fingerprint": fingerprint})
    return u


def _encode(states: np.ndarray, dtype: str) -> np.ndarray:
    x = np.ascontiguousarray(states, dtype=np.float32)
    if dtype == BF16:  # round to nearest even, as torch's cast does
        bits = x.view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return x.astype(_STORED[dtype])


def _decode(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == BF16:
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32, copy=False)


def write_chunk(u: zarr.Group, chunk: int, rows: Sequence[np.ndarray]) -> None:
    """Row chunk ``chunk``'s token states (one [T_i, d] array per row), then its flag."""
    n, chunk_rows = u[LENGTHS].shape[0], u[LENGTHS].chunks[0]
    lo, hi = chunk_range(chunk, n, chunk_rows)
    if len(rows) != hi - lo:
        raise ValueError(f"chunk {chunk} holds {hi - lo} rows, got {len(rows)}")
    d, dtype = u.attrs["d"], u.attrs["dtype"]
    flat = np.concatenate([np.asarray(r, np.float32).reshape(-1, d) for r in rows]) \
        if rows else np.zeros((0, d), np.float32)
    if not np.isfinite(flat).all():
        raise ValueError(f"{u.path}: non-finite token states in rows {lo}:{hi}")
    stored = _encode(flat, dtype)
    arr = u[FLAT].create_array(str(chunk), shape=stored.shape, dtype=stored.dtype,
                               chunks=(min(TOKEN_CHUNK, max(len(stored), 1)), d), fill_value=0,
                               compressors=compressors(), overwrite=True)
    arr[:] = stored
    u[LENGTHS][lo:hi] = np.array([len(r) for r in rows], dtype=np.int32)
    u[DONE][chunk] = 1


def chunk_digest(u: zarr.Group, chunk: int, rows: tuple[np.ndarray, np.ndarray] | None = None
                 ) -> str:
    """sha256 of row chunk ``chunk``: its lengths and its tokens' stored bytes, bound to the
    unit's path and fingerprint. ``rows``: (lengths, stored tokens) already read, so a check
    decodes a chunk once. Raises where a chunk is absent or won't decode."""
    if rows is None:
        lengths = u[LENGTHS]
        lo, hi = chunk_range(chunk, lengths.shape[0], lengths.chunks[0])
        rows = (lengths[lo:hi], u[FLAT][str(chunk)][:])
    counts, stored = rows
    h = hashlib.sha256(manifest.binding(u.path, u.attrs.get("fingerprint")).encode())
    h.update(np.ascontiguousarray(counts).tobytes())
    h.update(f"\0{stored.dtype.str}\0{stored.shape}\0".encode())
    h.update(np.ascontiguousarray(stored).tobytes())
    return h.hexdigest()


def chunk_fault(u: zarr.Group, chunk: int) -> str | None:
    """Why a finished row chunk cannot be trusted (``missing``, ``corrupt``, ``non-finite``,
    ``misshapen``, ``swapped or edited``), or None."""
    lengths = u[LENGTHS]
    lo, hi = chunk_range(chunk, lengths.shape[0], lengths.chunks[0])
    flat_group = u[FLAT]
    if str(chunk) not in flat_group or missing_chunks(lengths, [chunk]):
        return "missing"
    flat = flat_group[str(chunk)]
    if missing_chunks(flat):
        return "missing"
    try:
        counts, stored = lengths[lo:hi], flat[:]
        values = _decode(stored, u.attrs.get("dtype"))
    except Exception:  # noqa: BLE001 - crc32c mismatch, truncated zstd frame, ...
        return "corrupt"
    if flat.shape != (int(counts.astype(np.int64).sum()), u.attrs.get("d")):
        return "misshapen"  # its tokens disagree with its rows' lengths
    if not np.isfinite(values).all():
        return "non-finite"
    recorded = u.attrs.get(SHA256)
    if isinstance(recorded, list) and (chunk >= len(recorded) or
                                       recorded[chunk] != chunk_digest(u, chunk,
                                                                       (counts, stored))):
        return "swapped or edited"  # it differs from the digest recorded when it was built
    return None


def unit_damage(u: zarr.Group) -> str | None:
    """Why a token unit's structure cannot be trusted (before any chunk is read), or None."""
    if u.attrs.get("fingerprint") is None:
        return "unfinished (killed while being created)"
    names = child_names(u)
    if missing := [n for n in (LENGTHS, DONE, FLAT) if n not in names]:
        return f"missing {', '.join(missing)}"
    if u.attrs.get("dtype") not in _STORED or not isinstance(u.attrs.get("d"), int):
        return "attributes dtype or d are not a stored token dtype and a width"
    if u[DONE].shape != (n_chunks(u[LENGTHS].shape[0], u[LENGTHS].chunks[0]),):
        return f"done has shape {u[DONE].shape}, not one flag per row chunk"
    return None


def chunk_files(u: zarr.Group, chunk: int) -> list[Path] | None:
    """Every file row chunk ``chunk``'s rows are read from (its ``flat/<c>`` array's metadata
    and chunk files, its ``lengths`` chunk and that array's metadata); None when the store is
    not a folder on disk."""
    root = getattr(u.store, "root", None)
    if not isinstance(root, Path):
        return None
    unit = root / u.path
    flat = unit / FLAT / str(chunk)
    files = sorted(p for p in flat.rglob("*") if p.is_file()) if flat.is_dir() else [flat]
    return [*files, unit / LENGTHS / "zarr.json", unit / LENGTHS / "c" / str(chunk)]


def bad_chunks(u: zarr.Group, verified: Verified | None = None) -> dict[int, str]:
    """{chunk: fault} of the unit's finished chunks. A chunk ``verified`` remembers as checked,
    none of its files touched since, is not hashed again; one that passes is remembered."""
    recorded = u.attrs.get(SHA256)
    out = {}
    for c in np.flatnonzero(done_flags(u)).tolist():
        files = chunk_files(u, c) if verified is not None and isinstance(recorded, list) \
            and c < len(recorded) else None
        key = chunk_key((u.path, recorded[c], u.attrs.get("fingerprint"), u.attrs.get("dtype"),
                         u.attrs.get("d")), files) if files else None
        if verified is not None and verified.passed(key):
            continue
        if fault := chunk_fault(u, c):
            out[c] = fault
        elif verified is not None:
            verified.add(key)
    return out


def is_complete(u: zarr.Group | None) -> bool:
    return u is not None and bool(u.attrs.get(COMPLETE))


def seal(u: zarr.Group) -> None:
    """Record every chunk's digest, then mark the unit complete (after every flag)."""
    u.attrs[SHA256] = [chunk_digest(u, c) for c in range(u[DONE].shape[0])]
    u.attrs[COMPLETE] = True


def reopen(u: zarr.Group, chunks: Sequence[int]) -> None:
    """Clear the flags of ``chunks`` (damaged) and the unit's completeness."""
    for c in chunks:
        u[DONE][c] = 0
    u.attrs[COMPLETE] = False


def stored_bytes(u: zarr.Group) -> int:
    """Bytes of the unit's token states as stored, uncompressed (from metadata alone)."""
    flat = u[FLAT]
    return sum(flat[str(c)].nbytes for c in range(u[DONE].shape[0]) if str(c) in flat)


def size(u: zarr.Group) -> int:
    """Tokens stored (finished or not) — for ``cache info``."""
    try:
        return int(u[LENGTHS][:].astype(np.int64).sum())
    except Exception:  # noqa: BLE001 - a corrupt chunk: ``cache verify`` reports it
        return 0


class ChunkedFlat:
    """The unit's per-chunk ``flat/<c>`` arrays seen as one ``[T_total, d]`` float32 array.
    ``read_slices`` reads many slices at once: each zarr chunk they cover is decoded once,
    however many rows it holds, and only those chunks are in memory."""

    def __init__(self, u: zarr.Group, offsets: np.ndarray):
        lengths = u[LENGTHS]
        rows = lengths.chunks[0]
        self.arrays = [u[FLAT][str(c)] for c in range(u[DONE].shape[0])]
        self.starts = np.array([offsets[min(c * rows, len(offsets) - 1)]
                                for c in range(len(self.arrays))] + [offsets[-1]], np.int64)
        self.sizes = [a.chunks[0] for a in self.arrays]  # tokens per zarr chunk of each array
        self.dtype = u.attrs["dtype"]
        self.shape = (int(offsets[-1]), int(u.attrs["d"]))

    def __getitem__(self, key: slice) -> np.ndarray:
        lo, hi, _ = key.indices(self.shape[0])
        return self.read_slices([(lo, max(lo, hi))])[0]

    def _pieces(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """``[lo, hi)`` as (array, start, stop) pieces local to each ``flat/<c>`` it spans."""
        out = []
        first = max(int(np.searchsorted(self.starts, lo, side="right")) - 1, 0)
        for c in range(first, len(self.arrays)):
            if self.starts[c] >= hi:
                break
            a, b = max(lo, self.starts[c]), min(hi, self.starts[c + 1])
            if a < b:
                out.append((c, int(a - self.starts[c]), int(b - self.starts[c])))
        return out

    def read_slices(self, spans: Sequence[tuple[int, int]]) -> list[np.ndarray]:
        """``flat[lo:hi]`` for each ``(lo, hi)``, float32. Per array, the zarr chunks the spans
        cover are read in runs of adjacent chunks (one zarr call a run: its per-call cost
        dwarfs a chunk's decode), each chunk once; the spans are then sliced in memory."""
        pieces = [self._pieces(int(lo), int(hi)) for lo, hi in spans]
        wanted: dict[int, set[int]] = {}
        for c, a, b in (p for ps in pieces for p in ps):
            size = self.sizes[c]
            wanted.setdefault(c, set()).update(range(a // size, (b - 1) // size + 1))
        loaded: dict[tuple[int, int], np.ndarray] = {}  # (array, chunk) -> decoded rows
        for c, ks in wanted.items():
            arr, size = self.arrays[c], self.sizes[c]
            for first, last in _runs(sorted(ks)):
                block = _decode(arr[first * size:min((last + 1) * size, arr.shape[0])],
                                self.dtype)
                for k in range(first, last + 1):
                    loaded[c, k] = block[(k - first) * size:(k - first + 1) * size]
        out = []
        for ps in pieces:
            parts = []
            for c, a, b in ps:
                size = self.sizes[c]
                parts += [loaded[c, k][max(a, k * size) - k * size:min(b, (k + 1) * size)
                                       - k * size]
                          for k in range(a // size, (b - 1) // size + 1)]
            out.append(np.concatenate(parts) if parts
                       else np.zeros((0, self.shape[1]), np.float32))
        return out


def _runs(ks: list[int]) -> list[tuple[int, int]]:
    """Sorted chunk indices as (first, last) runs of adjacent ones."""
    runs: list[tuple[int, int]] = []
    for k in ks:
        if runs and k == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], k)
        else:
            runs.append((k, k))
    return runs


def token_rows(u: zarr.Group) -> TokenRows:
    """The unit's rows, read lazily (``TokenRows``)."""
    offsets = offsets_from_lengths(u[LENGTHS][:])
    return TokenRows(offsets, ChunkedFlat(u, offsets))
