"""The one owner of what lives where in a store, and of when a part of it counts as finished.

``<task>.zarr/<split>/{items,experts/<name>,router/<encoder>}`` (ARCHITECTURE.md, "The store").
An expert or router group is a *unit*: its rows are cut into chunks, a chunk's ``done`` flag is
written after its arrays and the unit's ``complete`` after every flag; hints are a unit of
their own inside an expert (``hints_done`` flags, then ``hints_complete``). A unit is created
with no fingerprint and set it once its arrays exist, so a store killed at any moment never
presents unfinished rows as finished, and a unit without one reads as killed while created.

Writers (precompute, and ``from_memory.write_expert`` for stores not made by models) and
readers (the reader, ``cache verify``, ``cache info``, the grid's needs, a run's fingerprints) go
through this module, so they cannot disagree on a path or on what "complete" means. The
layout is pinned to ``FORMAT_VERSION`` by tests/test_store_format.py: change it, bump that.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec

from musketeers.cache import manifest
from musketeers.cache.items import Item
from musketeers.cache.zarrio import (
    Damaged,
    child,
    create_array,
    dense_writes,
    n_chunks,
)

FORMAT_VERSION = 1
CHUNK_ROWS = 64
BATCH_TOKENS = 8192  # precompute's default padded tokens per forward batch
SPLITS: tuple[str, ...] = ("train", "val")  # every store, every task
ITEMS = "items"
ITEM_FIELDS = ("id", "question", "system", "answer", "entry", "source")
EMPTY_ANSWERS = "empty_answers"  # items attr: rows whose gold is "" rather than None
EXPERTS, ROUTER = "experts", "router"  # the containers of units in a split
ROUTER_ENCODER = "all-minilm-l6-v2"
EXPERT_ARRAYS = ("last", "first", "random", "layers_last", "layers_mean", "random_pos",
                 "n_tokens", "truncated")
ROUTER_ARRAYS = ("emb",)
HINTS = "hints"
HINT_SCORES = "hint_scores"  # each hint's reward under the task's scorer, in the hints unit
DONE, HINTS_FLAG = "done", "hints_done"  # hints are their own unit: flags, then hints_complete
FLAGS = (DONE, HINTS_FLAG)
_COMPLETE = {DONE: "complete", HINTS_FLAG: "hints_complete"}  # what each unit's flags finish
# the attr holding each unit's per-chunk digests (``manifest``); items use DONE's
_SHA256 = {DONE: "sha256", HINTS_FLAG: "hints_sha256"}
# Bounds on what a store's metadata may claim, far above any split (the paper's is 16,000
# rows in 250 chunks) or model: checked before anything iterates over rows, chunks or layers,
# so an edited ``n`` or shape is damage in one line, not a check that never ends.
MAX_ROWS = 10_000_000
MAX_CHUNKS = 200_000
MAX_CHUNK_VALUES = 1 << 28  # values in one chunk: 1 GiB of float32
MAX_DIM, MAX_LAYERS = 1 << 20, 4096


# --- the root --------------------------------------------------------------------------------

def root_attrs(task: str, task_spec: dict) -> dict[str, Any]:
    return {"format_version": FORMAT_VERSION, "task": task, "task_spec": task_spec}


def format_version(root: zarr.Group) -> Any:
    return root.attrs.get("format_version")


def same_root(root: zarr.Group, task_spec: dict) -> bool:
    """Whether a root was built in this format from this task spec (else it is rebuilt)."""
    return format_version(root) == FORMAT_VERSION and root.attrs.get("task_spec") == task_spec


def store_splits(root: zarr.Group) -> tuple[str, ...]:
    """The splits a store was built with (``write_items`` records each); every one of SPLITS
    for a store from before they were recorded, as precompute always built both."""
    return tuple(root.attrs.get("splits") or SPLITS)


def _record_split(split_group: zarr.Group) -> None:
    root = zarr.open_group(split_group.store, mode="r+")
    splits = list(root.attrs.get("splits") or [])
    if split_group.basename not in splits:
        root.attrs["splits"] = sorted([*splits, split_group.basename])


# --- paths -----------------------------------------------------------------------------------

def expert_path(name: str) -> str:
    """An expert unit's path inside its split group."""
    return f"{EXPERTS}/{name}"


