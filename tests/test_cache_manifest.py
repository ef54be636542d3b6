"""`cache verify` finds every damage the crc of a chunk file cannot: chunks swapped for other
valid ones, lost flags of a complete unit, edited shapes, a lost split or a lost expert."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import make_items

from musketeers.cache import from_memory, layout
from musketeers.cache import store as st
from musketeers.cache.items import items_fingerprint
from musketeers.cache.verify import inspect_store, verify_store

N, D, ROWS = 8, 3, 4  # two row chunks per split


def build(cache_dir: Path) -> Path:
    """A two-split store of one expert, written from memory in precompute's format."""
    path = st.store_path(cache_dir, "toy")
    root = st.open_root(path, "toy", {}, force=True)
    for k, split in enumerate(layout.SPLITS):
        items = make_items(N, seed=k)
        sg = root.require_group(split)
        layout.write_items(sg, items, items_fingerprint(items), ROWS)
        vec = np.arange(N * D, dtype=np.float32).reshape(N, D) + 100 * k
        from_memory.write_expert(sg, "e", {"last": vec}, fingerprint={"e": split},
                                 n_layers=1, d=D, dtype="float32", chunk_rows=ROWS)
    return path


def _unit(path: Path, split: str = "train") -> Path:
    return path / split / "experts" / "e"


def swap_vector_chunk(path: Path) -> None:
    a, b = _unit(path) / "last/c/0/0", _unit(path, "val") / "last/c/0/0"
    data = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data)


def drop_flag_and_chunk(path: Path) -> None:
    (_unit(path) / "done/c/1").unlink()
    (_unit(path) / "last/c/1/0").unlink()


def halve_rows(path: Path) -> None:
    meta = _unit(path) / "last/zarr.json"
    spec = json.loads(meta.read_text())
    spec["shape"][0] = N // 2
    meta.write_text(json.dumps(spec))


def drop_val(path: Path) -> None:
    shutil.rmtree(path / "val")


def drop_val_expert(path: Path) -> None:
    shutil.rmtree(_unit(path, "val"))


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "swapped vector chunk": (swap_vector_chunk, "train/experts/e: chunk 0 differs from the"),
    "flag deleted with its chunk": (drop_flag_and_chunk,
                                    "train/experts/e: marked complete but chunks [1]"),
    "shape 8 -> 4": (halve_rows, "train/experts/e: array last has shape (4, 3), expected (8, 3)"),
    "val split deleted": (drop_val, "val: missing split"),
    "expert removed from val": (drop_val_expert, "val/experts/e: missing (another split"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_verify_finds_damage_a_chunk_crc_cannot(cache_dir: Path, damage: str):
    path = build(cache_dir)
    assert inspect_store(path) == ([], [])  # as built: sound, and nothing left unchecked
    do, expected = DAMAGE[damage]
    do(path)
    problems = [str(p) for p in verify_store(path)]
    assert any(p.startswith(expected) for p in problems), problems


def test_a_store_without_a_manifest_verifies_with_a_note(cache_dir: Path):
    path = build(cache_dir)
    for split in layout.SPLITS:  # as a store from before manifests were recorded
        for g in (zarr.open_group(path / split / "items", mode="r+"),
                  zarr.open_group(_unit(path, split), mode="r+")):
            del g.attrs["sha256"]
    problems, notes = inspect_store(path)
    assert problems == [] and len(notes) == 4
    assert all("no checksum manifest" in str(n) for n in notes)


def test_the_manifest_is_bound_to_the_units_fingerprint(cache_dir: Path):
    """Rows and digests copied together from val to train still fail: the digest names val."""
    path = build(cache_dir)
    src, dst = _unit(path, "val"), _unit(path)
    shutil.copytree(src / "last", dst / "last", dirs_exist_ok=True)
    meta = json.loads((src / "zarr.json").read_text())["attributes"]["sha256"]
    g = zarr.open_group(dst, mode="r+")
    g.attrs["sha256"] = meta
    assert any("differs from the digest" in str(p) for p in verify_store(path))


def test_cache_verify_calls_a_store_without_manifests_unverifiable(tmp_path: Path):
    """Not "OK": a store whose digests are gone (never recorded, or deleted) cannot show that
    no chunk was swapped; it exits 3, naming the rebuild that records them."""
    from typer.testing import CliRunner

    from musketeers.cli.main import app

    fixtures = Path(__file__).resolve().parent / "fixtures"
    shutil.copytree(fixtures / "arithmetic.zarr", tmp_path / "arithmetic.zarr")
    out = CliRunner().invoke(app, ["cache", "verify", "arithmetic", "--cache-dir",
                                   str(tmp_path)])
    assert out.exit_code == 3, out.output
    assert "UNVERIFIABLE" in out.output and "no checksum manifest" in out.output
    assert "--force" in out.output and "arithmetic.zarr: OK" not in out.output
