"""Damage of one store group, found from its metadata before any row is read: a unit killed
while created, attributes of the wrong type or beyond the store's bounds (an edited
``zarr.json``), missing arrays, shapes that disagree with the split's items. The layout it
checks against is ``musketeers.cache.layout``'s; the reader, precompute, ``cache verify`` and
``cache info`` all ask here, so none can read past damage another would report. A reader's
whole check of a group (that, lost chunk files, chunks unlike their recorded digests) is
``read_check``, one pass.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import zarr

from musketeers.cache.layout import (
    CHUNK_ROWS,
    DONE,
    EXPERT_ARRAYS,
    EXPERTS,
    FLAGS,
    ITEM_FIELDS,
    ITEMS,
    MAX_CHUNK_VALUES,
    MAX_CHUNKS,
    MAX_DIM,
    MAX_LAYERS,
    MAX_ROWS,
    ROUTER,
    ROUTER_ARRAYS,
    expert_meta,
    fingerprint,
    is_complete,
    is_count,
    item_count,
    manifest_mismatches,
    unit_arrays,
    unit_kind,
)
from musketeers.cache.zarrio import child_names, missing_chunks, n_chunks


class UnitFacts(NamedTuple):
    """What the reader and the damage checks compare, read once from a group's metadata and
    listing (an items group, or a unit)."""

    kind: str | None  # experts / router for a unit, None for another group
    fingerprint: Any
    complete: bool
    n_layers: Any  # an expert unit's recorded sizes (None elsewhere), checked before use
    d: Any
    n: int | None  # the item count of its split (None: unknown or unreadable)
    names: list[str]  # its members, listed without parsing them


def unit_facts(g: zarr.Group) -> UnitFacts:
    n = item_count(g) if g.basename == ITEMS else _split_items(g)
    kind = unit_kind(g)
    n_layers, d, _ = expert_meta(g) if kind == EXPERTS else (None, None, None)
    return UnitFacts(kind, fingerprint(g), is_complete(g), n_layers, d, n, child_names(g))


def _split_items(g: zarr.Group) -> int | None:
    """The item count of the split a unit lies in; None when it cannot be read."""
    try:
        return item_count(zarr.open_group(g.store, path=f"{g.path.split('/')[0]}/{ITEMS}",
                                          mode="r"))
    except Exception:  # noqa: BLE001 - absent or damaged items are reported on their own
        return None


def required_arrays(g: zarr.Group) -> tuple[str, ...]:
    """The arrays a group of this kind cannot be read without (its place in the layout)."""
    kind = unit_kind(g)
    if kind == EXPERTS:
        return EXPERT_ARRAYS + (DONE,)
    if kind == ROUTER:
        return ROUTER_ARRAYS + (DONE,)
    return ITEM_FIELDS if g.path.endswith(ITEMS) else ()


def unit_damage(g: zarr.Group, facts: UnitFacts | None = None) -> str | None:
    """Why a group's structure cannot be trusted (one phrase), or None: created but never
    finished, a member with unreadable metadata, or a required array missing. ``facts``: its
    ``unit_facts`` where the caller has read them already."""
    facts = facts or unit_facts(g)
    if facts.kind is not None and facts.fingerprint is None:
        return "unfinished (killed while being created)"
    if attrs := attr_damage(g, facts):
        return attrs
    for name in facts.names:
        try:
            g[name]
        except Exception:  # noqa: BLE001
            return f"array {name} has unreadable metadata"
    missing = [n for n in required_arrays(g) if n not in facts.names]
    if missing:
        return f"missing array {', '.join(missing)}"
    return size_damage(g) or shape_damage(g, facts)


def attr_damage(g: zarr.Group, facts: UnitFacts) -> str | None:
    """An attribute of the wrong type or beyond the bounds (an edited ``zarr.json``), which
    every reader would otherwise trip over: ``n`` of items, a unit's fingerprint, d, n_layers."""
    if facts.kind is None:
        if g.path.endswith(ITEMS) and not is_count(g.attrs.get("n"), MAX_ROWS):
            return f"attribute n is {g.attrs.get('n')!r}, not an item count in 0..{MAX_ROWS}"
        return None
    if not isinstance(facts.fingerprint, dict):
        return (f"attribute fingerprint is a {type(facts.fingerprint).__name__}, "
                "not a mapping")
    if facts.kind == EXPERTS:
        for name, value, most in (("d", facts.d, MAX_DIM),
                                  ("n_layers", facts.n_layers, MAX_LAYERS)):
            if value is not None and not is_count(value, most):
                return f"attribute {name} is {value!r}, not a size in 0..{most}"
    return None


