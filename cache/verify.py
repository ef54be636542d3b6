"""Re-read every chunk of a store: report corrupt chunks (crc32c), rows that differ from their
recorded digests, non-finite vectors and incomplete experts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

from musketeers.cache import layout, token_layout
from musketeers.cache.damage import unit_damage
from musketeers.cache.zarrio import (
    Damaged,
    child,
    child_names,
    chunk_range,
    irregular_files,
    missing_chunks,
    n_chunks,
    one_line,
)


@dataclass(frozen=True)
class Problem:
    where: str  # array or group path inside the store
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def _chunk_rows(arr: zarr.Array) -> int:
    return arr.chunks[0]


def bad_chunks(arr: zarr.Array) -> list[int]:
    """Row-chunk indices of ``arr`` whose bytes fail to decode (checksum or codec error), whose
    file is absent (zarr would read it as zeros) or whose floats are not finite."""
    return sorted(chunk_faults(arr))


def chunk_faults(arr: zarr.Array) -> dict[int, str]:
    """{chunk: ``missing``, ``corrupt`` or ``non-finite``} of every faulty row chunk of ``arr``.
    A NaN or inf vector is refused by the reader, so it is damage to recompute, like a lost
    chunk (precompute refuses to write one)."""
    rows = _chunk_rows(arr)
    faults = dict.fromkeys(missing_chunks(arr), "missing")
    floats = arr.dtype.kind == "f"
    for c in range(n_chunks(arr.shape[0], rows)):
        if c in faults:
            continue
        try:
            values = arr[c * rows : (c + 1) * rows]
        except Exception:  # noqa: BLE001 - crc32c mismatch, truncated zstd frame, ...
            faults[c] = "corrupt"
            continue
        if floats and not np.isfinite(values).all():
            faults[c] = "non-finite"
    return faults


def corrupt_chunks(g: zarr.Group, arrays: tuple[str, ...] | None = None,
                   flag: str = layout.DONE) -> set[int]:
    """Chunks of a group with any unreadable or absent array chunk of the unit ``flag`` guards,
    or rows that no longer match its recorded digests; only finished chunks count for
    progress-tracked groups, since unfinished ones are recomputed anyway."""
    names = arrays or layout.unit_arrays(g, flag)
    flags = layout.done_flags(g, flag) if flag in g else None
    bad: set[int] = set()
    for name in names:
        if name in g:
            bad.update(c for c in bad_chunks(g[name]) if flags is None or flags[c])
    rest = [c for c in _chunks(g, names) if c not in bad and (flags is None or flags[c])]
    bad.update(layout.manifest_mismatches(g, rest, flag) or [])
    return bad


def _chunks(g: zarr.Group, names: tuple[str, ...]) -> range:
    first = next((g[n] for n in names if n in g), None)
    return range(n_chunks(first.shape[0], first.chunks[0]) if first is not None else 0)


def verify_group(g: zarr.Group, progress_tracked: bool,
                 notes: list[Problem] | None = None) -> list[Problem]:
    """The problems of one group; ``notes`` collects what is only worth saying (no manifest)."""
    notes = [] if notes is None else notes
    damage = unit_damage(g)
    if damage:
        return [Problem(g.path, damage)]
    if not progress_tracked:
        return _verify_unit(g, tuple(sorted(g.array_keys())), None, notes)
    problems = [p for flag in layout.unit_flags(g)
                for p in _verify_unit(g, layout.unit_arrays(g, flag), flag, notes)]
    if layout.unit_kind(g) == layout.EXPERTS:
        problems += _verify_token_units(g, notes)
    return problems


def _verify_token_units(g: zarr.Group, notes: list[Problem]) -> list[Problem]:
    """The problems of an expert unit's token units (``token_layout``): damage, finished chunks
    that are absent, corrupt, non-finite or differ from their digests, completeness."""
    problems = []
    for channel in token_layout.TOKEN_CHANNELS:
        try:
            units = [token_layout.token_unit(g, channel, k)
                     for k in token_layout.stored_layers(g, channel)]
        except Damaged as exc:
            problems.append(Problem(exc.where, "unreadable metadata"))
            continue
        for u in units:
            if damage := token_layout.unit_damage(u):
                problems.append(Problem(u.path, damage))
                continue
            flags = layout.done_flags(u)
            rows = u[token_layout.LENGTHS]
            for c, fault in sorted(token_layout.bad_chunks(u).items()):
                lo, hi = chunk_range(c, rows.shape[0], rows.chunks[0])
                problems.append(Problem(f"{u.path}/{token_layout.FLAT}/{c}",
                                        f"{fault} chunk {c}, rows {lo}:{hi}"))
            if not token_layout.is_complete(u):
                problems.append(Problem(u.path, f"incomplete ({int(flags.sum())}/{len(flags)} "
                                                "chunks done)"))
            elif not flags.all():
                lost = [int(c) for c in np.flatnonzero(flags == 0)]
                problems.append(Problem(u.path, f"marked complete but chunks {lost} are not "
                                                "done"))
            elif not isinstance(u.attrs.get(token_layout.SHA256), list):
                notes.append(Problem(u.path, "no checksum manifest: a chunk swapped for another "
                                             "valid one is not detected"))
    return problems


def _verify_unit(g: zarr.Group, names: tuple[str, ...], flag: str | None,
                 notes: list[Problem]) -> list[Problem]:
    """Corrupt or absent finished chunks of ``names``, finished chunks whose rows differ from
    the recorded digests, and the unit's completeness when ``flag`` tracks it."""
    problems = []
    flags = layout.done_flags(g, flag) if flag else None
    bad: set[int] = set()
    for name in sorted(n for n in names if n in g):
        arr = g[name]
        rows = _chunk_rows(arr)
        for c, what in sorted(chunk_faults(arr).items()):
            if flags is not None and not flags[c]:
                continue
            bad.add(c)
            lo, hi = chunk_range(c, arr.shape[0], rows)
            text = (f"non-finite values (NaN or inf) in chunk {c}, rows {lo}:{hi}"
                    if what == "non-finite" else f"{what} chunk {c}, rows {lo}:{hi}")
            problems.append(Problem(f"{g.path}/{name}", text))
    done = [c for c in _chunks(g, names) if c not in bad and (flags is None or flags[c])]
    changed = layout.manifest_mismatches(g, done, flag or layout.DONE)
    if changed is None:
        notes.append(Problem(g.path, "no checksum manifest (deleted, or built before they were "
                                     "recorded): a chunk swapped for another valid one is not "
                                     "detected"))
    for c in changed or []:
        problems.append(Problem(g.path, f"chunk {c} differs from the digest recorded when it "
                                        "was built (swapped or edited)"))
    if flag and not layout.is_complete(g, flag):
        what = "hints incomplete" if flag == layout.HINTS_FLAG else "incomplete"
        problems.append(Problem(g.path, f"{what} ({int(flags.sum())}/{len(flags)} chunks done)"))
    elif flag and not flags.all():  # a lost flag, or a chunk deleted together with its flag
        lost = [int(c) for c in np.flatnonzero(flags == 0)]
        problems.append(Problem(g.path, f"marked complete but chunks {lost} are not done"))
    return problems


