"""A slow chunk shows progress before it ends: ``run_chunks`` passes each compute a ``tick``
that advances the bar by the items finished so far, and tops the chunk up to its rows."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import zarr

from musketeers.cache import layout, units
from musketeers.cache.dist import Dist


class Recorder:
    def __init__(self) -> None:
        self.steps: list[int] = []

    def advance(self, n: int = 1, tokens: int = 0) -> None:
        self.steps.append(n)


def test_a_chunk_advances_as_its_batches_finish(monkeypatch):
    bar = Recorder()

    @contextmanager
    def progress(desc, total, unit="items"):
        assert total == 10
        yield bar

    monkeypatch.setattr(units, "progress", progress)
    g = zarr.open_group(zarr.storage.MemoryStore(), mode="w")
    layout.make_router(g, 10, 3, chunk_rows=8)  # chunks of 8 and 2 rows

    def compute(lo, hi, tick):
        for _ in range(lo, hi, 3):  # batches of 3 rows, the last one short
            tick(3)  # a batch's size, which may run past the chunk's end: clipped
        return {"emb": np.ones((hi - lo, 3), np.float32)}, 0

    units.run_chunks(g, 10, 8, Dist(), "toy", compute)
    assert bar.steps == [3, 3, 2, 0, 2, 0]  # during the chunk, then the rest at its end
    assert sum(bar.steps) == 10 and layout.done_flags(g).all()


def test_a_compute_that_never_ticks_still_counts_every_row(monkeypatch):
    bar = Recorder()

    @contextmanager
    def progress(desc, total, unit="items"):
        yield bar

    monkeypatch.setattr(units, "progress", progress)
    g = zarr.open_group(zarr.storage.MemoryStore(), mode="w")
    layout.make_router(g, 10, 3, chunk_rows=8)
    units.run_chunks(g, 10, 8, Dist(), "toy",
                     lambda lo, hi, tick: ({"emb": np.ones((hi - lo, 3), np.float32)}, 0))
    assert bar.steps == [8, 2]
