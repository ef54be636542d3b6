"""``layout`` is the one owner of the store layout: a store written by ``write_expert`` is one
precompute could have written, ``describe`` and every reader agree on what is complete, and an
older format is refused by precompute too, naming the rebuild."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import make_items

from musketeers.cache import from_memory, layout, reader
from musketeers.cache import store as st
from musketeers.cache.describe import describe
from musketeers.cache.errors import UserError
from musketeers.cache.items import items_fingerprint
from musketeers.cache.precompute import PrecomputeConfig, precompute_task
from musketeers.cache.verify import verify_store
from musketeers.cache.zarrio import missing_chunks

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TASK = "toy"


def synthetic_store(cache: Path, n: int = 10, hints: bool = False) -> dict[str, np.ndarray]:
    """A one-split store with one expert written by ``write_expert`` from memory."""
    root = st.open_root(st.store_path(cache, TASK), TASK, {"v": 1}, force=True)
    sg = root.require_group("train")
    items = make_items(n)
    layout.write_items(sg, items, items_fingerprint(items), 4)
    rng = np.random.default_rng(0)
    arrays = {"last": rng.standard_normal((n, 8), dtype=np.float32),
              "layers_last": rng.standard_normal((n, 3, 8), dtype=np.float32)}
    if hints:
        arrays["hints"] = np.array([f"h{i}" for i in range(n)], dtype=object)
    from_memory.write_expert(sg, "e", arrays, fingerprint={"test": 1}, n_layers=2, d=8,
                             dtype="float32", hints=hints, chunk_rows=4)
    return arrays


def test_write_expert_is_a_complete_dense_unit_the_reader_and_verify_accept(tmp_path: Path):
    arrays = synthetic_store(tmp_path, hints=True)
    path = st.store_path(tmp_path, TASK)
    g = zarr.open_group(path, mode="r")["train/experts/e"]
    assert sorted(k for k, _ in g.arrays()) == sorted(layout.EXPERT_ARRAYS + layout.FLAGS
                                                      + (layout.HINTS,))
    assert all(missing_chunks(a) == [] for _, a in g.arrays())  # bool arrays too
    assert layout.is_complete(g) and layout.hints_complete(g) and verify_store(path) == []
    got = reader.read_vectors(tmp_path, TASK, "train", ["e"], "last")[0]
    np.testing.assert_array_equal(got, arrays["last"])
    np.testing.assert_array_equal(
        reader.read_vectors(tmp_path, TASK, "train", ["e"], "first_layer")[0],
        arrays["layers_last"][:, 0])
    first = reader.read_vectors(tmp_path, TASK, "train", ["e"], "first_token")[0]
    np.testing.assert_array_equal(first, np.zeros((10, 8), np.float32))  # not given: zeros
    assert reader.read_hints(tmp_path, TASK, "train", ["e"]) == [[f"h{i}"] for i in range(10)]


def test_write_expert_refuses_what_is_no_expert_array(tmp_path: Path):
    sg = zarr.open_group(tmp_path / "s.zarr", mode="w").require_group("train")
    with pytest.raises(ValueError, match="not arrays of an expert unit"):
        from_memory.write_expert(sg, "e", {"lats": np.zeros((2, 4))}, fingerprint={},
                                 n_layers=1, d=4, dtype="float32")


def test_describe_tells_complete_partial_and_damaged_units(tmp_path: Path):
    cache = tmp_path / "stores"
    shutil.copytree(FIXTURES / "arithmetic.zarr", cache / "arithmetic.zarr")
    path = cache / "arithmetic.zarr"
    info = describe(path)
    assert info.format_version == layout.FORMAT_VERSION and info.items == {"train": 32, "val": 16}
    experts = info.experts("train")
    assert {u.state for u in experts.values()} == {"complete"} and len(experts) == 5
    assert info.router("val").state == "complete"
    assert experts["tiny-gpt2"].hints.complete  # a store from before hints had their own flags

    g = zarr.open_group(path / "train/experts/tiny-gpt2", mode="r+")
    layout.set_done(g, 1, done=False)
    layout.mark_complete(g, complete=False)
    (path / "train/experts/tiny-llama/zarr.json").write_text("{not json")
    experts = describe(path).experts("train")
    assert experts["tiny-gpt2"].state == "partial" and experts["tiny-gpt2"].rows.done == \
        experts["tiny-gpt2"].rows.chunks - 1
    assert experts["tiny-llama"].state == "damaged"
    assert experts["tiny-qwen2"].state == "complete"


def test_the_grid_and_the_reader_agree_on_an_incomplete_expert(tmp_path: Path):
    from musketeers.grid.needs import TaskNeed, missing

    cache = tmp_path / "stores"
    shutil.copytree(FIXTURES / "arithmetic.zarr", cache / "arithmetic.zarr")
    need = TaskNeed("arithmetic", str(cache), "tiny", experts={"tiny-gpt2": None}, router=True)
    root = reader.open_store(cache, "arithmetic")
    assert missing(need, root) == ([], [], False)
    layout.mark_complete(zarr.open_group(cache / "arithmetic.zarr/val/experts/tiny-gpt2",
                                         mode="r+"), complete=False)
    layout.mark_complete(zarr.open_group(cache / "arithmetic.zarr/train/router/"
                                         f"{layout.ROUTER_ENCODER}", mode="r+"), complete=False)
    with pytest.raises(UserError, match="'tiny-gpt2' is incomplete"):
        reader.read_vectors(cache, "arithmetic", "val", ["tiny-gpt2"], "last")
    with pytest.raises(UserError, match="missing or incomplete"):
        reader.read_router(cache, "arithmetic", "train")
    assert missing(need, reader.open_store(cache, "arithmetic")) == (["tiny-gpt2"], [], True)


def test_precompute_refuses_a_store_of_another_format_naming_its_rebuild(tmp_path: Path):
    cache = tmp_path / "stores"
    shutil.copytree(FIXTURES / "arithmetic.zarr", cache / "arithmetic.zarr")
    path = cache / "arithmetic.zarr"
    spec = json.loads((path / "zarr.json").read_text())["attributes"]["task_spec"]
    root = zarr.open_group(path, mode="r+")
    root.attrs["format_version"] = layout.FORMAT_VERSION - 1
    cfg = PrecomputeConfig(router=False)
    with pytest.raises(UserError, match=r"another format or task spec; rebuild: musketeers "
                                        r"precompute --task arithmetic.*--force") as err:
        precompute_task(cache, "arithmetic", spec, {"train": make_items(3)}, [], cfg)
    assert f"--cache-dir {cache}" in str(err.value) and "\n" not in str(err.value)
    assert zarr.open_group(path, mode="r").attrs["format_version"] == layout.FORMAT_VERSION - 1


def test_items_read_back_as_written_an_empty_gold_included(tmp_path: Path):
    from dataclasses import replace

    items = make_items(4)
    items[1] = replace(items[1], answer="")  # a generated item whose gold is empty
    items[2] = replace(items[2], answer=None)
    root = st.open_root(st.store_path(tmp_path, TASK), TASK, {"v": 1}, force=True)
    layout.write_items(root.require_group("train"), items, items_fingerprint(items), 4)
    back = reader.read_items(tmp_path, TASK, "train")
    assert back == items and items_fingerprint(back) == items_fingerprint(items)
    assert back[1].answer == "" and back[2].answer is None  # a gold of "" is not no gold
