"""What the trainer reads from a store: items, pooled vectors, router embeddings, hints.

Every read refuses what it cannot trust (absent, incomplete or corrupt) with a UserError
naming the ``musketeers precompute`` command that fixes it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import zarr

from musketeers.cache import store as st
from musketeers.cache.errors import UserError
from musketeers.cache.items import Item

POOLINGS = ("last", "first_token", "random_token", "first_layer", "random_layer", "mean")


def _fix(task: str, experts: str | None = None) -> str:
    return st.precompute_command(task, experts)


def open_store(cache_dir: str | Path, task: str, experts: list[str] | None = None,
               hints: bool = False) -> zarr.Group:
    """The task's store. ``experts`` (and ``hints``): what the caller will read, so that a
    missing store's error names the command that computes exactly that, in that folder."""
    path = st.store_path(cache_dir, task)
    if not path.is_dir():
        fix = st.precompute_command(task, ",".join(experts or []) or None, cache_dir)
        raise UserError(f"no feature cache for task {task!r} at {path}; run: {fix}"
                        + (" --hints" if hints else ""))
    try:
        root = zarr.open_group(path, mode="r")
    except Exception as exc:  # noqa: BLE001
        raise UserError(
            f"{path} is not a readable store ({exc}); run: {_fix(task)} --force"
        ) from exc
    if root.attrs.get("format_version") != st.FORMAT_VERSION:
        raise UserError(f"{path} has another format version; run: {_fix(task)} --force")
    return root


def _split(root: zarr.Group, task: str, split: str) -> zarr.Group:
    if split not in root or "items" not in root[split]:
        raise UserError(f"store {task} has no {split!r} split; run: {_fix(task)}")
    return root[split]


def _read(arr: zarr.Array, task: str, what: str, experts: str | None = None) -> np.ndarray:
    try:
        return arr[:]
    except Exception as exc:  # noqa: BLE001 - checksum or codec failure
        raise UserError(
            f"{what} in store {task} is corrupt ({type(exc).__name__}); run "
            f"`musketeers cache verify {task}` then: {_fix(task, experts)}"
        ) from exc


def read_items(cache_dir: str | Path, task: str, split: str) -> list[Item]:
    g = _split(open_store(cache_dir, task), task, split)["items"]
    cols = {f: _read(g[f], task, f"{split}/items/{f}") for f in st.ITEM_FIELDS}
    return [
        Item(**{f: (str(cols[f][i]) or None) if f == "answer" else str(cols[f][i])
                for f in st.ITEM_FIELDS})
        for i in range(int(g.attrs["n"]))
    ]


def _expert_group(root: zarr.Group, task: str, split: str, expert: str) -> zarr.Group:
    sg = _split(root, task, split)
    path = f"experts/{expert}"
    if path not in sg:
        raise UserError(f"expert {expert!r} is not cached for {task}/{split}; run: "
                        f"{_fix(task, expert)}")
    g = sg[path]
    if not g.attrs.get("complete"):
        raise UserError(f"expert {expert!r} is incomplete in {task}/{split}; run: "
                        f"{_fix(task, expert)}")
    return g


def random_layers(n: int, n_layers: int, seed: int, expert_index: int) -> np.ndarray:
    """The layer k_i in [0, L] each row draws for the random-layer ablation, seeded."""
    return np.random.default_rng((seed, expert_index)).integers(0, n_layers + 1, size=n)


def pool_from_group(g: zarr.Group, pooling: str, seed: int, expert_index: int,
                    task: str, expert: str) -> np.ndarray:
    def get(name: str) -> np.ndarray:
        return _read(g[name], task, f"{g.path}/{name}", expert).astype(np.float32)

    if pooling == "last":
        return get("last")
    if pooling == "first_token":
        return get("first")
    if pooling == "random_token":
        return get("random")
    if pooling == "mean":
        return get("layers_mean")[:, -1]
    layers = get("layers_last")
    if pooling == "first_layer":
        return layers[:, 0]
    if pooling == "random_layer":
        k = random_layers(layers.shape[0], layers.shape[1] - 1, seed, expert_index)
        return layers[np.arange(layers.shape[0]), k]
    if pooling.startswith("layer:"):
        try:
            k = int(pooling.split(":", 1)[1])
        except ValueError:
            k = None
        if k is None or not 0 <= k < layers.shape[1]:
            raise UserError(f"pooling {pooling!r}: layer must be an integer in "
                            f"0..{layers.shape[1] - 1}")
        return layers[:, k]
    raise UserError(f"unknown pooling {pooling!r}; use one of {', '.join(POOLINGS)} or layer:K")


def read_vectors(cache_dir: str | Path, task: str, split: str, experts: list[str],
                 pooling: str, seed: int = 0) -> list[np.ndarray]:
    """One [N, d_i] float32 array per expert, in ``experts`` order."""
    root = open_store(cache_dir, task, experts)
    return [
        pool_from_group(_expert_group(root, task, split, e), pooling, seed, i, task, e)
        for i, e in enumerate(experts)
    ]


def read_router(cache_dir: str | Path, task: str, split: str,
                encoder: str = st.ROUTER_ENCODER) -> np.ndarray:
    sg = _split(open_store(cache_dir, task), task, split)
    path = f"router/{encoder}"
    if path not in sg or not sg[path].attrs.get("complete"):
        raise UserError(f"router embeddings ({encoder}) missing or incomplete for "
                        f"{task}/{split}; run: {_fix(task)}")
    return _read(sg[path]["emb"], task, f"{split}/{path}/emb").astype(np.float32)


def read_hints(cache_dir: str | Path, task: str, split: str,
               experts: list[str]) -> list[list[str]]:
    """[N][n] greedy answers of each expert (output-level collaboration baseline)."""
    root = open_store(cache_dir, task, experts, hints=True)
    cols = []
    for e in experts:
        g = _expert_group(root, task, split, e)
        if not st.hints_complete(g):
            raise UserError(f"expert {e!r} has no complete hints for {task}/{split}; run: "
                            f"{_fix(task, e)} --hints")
        cols.append(_read(g["hints"], task, f"{g.path}/hints", e))
    return [[str(c[i]) for c in cols] for i in range(len(cols[0]) if cols else 0)]
