"""Sharded precompute: 2 gloo ranks under torchrun write the same store as one process.

Also: hints added to a complete expert compute only the hints (their own resumable unit).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import SHARED_GSM8K, make_items, tiny_specs

from musketeers.cache import layout
from musketeers.cache.precompute import PrecomputeConfig, precompute_task
from musketeers.cache.reader import read_hints
from musketeers.cache.verify import verify_store

# 10 rows per split in chunks of 2: each rank owns several chunks, and the split is uneven
# (5 chunks over 2 ranks), so a wrong range shows up as zeros or a missing done flag.
ARGS = ["precompute", "--task", "gsm8k", "--gsm8k-dir", str(SHARED_GSM8K), "--roster", "tiny",
        "--experts", "tiny-llama", "--limit", "10", "--chunk-rows", "2", "--no-router",
        "--device", "cpu", "--dtype", "fp32", "--batch-tokens", "256"]


def run(cache: Path, nproc: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    launch = [sys.executable, "-m", "musketeers.cli.main"]
    if nproc > 1:
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                  f"--nproc_per_node={nproc}", "-m", "musketeers.cli.main"]
    proc = subprocess.run(launch + ARGS + ["--cache-dir", str(cache)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def all_arrays(g: zarr.Group, prefix: str = "") -> dict[str, np.ndarray]:
    out = {f"{prefix}{k}": a[:] for k, a in g.arrays()}
    for k, sub in g.groups():
        out.update(all_arrays(sub, f"{prefix}{k}/"))
    return out


def all_attrs(g: zarr.Group, prefix: str = "") -> dict[str, dict]:
    out = {prefix or "/": g.attrs.asdict()}
    for k, sub in g.groups():
        out.update(all_attrs(sub, f"{prefix}{k}/"))
    return out


@pytest.mark.skipif(not SHARED_GSM8K.is_dir(), reason="needs ../shared/data/gsm8k")
def test_two_gloo_ranks_equal_one_process(tmp_path):
    run(tmp_path / "one", 1)
    run(tmp_path / "two", 2)
    one = zarr.open_group(tmp_path / "one/gsm8k.zarr", mode="r")
    two = zarr.open_group(tmp_path / "two/gsm8k.zarr", mode="r")
    want, got = all_arrays(one), all_arrays(two)
    assert sorted(got) == sorted(want)
    assert "train/experts/tiny-llama/layers_last" in want
    for name, values in want.items():
        assert values.dtype == got[name].dtype and np.array_equal(values, got[name]), name
    assert all_attrs(two) == all_attrs(one)  # fingerprints, and `complete` set by rank 0
    assert two["val/experts/tiny-llama"].attrs["complete"]
    assert verify_store(tmp_path / "two/gsm8k.zarr") == []
    assert not (tmp_path / "two/gsm8k.zarr.lock").exists()  # rank 0 released the lock


def test_hints_on_a_complete_expert_compute_only_hints(tmp_path, monkeypatch):
    from musketeers.cache import precompute as pc

    items = {"train": make_items(6)}
    spec = tiny_specs()[0]
    cfg = PrecomputeConfig(chunk_rows=2, batch_tokens=128, router=False, hint_tokens=2)
    precompute_task(tmp_path / "a", "toy", {}, items, [spec], cfg)
    g = zarr.open_group(tmp_path / "a/toy.zarr/train/experts/tiny-llama", mode="r")
    before = {k: g[k][:] for k in layout.unit_arrays(g)}
    assert "hints" not in g and not layout.hints_complete(g)

    calls = {"rows": 0, "hints": 0}
    real_rows, real_hints = pc.compute_rows, pc.compute_hints

    def count(key, fn):
        def wrapped(*a, **k):
            calls[key] += 1
            return fn(*a, **k)
        return wrapped

    monkeypatch.setattr(pc, "compute_rows", count("rows", real_rows))
    monkeypatch.setattr(pc, "compute_hints", count("hints", real_hints))
    hinted = PrecomputeConfig(chunk_rows=2, batch_tokens=128, router=False, hint_tokens=2,
                              hints=True)
    precompute_task(tmp_path / "a", "toy", {}, items, [spec], hinted)
    assert calls == {"rows": 0, "hints": 3}  # 3 chunks of hints, no pooling recomputed
    g = zarr.open_group(tmp_path / "a/toy.zarr/train/experts/tiny-llama", mode="r")
    assert g.attrs["complete"] and layout.hints_complete(g)
    for k, v in before.items():
        assert np.array_equal(g[k][:], v), k

    # Same bytes as computing poolings and hints in one run.
    monkeypatch.setattr(pc, "compute_rows", real_rows)
    monkeypatch.setattr(pc, "compute_hints", real_hints)
    precompute_task(tmp_path / "b", "toy", {}, items, [spec], hinted)
    ref = zarr.open_group(tmp_path / "b/toy.zarr/train/experts/tiny-llama", mode="r")
    assert all_arrays(ref).keys() == all_arrays(g).keys()
    for k, v in all_arrays(ref).items():
        assert np.array_equal(all_arrays(g)[k], v), k
    assert read_hints(tmp_path / "a", "toy", "train", ["tiny-llama"]) == read_hints(
        tmp_path / "b", "toy", "train", ["tiny-llama"])

    monkeypatch.setattr(pc, "compute_rows", count("rows", real_rows))
    monkeypatch.setattr(pc, "compute_hints", count("hints", real_hints))
    precompute_task(tmp_path / "a", "toy", {}, items, [spec], hinted)  # nothing left to do
    assert calls == {"rows": 0, "hints": 3}


def test_unfinished_hints_are_refused_and_reported(tmp_path):
    items = {"train": make_items(4)}
    cfg = PrecomputeConfig(chunk_rows=2, batch_tokens=128, router=False, hint_tokens=2,
                           hints=True)
    precompute_task(tmp_path, "toy", {}, items, [tiny_specs()[0]], cfg)
    g = zarr.open_group(tmp_path / "toy.zarr/train/experts/tiny-llama", mode="r+")
    g[layout.HINTS_FLAG][1] = 0  # as if killed before the last hints chunk finished
    g.attrs["hints_complete"] = False
    from musketeers.cache.errors import UserError

    with pytest.raises(UserError, match="--hints"):
        read_hints(tmp_path, "toy", "train", ["tiny-llama"])
    assert [str(p) for p in verify_store(tmp_path / "toy.zarr")] == [
        "train/experts/tiny-llama: hints incomplete (1/2 chunks done)"]


RANK0_FAILS = """
from musketeers.cache.dist import Dist

dist = Dist.from_env()
def boom():
    raise OSError("disk full")
try:
    dist.on_rank0(boom)
except Exception as exc:
    print(f"rank {dist.rank}: {type(exc).__name__}: {exc}", flush=True)
dist.close()
"""


def test_a_failure_on_rank0_reaches_every_rank(tmp_path):
    """Not only UserError: any exception of rank 0's work must end the other ranks too, or
    they wait in the broadcast until the process group's 6-hour timeout."""
    script = tmp_path / "rank0_fails.py"
    script.write_text(RANK0_FAILS)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node=2", str(script)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert "rank 0: OSError: disk full" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert "rank 1: RuntimeError: rank 0 failed: OSError: disk full" in proc.stdout, (
        proc.stdout + proc.stderr[-2000:])
