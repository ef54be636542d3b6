"""A store unit's resumable life in precompute: prepared (created, checked against its
fingerprint, its damaged or corrupt chunks reopened), filled chunk by chunk with each chunk's
flag set after its arrays (never a non-finite value), then sealed and marked complete."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import zarr

from musketeers.cache import layout
from musketeers.cache.channels import TokenUnits
from musketeers.cache.compute import STATES, Scorer
from musketeers.cache.damage import unit_damage
from musketeers.cache.dist import Dist
from musketeers.cache.errors import UserError
from musketeers.cache.items import Item
from musketeers.cache.progress import progress
from musketeers.cache.verify import corrupt_chunks
from musketeers.cache.zarrio import Damaged, child, chunk_range, dense_writes, require_container

log = logging.getLogger("musketeers.precompute")


Tick = Callable[[int], None]  # a compute's report of items finished inside its chunk


def run_chunks(g: zarr.Group, n: int, chunk_rows: int, dist: Dist, desc: str,
               compute: Callable[[int, int, Tick], tuple[dict, int]], flag: str = layout.DONE,
               side: TokenUnits | None = None) -> None:
    """Compute this rank's unfinished chunks: arrays first, then the chunk's ``flag``; the
    token ``side`` units take the states of the same pass, for the chunks they lack.
    ``compute(lo, hi, tick)`` may call ``tick(k)`` as it finishes ``k`` items of the chunk, so
    that a slow chunk (greedy hints) shows progress before it ends."""
    flags = layout.done_flags(g, flag)
    mine = dist.my_chunks(len(flags))
    lacking = side.todo() if side is not None else set()
    todo = [c for c in mine if not flags[c] or c in lacking]
    total = sum(np.subtract(*chunk_range(c, n, chunk_rows)[::-1]) for c in todo)
    with progress(desc, total=int(total)) as bar:
        for c in todo:
            lo, hi = chunk_range(c, n, chunk_rows)
            ticked = 0

            def tick(k: int, hi: int = hi, lo: int = lo) -> None:
                nonlocal ticked
                k = min(k, hi - lo - ticked)  # never past the chunk's own rows
                ticked += k
                bar.advance(k)

            arrays, tokens = compute(lo, hi, tick)
            states = arrays.pop(STATES, {})
            if side is not None:
                side.write(c, states)
            if flags[c]:  # done before: its sealed bytes are kept
                bar.advance(hi - lo - ticked, tokens=tokens)
                continue
            for name, values in arrays.items():
                refuse_non_finite(g, name, values, lo, hi)
                g[name][lo:hi] = values
            layout.set_done(g, c, flag)
            bar.advance(hi - lo - ticked, tokens=tokens)


def refuse_non_finite(g: zarr.Group, name: str, values: np.ndarray, lo: int, hi: int) -> None:
    """A NaN or inf vector (a half dtype overflowing) is never stored: the reader would refuse
    it, and a run on it trains to NaN metrics."""
    values = np.asarray(values)
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        raise UserError(f"{g.path}: the expert computed non-finite values (NaN or inf) in "
                        f"{name}, rows {lo}:{hi}; precompute it in float32 (--dtype float32)")


def prepare_group(split: zarr.Group, path: str, fingerprint: dict, force: bool,
                  rebuild: str, make: Callable[[zarr.Group], None]) -> bool:
    """Whether the group needs work. Creates it, refuses a fingerprint mismatch, or marks the
    chunks that ``verify`` finds corrupt or absent as not done so they are recomputed."""
    kind, name = path.rsplit("/", 1)  # a layout.expert_path or layout.router_path
    parent = require_container(split, kind)
    try:
        g = child(parent, name)
        # No fingerprint (killed while creating it), a lost or unreadable array: the group's
        # rows cannot be trusted, and recomputing it costs what resuming every chunk would.
        damage = None if g is None or force else unit_damage(g)
    except Damaged:
        g, damage = True, "unreadable metadata"
    if g is not None and (force or damage):
        if damage:
            log.warning("%s/%s: %s; recomputing it", split.path, path, damage)
        del parent[name]
        g = None
    if g is not None:
        if layout.fingerprint(g) != fingerprint:
            raise UserError(f"{split.path}/{path} was built from other inputs; rebuild: {rebuild}")
        return _reopen_bad(g, layout.DONE)
    layout.create_unit(parent, name, fingerprint, make)
    return True


def prepare_hints(g: zarr.Group, items: list[Item], scorer: Scorer | None = None) -> bool:
    """Whether the expert's hints need work. Hints are their own resumable unit (``hints``,
    ``hints_done`` flags, ``hints_complete``: ``layout.add_hints``), so adding them to a
    complete expert runs only generation. Hints stored unscored are scored from their text."""
    unscored = scorer is not None and layout.HINT_SCORES not in g and layout.HINTS in g
    layout.add_hints(g, scorer is not None)
    if unscored and layout.HINTS_FLAG in g:
        with dense_writes():
            for c in np.flatnonzero(layout.done_flags(g, layout.HINTS_FLAG)).tolist():
                lo, hi = chunk_range(c, len(items), g[layout.HINTS].chunks[0])
                texts = g[layout.HINTS][lo:hi]
                g[layout.HINT_SCORES][lo:hi] = [scorer(it, str(t))
                                                for it, t in zip(items[lo:hi], texts, strict=True)]
        if layout.is_complete(g, layout.HINTS_FLAG):  # else sealed when the rest is generated
            layout.seal(g, layout.HINTS_FLAG)
    return _reopen_bad(g, layout.HINTS_FLAG)


def _reopen_bad(g: zarr.Group, flag: str) -> bool:
    """Clear the flags of corrupt chunks of the unit ``flag`` guards; whether work remains."""
    bad = corrupt_chunks(g, flag=flag)
    if layout.is_complete(g, flag) and not bad and layout.done_flags(g, flag).all():
        return False
    for c in sorted(bad):
        layout.set_done(g, c, flag, done=False)
    if bad:
        log.warning("%s: recomputing %s chunks %s", g.path, flag, sorted(bad))
    layout.mark_complete(g, flag, False)
    return True


def finish(g: zarr.Group, dist: Dist, flag: str = layout.DONE) -> None:
    """After every rank's chunks: rank 0 records the unit's digests and marks it complete if
    every flag is set."""
    dist.barrier()
    if dist.rank == 0 and layout.done_flags(g, flag).all():
        layout.seal(g, flag)
        layout.mark_complete(g, flag)
    dist.barrier()
