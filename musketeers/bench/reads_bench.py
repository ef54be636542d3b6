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
    from musketeers.method import methods
    from musketeers.run.data import load_split

    names = write_store(cache_dir, n)
    vec_s = repeat(lambda: reader.read_vectors(cache_dir, TASK, "train", names, "last"), reps)
    cfg = TrainConfig(task=TASK, cache_dir=str(cache_dir))
    method = methods.get(cfg.method)
    load_s = repeat(lambda: load_split(cfg, "train", names, method=method), reps)
    data = load_split(cfg, "train", names, method=method)
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


# the pocket team's widths and depths, with every array of a unit filled: the digest check at
# a run's start decodes whole units (layers included), not only the pooling the run reads
POCKET_UNITS = {"smollm2-135m-instruct": (576, 30), "gemma-3-270m": (640, 18),
                "qwen2.5-coder-0.5b-instruct": (896, 24)}


def bench_digest_check(cache_dir: Path, n: int = 512, reps: int = 3) -> dict[str, Any]:
    """Seconds a run's start spends on the digests of what it reads (a pocket store: ``n``
    items, three experts with all their arrays): ``read_vectors`` with and without the check,
    side by side on the same store."""
    from unittest import mock

    from musketeers.cache import from_memory, layout, reader
    from musketeers.cache import store as st
    from musketeers.tasks import build_items

    root = st.open_root(st.store_path(cache_dir, TASK), TASK, {"bench": True}, force=True)
    items = build_items(TASK, "train", n)
    sg = root.require_group("train")
    layout.write_items(sg, items, items_fingerprint(items), layout.CHUNK_ROWS)
    rng = np.random.default_rng(1)
    for name, (d, layers) in POCKET_UNITS.items():
        arrays = {k: rng.standard_normal((n, d), dtype=np.float32)
                  for k in ("last", "first", "random")}
        arrays |= {k: rng.standard_normal((n, layers + 1, d), dtype=np.float32)
                   for k in ("layers_last", "layers_mean")}
        from_memory.write_expert(sg, name, arrays, fingerprint={"bench": name},
                                 n_layers=layers, d=d, dtype="float32")
    names = list(POCKET_UNITS)

    def read() -> None:
        reader.read_items(cache_dir, TASK, "train")
        reader.read_vectors(cache_dir, TASK, "train", names, "last")

    checked = repeat(read, reps)
    with mock.patch.object(reader, "_checked", lambda g, *a, **k: g):
        unchecked = repeat(read, reps)
    return {"rows": n, "experts": len(names), "checked_s": checked, "unchecked_s": unchecked,
            "mib": sum(n * d * (3 + 2 * (layers + 1)) * 4 for d, layers
                       in POCKET_UNITS.values()) / 2**20}


if __name__ == "__main__":  # python -m musketeers.bench.reads_bench: the digest check alone
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(bench_digest_check(Path(tmp)))