def router_path(encoder: str = ROUTER_ENCODER) -> str:
    """A router unit's path inside its split group."""
    return f"{ROUTER}/{encoder}"


def unit_kind(g: zarr.Group) -> str | None:
    """``experts`` or ``router`` for a unit group, None for any other group."""
    parts = g.path.split("/")
    return parts[-2] if len(parts) >= 2 and parts[-2] in (EXPERTS, ROUTER) else None


def expert_at(where: str) -> tuple[str, str] | None:
    """(split, expert) when a store path (a ``verify`` problem's) lies in an expert unit."""
    parts = where.split("/")
    return (parts[0], parts[2]) if len(parts) >= 3 and parts[1] == EXPERTS else None


def expert_group(split_group: zarr.Group, name: str) -> zarr.Group | None:
    """The expert's unit, None when absent; ``Damaged`` naming what cannot be read."""
    experts = child(split_group, EXPERTS)
    return child(experts, name) if experts is not None else None


def router_group(split_group: zarr.Group, encoder: str = ROUTER_ENCODER) -> zarr.Group | None:
    """The encoder's router unit, None when absent; ``Damaged`` naming what cannot be read."""
    router = child(split_group, ROUTER)
    return child(router, encoder) if router is not None else None


def items_group(split_group: zarr.Group) -> zarr.Group | None:
    return child(split_group, ITEMS)


def find_expert(root: zarr.Group, split: str, name: str) -> zarr.Group | None:
    """The expert's unit, None when absent or unreadable: for callers that only ask whether it
    is there and finished (the grid's needs, a run's fingerprints); the reader tells them apart."""
    return _find(root, split, lambda sg: expert_group(sg, name))


def find_router(root: zarr.Group, split: str, encoder: str = ROUTER_ENCODER) -> zarr.Group | None:
    return _find(root, split, lambda sg: router_group(sg, encoder))


def find_items(root: zarr.Group, split: str) -> zarr.Group | None:
    return _find(root, split, items_group)


def _find(root: zarr.Group, split: str, get: Callable[[zarr.Group], Any]) -> Any:
    try:
        sg = child(root, split)
        return get(sg) if sg is not None else None
    except Damaged:
        return None


# --- items -----------------------------------------------------------------------------------

def write_items(split_group: zarr.Group, items: list[Item], fingerprint: str, chunk_rows: int):
    """Items of a split, written once per store, every chunk file (``dense_writes``: an empty
    string is the fill value); their digests, then ``items_fingerprint``, are set last."""
    g = split_group.require_group(ITEMS)
    g.attrs.update({"n": len(items), "items_fingerprint": None,
                    # a gold that is the empty string (a string task's right answer can be)
                    # and no gold share the column's one empty cell: these rows hold the former
                    EMPTY_ANSWERS: [i for i, it in enumerate(items) if it.answer == ""]})
    with dense_writes():
        for f in ITEM_FIELDS:
            values = np.array([getattr(it, f) or "" for it in items], dtype=object)
            create_array(g, f, (len(items),), str, chunk_rows)[:] = values
    seal(g, DONE, fingerprint)
    g.attrs.update({"n": len(items), "items_fingerprint": fingerprint})
    _record_split(split_group)


def stored_items_fingerprint(g: zarr.Group | None) -> str | None:
    """The items group's fingerprint; None if absent or never finished."""
    return g.attrs.get("items_fingerprint") if g is not None else None


def item_count(g: zarr.Group | None) -> int | None:
    """How many items the items group ``g`` holds (None: absent, unknown or not a count in
    0..MAX_ROWS, which ``damage.unit_damage`` reports)."""
    n = g.attrs.get("n") if g is not None else None
    return n if is_count(n, MAX_ROWS) else None