def _members(g: zarr.Group, problems: list[Problem]) -> list[zarr.Group]:
    """The readable member groups of ``g``; each unreadable one becomes a problem."""
    out = []
    for name in child_names(g):
        try:
            out.append(child(g, name))
        except Damaged as exc:
            problems.append(Problem(exc.where, "unreadable metadata"))
    return out


def verify_store(path: Path) -> list[Problem]:
    """Every problem in one task store, one line each; an empty list means it is sound."""
    return inspect_store(path)[0]


def inspect_store(path: Path) -> tuple[list[Problem], list[Problem]]:
    """(problems, notes) of one task store: notes say what could not be checked."""
    if path.is_dir() and not any(p.suffix != ".partial" for p in path.iterdir()):
        return [Problem(str(path), "empty store folder (killed before anything was written)")], []
    if odd := irregular_files(path):  # reading one would block or never end: nothing is read
        return [Problem(f"{path}/{name}", "not a regular file (a FIFO, socket or device); "
                                          "remove it") for name in odd], []
    try:
        root = zarr.open_group(path, mode="r")
    except Exception as exc:  # noqa: BLE001
        return [Problem(str(path), f"not a readable store ({one_line(exc)})")], []
    problems: list[Problem] = []
    notes: list[Problem] = []
    units: dict[str, set[str]] = {}  # split -> its unit paths, which every split must share
    splits = _members(root, problems)
    for missing in sorted(set(layout.store_splits(root)) - set(child_names(root))):
        problems.append(Problem(missing, "missing split (the store was built with it)"))
    for sg in splits:
        units[sg.basename] = set()
        if layout.ITEMS not in child_names(sg):
            problems.append(Problem(sg.path, "missing items"))
        for g in _members(sg, problems):
            if g.basename == layout.ITEMS:
                problems += verify_group(g, progress_tracked=False, notes=notes)
                if not unit_damage(g) and layout.stored_items_fingerprint(g) is None:
                    problems.append(Problem(g.path, "items were never finished"))
            elif g.basename in (layout.EXPERTS, layout.ROUTER):
                units[sg.basename] |= {f"{g.basename}/{n}" for n in child_names(g)}
                for unit in _members(g, problems):
                    problems += verify_group(unit, progress_tracked=True, notes=notes)
    every = set().union(*units.values()) if units else set()
    for split, have in units.items():
        problems += [Problem(f"{split}/{u}", "missing (another split holds it)")
                     for u in sorted(every - have)]
    if any(p.name.endswith(".partial") for p in path.rglob("*.partial")):
        problems.append(Problem(str(path), "leftover *.partial files of a killed write"))
    return problems, notes