def size_damage(g: zarr.Group) -> str | None:
    """An array whose rows, chunks or chunk size exceed the store's bounds: refused before any
    check iterates over them."""
    for name in g.array_keys():
        arr = g[name]
        rows = arr.chunks[0] if arr.ndim else 0
        if arr.ndim == 0 or rows < 1 or arr.shape[0] > MAX_ROWS:
            return f"array {name} has shape {arr.shape}, beyond {MAX_ROWS} rows"
        if n_chunks(arr.shape[0], rows) > MAX_CHUNKS or \
                int(np.prod(arr.chunks, dtype=np.float64)) > MAX_CHUNK_VALUES:
            return f"array {name} has chunks {arr.chunks}, beyond the store's bounds"
    return None


def expected_shapes(g: zarr.Group, facts: UnitFacts) -> dict[str, tuple[int, ...]]:
    """The shape each array of ``g`` must have for its split's ``facts.n`` items (trailing
    sizes from the unit's own ``d`` / ``n_layers`` where recorded)."""
    n, d, n_layers = facts.n, facts.d, facts.n_layers
    arrays = {name: g[name] for name in g.array_keys()}
    rows = next((a.chunks[0] for k, a in arrays.items() if k not in FLAGS), CHUNK_ROWS)
    want: dict[str, tuple[int, ...]] = {}
    for name, arr in arrays.items():
        if name in FLAGS:
            want[name] = (n_chunks(n, rows),)
        elif name in ("last", "first", "random") and d is not None:
            want[name] = (n, d)
        elif name in ("layers_last", "layers_mean") and None not in (d, n_layers):
            want[name] = (n, n_layers + 1, d)
        else:
            want[name] = (n, *arr.shape[1:])
    return want


def shape_damage(g: zarr.Group, facts: UnitFacts) -> str | None:
    """An array whose shape disagrees with its split's item count or the unit's d / n_layers
    (an edited ``zarr.json``): its rows would be read against the wrong items."""
    if facts.n is None:
        return None
    for name, want in expected_shapes(g, facts).items():
        if g[name].shape != want:
            return (f"array {name} has shape {g[name].shape}, expected {want} for {facts.n} "
                    "items")
    return None


class Check(NamedTuple):
    """What ``read_check`` found: why the group's rows cannot be trusted (None: they can), how
    many row chunks it compared with their digests, and whether it has digests at all."""

    damage: str | None
    chunks: int
    sealed: bool


def read_check(g: zarr.Group, facts: UnitFacts | None = None, flag: str = DONE,
               structure: bool = True) -> Check:
    """All a reader asks before it trusts ``g``'s rows, in one pass: (``structure``) its
    metadata whole (``unit_damage``) and every chunk file of its required arrays present (a
    listing, not a decode: decode errors surface when read); then every row chunk of the unit
    ``flag`` guards hashing to the digest recorded when it was built, so that a chunk swapped
    for another valid one (train's for val's) is refused, not trained on."""
    if structure:
        damage = unit_damage(g, facts)
        for name in required_arrays(g) if damage is None else ():
            gone = missing_chunks(g[name])
            if gone and name not in FLAGS:
                damage = f"array {name} lost chunk {gone[0]}"
                break
        if damage:
            return Check(damage, 0, True)
    first = g[unit_arrays(g, flag)[0]]
    chunks = list(range(n_chunks(first.shape[0], first.chunks[0])))
    changed = manifest_mismatches(g, chunks, flag)
    if changed:
        return Check(f"chunks {changed} differ from the digests recorded when it was built: "
                     "swapped or edited", len(chunks), True)
    return Check(None, len(chunks), changed is not None)
