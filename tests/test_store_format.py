"""The store format is versioned: its layout is pinned to FORMAT_VERSION, and a store of
another version is refused with the command that rebuilds it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import zarr

from musketeers.cache import reader
from musketeers.cache import store as st
from musketeers.cache.errors import UserError

FIXTURES = Path(__file__).resolve().parent / "fixtures"

# Every array an expert group holds, with its dtype and rank, per format version. A change to
# the layout that keeps FORMAT_VERSION would let old stores read as new: bump the version and
# add its layout here.
LAYOUTS = {
    1: {"last": ("float32", 2), "first": ("float32", 2), "random": ("float32", 2),
        "layers_last": ("float32", 3), "layers_mean": ("float32", 3),
        "random_pos": ("int32", 1), "n_tokens": ("int32", 1), "truncated": ("bool", 1),
        "done": ("uint8", 1), "hints_done": ("uint8", 1), "hints": ("str", 1)},
}


def _layout(g: zarr.Group) -> dict[str, tuple[str, int]]:
    def kind(a) -> str:
        return "str" if a.dtype.kind in "OTU" else str(a.dtype)

    return {name: (kind(a), a.ndim) for name, a in g.arrays()}


def test_expert_layout_is_the_one_of_its_format_version(tmp_path: Path):
    g = zarr.open_group(tmp_path / "s.zarr", mode="w")
    st.create_expert_arrays(g, 10, 2, 4, 4, hints=True)
    assert _layout(g) == LAYOUTS[st.FORMAT_VERSION], "layout changed: bump FORMAT_VERSION"


def test_a_store_of_another_format_version_is_refused_with_its_rebuild(tmp_path: Path):
    cache = tmp_path / "stores"
    shutil.copytree(FIXTURES / "arithmetic.zarr", cache / "arithmetic.zarr")
    assert reader.read_items(cache, "arithmetic", "train")  # as shipped: readable
    root = zarr.open_group(cache / "arithmetic.zarr", mode="r+")
    root.attrs["format_version"] = st.FORMAT_VERSION - 1
    with pytest.raises(UserError, match=r"another format version; run: musketeers precompute "
                                        r"--task arithmetic.*--force") as err:
        reader.read_items(cache, "arithmetic", "train")
    assert f"--cache-dir {cache}" in str(err.value) and "\n" not in str(err.value)