def is_count(value: Any, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most


def items_ready(split_group: zarr.Group, fingerprint: str) -> bool | None:
    """True if the stored items match, False if they differ, None if absent/unfinished."""
    stored = stored_items_fingerprint(split_group[ITEMS]) if ITEMS in split_group else None
    return None if stored is None else stored == fingerprint


# --- creating units --------------------------------------------------------------------------

def create_unit(parent: zarr.Group, name: str, fingerprint: Any,
                make: Callable[[zarr.Group], None]) -> zarr.Group:
    """A new unit: unfinished and without fingerprint until ``make`` has created its arrays."""
    g = parent.require_group(name)
    g.attrs.update({_COMPLETE[DONE]: False, "fingerprint": None})
    make(g)
    g.attrs.update({"fingerprint": fingerprint})
    return g


def create_expert_arrays(
    g: zarr.Group, n: int, n_layers: int, d: int, chunk_rows: int, hints: bool
) -> None:
    for name in ("last", "first", "random"):
        create_array(g, name, (n, d), "float32", chunk_rows)
    for name in ("layers_last", "layers_mean"):
        create_array(g, name, (n, n_layers + 1, d), "float32", chunk_rows)
    create_array(g, "random_pos", (n,), "int32", chunk_rows)
    create_array(g, "n_tokens", (n,), "int32", chunk_rows)
    create_array(g, "truncated", (n,), "bool", chunk_rows)
    create_done(g, n, chunk_rows)
    if hints:  # flags first: see ``add_hints``
        create_done(g, n, chunk_rows, HINTS_FLAG)
        create_array(g, HINTS, (n,), str, chunk_rows)


def make_expert(g: zarr.Group, n: int, *, n_layers: int, d: int, dtype: str, chunk_rows: int,
                hints: bool = False) -> None:
    """An expert unit's arrays and shape attributes (``create_unit``'s ``make``)."""
    create_expert_arrays(g, n, n_layers, d, chunk_rows, hints)
    g.attrs.update({"n_layers": n_layers, "d": d, "dtype": dtype})


def make_router(g: zarr.Group, n: int, dim: int, chunk_rows: int) -> None:
    create_array(g, "emb", (n, dim), "float32", chunk_rows)
    create_done(g, n, chunk_rows)


def create_done(g: zarr.Group, n: int, chunk_rows: int, name: str = DONE) -> None:
    # One file per flag: a flag is a single tiny write, and a torn flag reads as not done.
    g.create_array(name, shape=(n_chunks(n, chunk_rows),), chunks=(1,), dtype="uint8",
                   fill_value=0, compressors=[Crc32cCodec()], overwrite=True)


def add_hints(g: zarr.Group, scores: bool = False) -> None:
    """Give an expert unit its hints unit (with ``hint_scores`` if ``scores``). ``hints_done``
    is created before ``hints``: a bare ``hints`` array means a store from before hints had
    their own flags, when ``done`` covered them, so its flags and completeness are adopted."""
    n, rows = g["n_tokens"].shape[0], g["n_tokens"].chunks[0]
    if HINTS_FLAG not in g:
        legacy = HINTS in g
        create_done(g, n, rows, HINTS_FLAG)
        if legacy:
            g[HINTS_FLAG][:] = done_flags(g)
            mark_complete(g, HINTS_FLAG, is_complete(g))
    if HINTS not in g:
        create_array(g, HINTS, (n,), str, rows)
    if scores and HINT_SCORES not in g:
        create_array(g, HINT_SCORES, (n,), "float32", rows)


# --- progress and completeness ---------------------------------------------------------------

def done_flags(g: zarr.Group, flag: str = DONE) -> np.ndarray:
    """Per-chunk done flags; a flag that cannot be read (torn write, bad crc) counts as 0."""
    done = g[flag]
    flags = np.zeros(done.shape[0], dtype=np.uint8)
    for c in range(done.shape[0]):
        try:
            flags[c] = done[c]
        except Exception:  # noqa: BLE001 - any decode failure means "not done"
            flags[c] = 0
    return flags


def set_done(g: zarr.Group, chunk: int, flag: str = DONE, done: bool = True) -> None:
    """Flag one chunk of the unit ``flag`` tracks: only after every array of its rows."""
    g[flag][chunk] = int(done)


def unit_flags(g: zarr.Group) -> tuple[str, ...]:
    """The progress units a unit group holds: its rows, and hints with flags of their own."""
    return (DONE, HINTS_FLAG) if HINTS_FLAG in g else (DONE,)


def unit_arrays(g: zarr.Group, flag: str = DONE) -> tuple[str, ...]:
    """The arrays whose chunks ``flag`` marks done: ``hints`` under ``hints_done``, the rest
    under ``done`` (with ``hints`` too in stores from before hints had their own flags), and
    ``hint_scores`` with ``hints`` where they were scored."""
    hints = (HINTS, HINT_SCORES)
    if flag == HINTS_FLAG:
        return tuple(k for k in hints if k in g)
    own_hints = HINTS_FLAG in g
    return tuple(k for k in g.array_keys() if k not in FLAGS and not (own_hints and k in hints))


def is_complete(g: zarr.Group | None, flag: str = DONE) -> bool:
    """Whether the unit ``flag`` tracks is finished: every chunk flagged, then marked. The one
    test of "complete" for the reader, ``verify``, ``cache info`` and the grid's needs."""
    return g is not None and bool(g.attrs.get(_COMPLETE[flag]))


def mark_complete(g: zarr.Group, flag: str = DONE, complete: bool = True) -> None:
    """Set once every flag is set (``complete``), or cleared before chunks are recomputed."""
    g.attrs[_COMPLETE[flag]] = complete


def hints_complete(g: zarr.Group) -> bool:
    """Whether an expert group's hints are all stored (either store format)."""
    if HINTS_FLAG in g:
        return is_complete(g, HINTS_FLAG)
    return HINTS in g and is_complete(g)


def seal(g: zarr.Group, flag: str = DONE, fp: Any = None) -> None:
    """Record the per-chunk digests of the unit ``flag`` guards (``manifest``), bound to its
    path and fingerprint (``fp``: the items' fingerprint, set only after this). Written once
    every chunk is done, just before ``complete``."""
    bound = manifest.binding(g.path, fp if fp is not None else fingerprint(g))
    g.attrs[_SHA256[flag]] = manifest.digests(g, unit_arrays(g, flag), bound)


def has_manifest(g: zarr.Group, flag: str = DONE) -> bool:
    """Whether the unit ``flag`` guards has recorded digests (``seal``); without them a chunk
    swapped for another valid one cannot be told apart."""
    return isinstance(g.attrs.get(_SHA256[flag]), list)


def manifest_mismatches(g: zarr.Group, chunks: list[int], flag: str = DONE) -> list[int] | None:
    """Of ``chunks``, those whose rows differ from the unit's recorded digests; None when the
    unit has none (deleted, or built before they were recorded: only crc can be checked)."""
    recorded = g.attrs.get(_SHA256[flag])
    if not has_manifest(g, flag):
        return None
    fp = fingerprint(g) if unit_kind(g) is not None else stored_items_fingerprint(g)
    return manifest.mismatches(g, unit_arrays(g, flag), manifest.binding(g.path, fp), recorded,
                               chunks)


def fingerprint(g: zarr.Group | None) -> Any:
    """A unit's fingerprint (what it was computed from); None when absent or unfinished."""
    return g.attrs.get("fingerprint") if g is not None else None


def expert_meta(g: zarr.Group) -> tuple[int | None, int | None, str | None]:
    """(n_layers, d, dtype) an expert unit was stored with (``make_expert``)."""
    return g.attrs.get("n_layers"), g.attrs.get("d"), g.attrs.get("dtype")


def expert_ref(g: zarr.Group) -> tuple[str | None, str | None]:
    """(kind, ref) of the expert a unit was computed from, (None, None) where unrecorded."""
    fp = fingerprint(g)
    spec = fp.get("expert") if isinstance(fp, dict) else None
    if not isinstance(spec, dict):  # an edited fingerprint: ``unit_damage`` names it
        return None, None
    kind, ref = spec.get("kind"), spec.get("ref")
    return (kind if isinstance(kind, str) else None), (ref if isinstance(ref, str) else None)


def expert_arg(name: str, kind: str | None = None, ref: str | None = None) -> str:
    """What ``--experts`` takes for an expert: folders and hub ids by their reference (their
    slug names resolve to nothing), registry experts by name."""
    return ref if kind in ("dir", "hub") and ref else name
