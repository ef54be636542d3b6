"""What a store holds, read through ``layout`` alone: splits, items, and every expert and router
unit as complete, partial or damaged, with its hints.

``cache info`` prints it; anyone else who wants a store's state asks here instead of walking
its groups. Damage is described, never raised (``cache verify`` says what it is), so one bad
``zarr.json`` hides nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zarr

from musketeers.cache import layout, token_layout
from musketeers.cache.damage import unit_damage
from musketeers.cache.store import disk_size
from musketeers.cache.zarrio import Damaged, child, child_names


@dataclass(frozen=True)
class Progress:
    """A unit's chunks: whether it is complete and how many chunks are flagged done (None for
    hints of a store from before hints had flags of their own)."""

    complete: bool
    done: int | None = None
    chunks: int | None = None


@dataclass(frozen=True)
class TokenInfo:
    """One token unit of an expert unit (``token_layout``): its channel and layer, progress,
    tokens stored and size on disk."""

    channel: str
    layer: int
    rows: Progress | None  # None: damaged
    tokens: int = 0
    size: int = 0  # bytes on disk


@dataclass(frozen=True)
class UnitInfo:
    split: str
    kind: str  # layout.EXPERTS or layout.ROUTER; "?" when the split cannot be read
    name: str  # "?" when its container cannot be read
    damage: str | None = None
    n_layers: int | None = None
    d: int | None = None
    dtype: str | None = None
    arrays: tuple[str, ...] = ()  # what ``done`` tracks, hints aside
    rows: Progress | None = None
    hints: Progress | None = None  # None: no hints stored
    truncated: tuple[int, int] | None = None  # (prompts cut to the context, rows)
    hint_accuracy: float | None = None  # mean score of its hints under the task's scorer
    token_units: tuple[TokenInfo, ...] = ()

    @property
    def state(self) -> str:
        """``damaged``, ``complete`` or ``partial`` (an interrupted precompute)."""
        if self.damage or self.rows is None:
            return "damaged"
        return "complete" if self.rows.complete else "partial"


@dataclass(frozen=True)
class StoreInfo:
    path: Path
    format_version: Any
    items: dict[str, int | None] = field(default_factory=dict)  # readable splits: items held
    units: list[UnitInfo] = field(default_factory=list)
    # finished groups without recorded digests (``layout.seal``): a swapped chunk goes unseen
    unsealed: list[str] = field(default_factory=list)

    def experts(self, split: str) -> dict[str, UnitInfo]:
        return {u.name: u for u in self.units if u.split == split and u.kind == layout.EXPERTS}

    def router(self, split: str, encoder: str = layout.ROUTER_ENCODER) -> UnitInfo | None:
        return next((u for u in self.units if u.split == split and u.kind == layout.ROUTER
                     and u.name == encoder), None)


def describe(path: Path) -> StoreInfo:
    """The store at ``path``; ``Damaged`` only when its root cannot be read at all."""
    try:
        root = zarr.open_group(path, mode="r")
    except Exception as exc:  # noqa: BLE001 - empty folder, unreadable root zarr.json
        raise Damaged(str(path), exc) from None
    info = StoreInfo(Path(path), layout.format_version(root))
    for split in child_names(root):
        try:
            sg = child(root, split)
        except Damaged:
            info.units.append(UnitInfo(split, "?", "?", damage="unreadable metadata"))
            continue
        try:
            items = layout.items_group(sg)
            info.items[split] = layout.item_count(items)
            if layout.stored_items_fingerprint(items) and not layout.has_manifest(items):
                info.unsealed.append(items.path)
        except Damaged:
            info.items[split] = None
        for kind in child_names(sg):
            if kind in (layout.EXPERTS, layout.ROUTER):
                info.units.extend(_units(sg, split, kind, info.unsealed, Path(path)))
    return info


def _units(sg: zarr.Group, split: str, kind: str, unsealed: list[str],
           path: Path) -> list[UnitInfo]:
    try:
        container = child(sg, kind)
    except Damaged:
        return [UnitInfo(split, kind, "?", damage="unreadable metadata")]
    out = []
    for name in child_names(container):
        try:
            g = child(container, name)
            damage = unit_damage(g)
        except Damaged:
            g, damage = None, "unreadable metadata"
        out.append(UnitInfo(split, kind, name, damage=damage) if damage else
                   _unit(g, split, kind, path))
        if not damage:
            unsealed += [f"{g.path}" + ("" if flag == layout.DONE else f" ({flag})")
                         for flag in layout.unit_flags(g)
                         if layout.is_complete(g, flag) and not layout.has_manifest(g, flag)]
    return out


def _unit(g: zarr.Group, split: str, kind: str, path: Path) -> UnitInfo:
    n_layers, d, dtype = layout.expert_meta(g)
    return UnitInfo(split, kind, g.basename, n_layers=n_layers, d=d, dtype=dtype,
                    arrays=tuple(sorted(a for a in layout.unit_arrays(g) if a != layout.HINTS)),
                    rows=_progress(g, layout.DONE), hints=_hints(g), truncated=_truncated(g),
                    hint_accuracy=_hint_accuracy(g), token_units=_token_units(g, path))


def _hint_accuracy(g: zarr.Group) -> float | None:
    """The expert's own accuracy on the split: the mean score of its hints, once complete."""
    if layout.HINT_SCORES not in g or not layout.hints_complete(g):
        return None
    try:
        return float(g[layout.HINT_SCORES][:].mean())
    except Exception:  # noqa: BLE001 - a corrupt chunk: ``cache verify`` reports it
        return None


def _token_units(g: zarr.Group, path: Path) -> tuple[TokenInfo, ...]:
    out = []
    for channel in token_layout.TOKEN_CHANNELS:
        try:
            layers = token_layout.stored_layers(g, channel)
        except Damaged:
            continue  # ``cache verify`` names it
        for k in layers:
            try:
                u = token_layout.token_unit(g, channel, k)
                damaged = token_layout.unit_damage(u) is not None
            except Damaged:
                u, damaged = None, True
            size = disk_size(path / g.path / token_layout.token_path(channel, k))
            if damaged:
                out.append(TokenInfo(channel, k, None, size=size))
                continue
            flags = layout.done_flags(u)
            progress = Progress(token_layout.is_complete(u), int(flags.sum()), len(flags))
            out.append(TokenInfo(channel, k, progress, token_layout.size(u), size))
    return tuple(out)


def _progress(g: zarr.Group, flag: str) -> Progress:
    flags = layout.done_flags(g, flag)
    return Progress(layout.is_complete(g, flag), int(flags.sum()), len(flags))


def _hints(g: zarr.Group) -> Progress | None:
    if layout.HINTS not in g:
        return None
    if layout.HINTS_FLAG in layout.unit_flags(g):
        return _progress(g, layout.HINTS_FLAG)
    return Progress(layout.hints_complete(g))


def _truncated(g: zarr.Group) -> tuple[int, int] | None:
    """Prompts cut to the expert's context (they kept their last tokens), out of the rows."""
    if "truncated" not in g:
        return None
    try:
        return int(g["truncated"][:].sum()), g["truncated"].shape[0]
    except Exception:  # noqa: BLE001 - a corrupt chunk: ``cache verify`` reports it
        return None
