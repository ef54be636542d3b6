"""A corrupted chunk is reported with array and rows, refused by the reader, and repaired."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from conftest import make_items, tiny_specs

from musketeers.cache import reader
from musketeers.cache import store as st
from musketeers.cache.errors import UserError
from musketeers.cache.precompute import PrecomputeConfig, precompute_task
from musketeers.cache.verify import verify_store


def test_flipped_bytes_reported_refused_and_repaired(cache_dir):
    cfg = PrecomputeConfig(chunk_rows=4, router=False)
    items, spec = {"train": make_items(10)}, tiny_specs()[1]
    precompute_task(cache_dir, "toy", {}, items, [spec], cfg)
    path = st.store_path(cache_dir, "toy")
    want = zarr.open_group(path, mode="r")["train/experts/tiny-gpt2/last"][:]
    assert verify_store(path) == []
    chunk = path / "train/experts/tiny-gpt2/last/c/1/0"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    other = path / "train/experts/tiny-gpt2/last/c/0/0"
    other_mtime = other.stat().st_mtime_ns

    problems = [str(p) for p in verify_store(path)]
    assert problems == ["train/experts/tiny-gpt2/last: corrupt chunk 1, rows 4:8"]
    with pytest.raises(UserError, match="corrupt"):
        reader.read_vectors(cache_dir, "toy", "train", ["tiny-gpt2"], "last")

    precompute_task(cache_dir, "toy", {}, items, [spec], cfg)
    assert verify_store(path) == []
    assert other.stat().st_mtime_ns == other_mtime  # only the bad chunk was recomputed
    np.testing.assert_array_equal(
        reader.read_vectors(cache_dir, "toy", "train", ["tiny-gpt2"], "last")[0], want)


def test_incomplete_expert_reported(cache_dir):
    cfg = PrecomputeConfig(chunk_rows=4, router=False)
    precompute_task(cache_dir, "toy", {}, {"train": make_items(6)}, [tiny_specs()[1]], cfg)
    path = st.store_path(cache_dir, "toy")
    g = zarr.open_group(path)["train/experts/tiny-gpt2"]
    g["done"][1] = 0
    g.attrs["complete"] = False
    assert [str(p) for p in verify_store(path)] == [
        "train/experts/tiny-gpt2: incomplete (1/2 chunks done)"]
    with pytest.raises(UserError, match="incomplete"):
        reader.read_vectors(cache_dir, "toy", "train", ["tiny-gpt2"], "last")
