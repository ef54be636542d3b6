"""Cache reads: loading a run's pooled vectors once, and the per-step row lookup.

The store is written here through the cache's own layout code (``from_memory.write_expert``)
at a realistic size: a full 16k-row train split, three experts of the pocket widths. Only the
``last`` pooling holds vectors (the other arrays are zeros), which is what a default run
reads; the vectors are random float32 (hidden states compress about as badly).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from musketeers.bench.machine import repeat
from musketeers.cache.items import items_fingerprint

WIDTHS = {"bench-a-576": 576, "bench-b-640": 640, "bench-c-896": 896}
# the task's own items (a run refuses a store whose items its task does not generate); the
# fastest family to generate, since the vectors beside them are synthetic anyway
TASK = "algorithmic"


def write_store(cache_dir: Path, n: int, chunk_rows: int = 64) -> list[str]:
    """A complete ``train`` split of ``n`` rows with one ``last`` array per expert."""
    from musketeers.cache import from_memory, layout
    from musketeers.cache import store as st
    from musketeers.tasks import build_items

    root = st.open_root(st.store_path(cache_dir, TASK), TASK, {"bench": True}, force=True)
    items = build_items(TASK, "train", n)
    sg = root.require_group("train")
    layout.write_items(sg, items, items_fingerprint(items), chunk_rows)
    rng = np.random.default_rng(1)
    for name, d in WIDTHS.items():
        # the other arrays are written as zeros (the reader refuses absent chunks as damage)
        last = rng.standard_normal((n, d), dtype=np.float32)
        from_memory.write_expert(sg, name, {"last": last}, fingerprint={"bench": name},
                                 n_layers=1, d=d, dtype="bfloat16", chunk_rows=chunk_rows)
    return list(WIDTHS)


def bench_reads(cache_dir: Path, n: int, reps: int, batch_rows: int,
                lookups: int = 2000) -> dict[str, Any]:
    """Seconds to read the vectors, to load the whole split as a run does, and per lookup."""
    from musketeers.cache import reader
    from musketeers.config import TrainConfig
    from musketeers.run.data import load_split

    names = write_store(cache_dir, n)
    vec_s = repeat(lambda: reader.read_vectors(cache_dir, TASK, "train", names, "last"), reps)
    cfg = TrainConfig(task=TASK, cache_dir=str(cache_dir))
    load_s = repeat(lambda: load_split(cfg, "train", names), reps)
    data = load_split(cfg, "train", names)
    g = torch.Generator().manual_seed(0)
    per_lookup = []
    for _ in range(reps):
        idx = [torch.randperm(n, generator=g)[:batch_rows] for _ in range(lookups)]
        t0 = time.perf_counter()
        for i in idx:
            data.batch(i)
        per_lookup.append((time.perf_counter() - t0) / lookups)
    return {"rows": n, "experts": len(names), "mib": sum(WIDTHS.values()) * n * 4 / 2**20,
            "read_vectors_s": vec_s, "load_split_s": load_s, "lookup_s": per_lookup}
