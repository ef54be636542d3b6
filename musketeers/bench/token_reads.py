"""How fast a token channel's rows come out of a store, and what its digest check costs.

One expert's token unit, written in precompute's format (bf16, per-row-chunk flat arrays,
ragged rows of a pocket prompt's length), is read as training reads it: batches of rows
through ``TokenRows.rows``, consecutive (an evaluation's slices of 32) and random (a training
micro-batch's 4 prompts), against the same rows read one slice at a time. The reader's
start-of-run check (every chunk decoded and hashed) is timed on the same unit, in seconds per
GiB of stored states.

    python -m musketeers.bench.token_reads --rows 512 --d 576 --batch 32
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr

from musketeers.cache import token_layout
from musketeers.cache.tokens import TokenRows
from musketeers.cache.zarrio import chunk_range, dense_writes


def build_unit(work: Path, rows: int, d: int, mean_tokens: int, chunk_rows: int = 64):
    """One complete ``tokens`` unit (bf16) of ``rows`` ragged rows, written and sealed as
    precompute writes it."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(mean_tokens // 2, mean_tokens * 3 // 2 + 1, size=rows)
    g = zarr.open_group(work / "bench.zarr", mode="w").require_group("e")
    u = token_layout.create_token_unit(g, "tokens", 1, rows, d, "bfloat16", chunk_rows,
                                       {"bench": 1})
    with dense_writes():
        for c in range(u[token_layout.DONE].shape[0]):
            lo, hi = chunk_range(c, rows, chunk_rows)
            token_layout.write_chunk(u, c, [rng.normal(size=(int(t), d)).astype(np.float32)
                                            for t in lengths[lo:hi]])
    token_layout.seal(u)
    return u


def per_row(rows: TokenRows, idx: np.ndarray) -> list[np.ndarray]:
    """The rows read one slice at a time, as ``TokenRows.rows`` did before ``take``: each row
    decodes the chunks it covers on its own (the baseline the batched read is measured by)."""
    return [rows.flat[int(rows.offsets[i]):int(rows.offsets[i + 1])] for i in idx]


def rows_per_second(read, batches: list[np.ndarray]) -> tuple[float, float]:
    """(rows per wall second, rows per CPU second of this process) reading ``batches``."""
    t0, c0 = time.perf_counter(), time.process_time()
    for b in batches:
        read(b)
    n = sum(len(b) for b in batches)
    return n / (time.perf_counter() - t0), n / (time.process_time() - c0)


def bench(work: Path, rows: int, d: int, mean_tokens: int, batch: int, reps: int) -> dict:
    """Per-row and batched reads alternate within each repetition (a shared machine's speed
    drifts), then the digest check of the whole unit."""
    u = build_unit(work, rows, d, mean_tokens)
    tr = token_layout.token_rows(u)
    rng = np.random.default_rng(1)
    shapes = {"consecutive": [np.arange(lo, min(lo + batch, rows))
                              for lo in range(0, rows, batch)],
              "random4": [rng.choice(rows, size=4, replace=False) for _ in range(rows // 4)]}
    out: dict = {"rows": rows, "d": d, "tokens": int(tr.offsets[-1]), "batch": batch,
                 "gib": token_layout.stored_bytes(u) / 2**30, "check_s": []}
    for _ in range(reps):
        for shape, batches in shapes.items():
            for way, read in (("per_row", lambda b: per_row(tr, b)), ("batched", tr.rows)):
                wall, cpu = rows_per_second(read, batches)
                out.setdefault(f"{shape}_{way}_rows_per_s", []).append(wall)
                out.setdefault(f"{shape}_{way}_rows_per_cpu_s", []).append(cpu)
        t0, c0 = time.perf_counter(), time.process_time()
        assert not token_layout.bad_chunks(u)
        out["check_s"].append(time.perf_counter() - t0)
        out.setdefault("check_cpu_s", []).append(time.process_time() - c0)
    out["check_s_per_gib"] = [s / out["gib"] for s in out["check_s"]]
    out["check_cpu_s_per_gib"] = [s / out["gib"] for s in out["check_cpu_s"]]
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--d", type=int, default=576, help="the expert's width (SmolLM2-135M: 576)")
    ap.add_argument("--mean-tokens", type=int, default=240, help="mean prompt tokens a row")
    ap.add_argument("--batch", type=int, default=32, help="rows of a consecutive batch")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="token-reads-") as tmp:
        out = bench(Path(tmp), args.rows, args.d, args.mean_tokens, args.batch, args.reps)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
