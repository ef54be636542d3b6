"""What the trainer reads from a store: items, pooled vectors, router embeddings, hints, and
per-token states (``read_token_rows``).

Every read refuses what it cannot trust (absent, incomplete, corrupt, swapped for other rows,
non-finite) with a UserError naming the ``musketeers precompute`` command that fixes it.
Before a unit's rows are used, every chunk is hashed against the digests recorded when it was
built (``layout.seal``): this decodes the whole unit once (its cost: BENCHMARKS.md, "Measured
by hand"); a unit without digests is read with a warning, every time. A token chunk that
passed before, its files untouched since, is not hashed again (``verified``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import zarr

from musketeers.cache import layout, token_layout
from musketeers.cache import store as st
from musketeers.cache.damage import UnitFacts, read_check, unit_facts
from musketeers.cache.errors import UserError
from musketeers.cache.items import Item
from musketeers.cache.tokens import ANSWER, TokenRows
from musketeers.cache.verified import Verified
from musketeers.cache.zarrio import (
    Damaged,
    child,
    irregular_files,
    missing_chunks,
    one_line,
)

log = logging.getLogger("musketeers.cache")

POOLINGS = ("last", "first_token", "random_token", "first_layer", "random_layer", "mean")


def open_store(cache_dir: str | Path, task: str, experts: list[str] | None = None,
               hints: bool = False) -> zarr.Group:
    """The task's store. ``experts`` (and ``hints``): what the caller will read, so that a
    missing store's error names the command that computes exactly that, in that folder."""
    path = st.store_path(cache_dir, task)
    names = ",".join(experts or []) or None
    if not path.is_dir() or not any(p.suffix != ".partial" for p in path.iterdir()):
        where = "is empty" if path.is_dir() else "is missing"
        raise UserError(f"no feature cache for task {task!r} ({path} {where}); run: "
                        + st.precompute_command(task, names, cache_dir, hints=hints))
    if odd := irregular_files(path):  # opening a FIFO would block for ever
        raise UserError(f"{path / odd[0]} in store {task} is not a regular file (a FIFO, socket "
                        f"or device); remove it, then run `{st.verify_command(task, cache_dir)}`")
    try:
        root = zarr.open_group(path, mode="r")
    except Exception as exc:  # noqa: BLE001
        fix = st.fix_command(cache_dir, task, names, force=True, hints=hints)
        raise UserError(f"{path} is not a readable store ({one_line(exc)}); run: {fix}") from None
    if layout.format_version(root) != layout.FORMAT_VERSION:
        raise UserError(f"{path} has another format version; run: "
                        f"{st.fix_command(cache_dir, task, names, force=True, hints=hints)}")
    return root


def _damaged(cache_dir: str | Path, task: str, what: str, why: str,
             experts: str | None = None, hints: bool = False) -> UserError:
    return UserError(f"{what} in store {task} is damaged ({why}); run `"
                     f"{st.verify_command(task, cache_dir)}` then: "
                     f"{st.fix_command(cache_dir, task, experts, hints=hints)}")


def _trusted(g: zarr.Group, cache_dir: str | Path, task: str, experts: str | None = None, *,
             flag: str = layout.DONE, facts: UnitFacts | None = None,
             structure: bool = True) -> zarr.Group:
    """``g`` once ``damage.read_check`` finds nothing wrong (``facts``: its metadata, where
    already read); a unit without digests is read with a warning naming the rebuild."""
    start = time.perf_counter()
    found = read_check(g, facts, flag, structure)
    if found.damage:
        raise _damaged(cache_dir, task, g.path, found.damage, experts)
    if not found.sealed:
        log.warning("%s in store %s has no checksum manifest: a chunk swapped for another valid "
                    "one cannot be detected; rebuild it to record one: %s", g.path, task,
                    st.fix_command(cache_dir, task, experts, force=True))
    log.info("%s/%s: %d chunk digests checked in %.3f s", task, g.path, found.chunks,
             time.perf_counter() - start)
    return g


def _finite(values: np.ndarray, what: str, cache_dir: str | Path, task: str,
            experts: str | None = None) -> np.ndarray:
    """``values`` when every one is finite: NaN or inf vectors train to NaN metrics."""
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        rows = np.flatnonzero(~np.isfinite(values.reshape(len(values), -1)).all(axis=1))
        raise UserError(f"{what} in store {task} holds non-finite values (NaN or inf) in "
                        f"{len(rows)} rows (first {int(rows[0])}); recompute it (in float32 if "
                        f"it was computed in a half dtype): "
                        f"{st.fix_command(cache_dir, task, experts, force=True)}")
    return values


def _member(get: Callable[[], zarr.Group | None], cache_dir: str | Path, task: str,
            experts: str | None = None) -> zarr.Group | None:
    """``get()``: a group of the store, None when absent; a UserError when it is unreadable."""
    try:
        return get()
    except Damaged as exc:
        raise _damaged(cache_dir, task, exc.where, "unreadable metadata", experts) from None


def _split(root: zarr.Group, cache_dir: str | Path, task: str, split: str) -> zarr.Group:
    sg = _member(lambda: child(root, split), cache_dir, task)
    items = _member(lambda: layout.items_group(sg), cache_dir, task) if sg is not None else None
    if layout.stored_items_fingerprint(items) is None:
        raise UserError(f"store {task} has no {split!r} split; run: "
                        f"{st.fix_command(cache_dir, task)}")
    return sg


def _read(arr: zarr.Array, cache_dir: str | Path, task: str, what: str,
          experts: str | None = None) -> np.ndarray:
    try:
        return arr[:]
    except Exception as exc:  # noqa: BLE001 - checksum or codec failure
        raise UserError(
            f"{what} in store {task} is corrupt ({type(exc).__name__}); run "
            f"`{st.verify_command(task, cache_dir)}` then: "
            f"{st.fix_command(cache_dir, task, experts)}"
        ) from exc


def read_items(cache_dir: str | Path, task: str, split: str) -> list[Item]:
    g = _trusted(layout.items_group(_split(open_store(cache_dir, task), cache_dir, task, split)),
                 cache_dir, task)
    n = layout.item_count(g) or 0
    if n == 0:
        raise UserError(f"store {task} holds no {split} items; rebuild it with items: "
                        f"{st.fix_command(cache_dir, task, force=True)}")
    cols = {f: _read(g[f], cache_dir, task, f"{g.path}/{f}") for f in layout.ITEM_FIELDS}
    empty = set(g.attrs.get(layout.EMPTY_ANSWERS, []))
    return [
        Item(**{f: (str(cols[f][i]) or ("" if i in empty else None)) if f == "answer"
                else str(cols[f][i]) for f in layout.ITEM_FIELDS})
        for i in range(n)
    ]


def _expert_group(root: zarr.Group, cache_dir: str | Path, task: str, split: str,
                  expert: str) -> tuple[zarr.Group, str]:
    """The expert's unit once complete, whole and matching its digests, and the ``--experts``
    value that recomputes it (a folder's path, a hub id, a name)."""
    sg = _split(root, cache_dir, task, split)
    g = _member(lambda: layout.expert_group(sg, expert), cache_dir, task, expert)
    if g is None:
        raise UserError(f"expert {expert!r} is not cached for {task}/{split}; run: "
                        f"{st.fix_command(cache_dir, task, expert)}")
    arg = layout.expert_arg(expert, *layout.expert_ref(g))
    facts = unit_facts(g)  # read once: the completeness and damage checks share them
    if facts.fingerprint is not None and not facts.complete:
        raise UserError(f"expert {expert!r} is incomplete in {task}/{split}; run: "
                        f"{st.fix_command(cache_dir, task, arg)}")
    return _trusted(g, cache_dir, task, arg, facts=facts), arg


def random_layers(n: int, n_layers: int, seed: int, expert_index: int) -> np.ndarray:
    """The layer k_i in [0, L] each row draws for the random-layer ablation, seeded."""
    return np.random.default_rng((seed, expert_index)).integers(0, n_layers + 1, size=n)


def pool_from_group(g: zarr.Group, pooling: str, seed: int, expert_index: int,
                    task: str, expert: str, cache_dir: str | Path = "stores") -> np.ndarray:
    def get(name: str) -> np.ndarray:
        what = f"{g.path}/{name}"
        return _finite(_read(g[name], cache_dir, task, what, expert).astype(np.float32), what,
                       cache_dir, task, expert)

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
        pool_from_group(_expert_group(root, cache_dir, task, split, e)[0], pooling, seed, i, task,
                        e, cache_dir)
        for i, e in enumerate(experts)
    ]


def read_router(cache_dir: str | Path, task: str, split: str,
                encoder: str = layout.ROUTER_ENCODER) -> np.ndarray:
    sg = _split(open_store(cache_dir, task), cache_dir, task, split)
    g = _member(lambda: layout.router_group(sg, encoder), cache_dir, task)
    if not layout.is_complete(g):
        raise UserError(f"router embeddings ({encoder}) missing or incomplete for "
                        f"{task}/{split}; run: {st.fix_command(cache_dir, task)}")
    g = _trusted(g, cache_dir, task)
    emb = _read(g["emb"], cache_dir, task, f"{g.path}/emb").astype(np.float32)
    return _finite(emb, f"{g.path}/emb", cache_dir, task)


def read_hints(cache_dir: str | Path, task: str, split: str,
               experts: list[str]) -> list[list[str]]:
    """[N][n] greedy answers of each expert (output-level collaboration baseline)."""
    cols = _hint_columns(cache_dir, task, split, experts, layout.HINTS)
    return [[str(c[i]) for c in cols] for i in range(len(cols[0]) if cols else 0)]


def read_hint_scores(cache_dir: str | Path, task: str, split: str,
                     experts: list[str]) -> list[np.ndarray]:
    """One [N] float32 array per expert: each greedy answer's reward under the task's scorer
    (the expert's own accuracy, item by item), checked as ``read_hints`` checks the hints."""
    cols = _hint_columns(cache_dir, task, split, experts, layout.HINT_SCORES)
    return [_finite(np.asarray(c, np.float32), f"{split}/{e}/{layout.HINT_SCORES}", cache_dir,
                    task) for e, c in zip(experts, cols, strict=True)]


def _hint_columns(cache_dir: str | Path, task: str, split: str, experts: list[str],
                  array: str) -> list[np.ndarray]:
    """Each expert's ``array`` of its hints unit (hints or their scores), refused unless
    complete, whole and matching its digests."""
    root = open_store(cache_dir, task, experts, hints=True)
    cols = []
    for e in experts:
        g, arg = _expert_group(root, cache_dir, task, split, e)
        if not layout.hints_complete(g) or array not in g:
            raise UserError(f"expert {e!r} has no complete {array} for {task}/{split}; run: "
                            f"{st.fix_command(cache_dir, task, arg, hints=True)}")
        values = g[array]
        if missing_chunks(values):
            raise _damaged(cache_dir, task, values.path, "lost chunks", arg, hints=True)
        if layout.HINTS_FLAG in g:  # hints of their own unit carry their own digests
            _trusted(g, cache_dir, task, arg, flag=layout.HINTS_FLAG, structure=False)
        cols.append(_read(values, cache_dir, task, values.path, arg))
    return cols


def read_token_rows(cache_dir: str | Path, task: str, split: str, experts: list[str],
                    channel: str, layer: int) -> list[TokenRows]:
    """One ``TokenRows`` per expert, in ``experts`` order: every prompt token's (``tokens``) or
    answer token's (``answer``) hidden state at ``layer`` (-1: each expert's last), sliced
    lazily. Each unit's chunks are first checked against their crc and recorded digests."""
    if channel not in token_layout.TOKEN_CHANNELS:
        raise UserError(f"channel {channel!r} holds no token states; use one of "
                        f"{', '.join(token_layout.TOKEN_CHANNELS)}")
    root = open_store(cache_dir, task, experts, hints=channel == ANSWER)
    verified = Verified(st.store_path(cache_dir, task))
    out = []
    for e in experts:
        g, arg = _expert_group(root, cache_dir, task, split, e)
        n_layers = layout.expert_meta(g)[0]
        k = token_layout.resolve_layer(layer, n_layers) if isinstance(n_layers, int) else None
        u = _member(lambda k=k, g=g: token_layout.token_unit(g, channel, k), cache_dir, task,
                    arg) if k is not None else None
        fix = st.fix_command(cache_dir, task, arg, hints=channel == ANSWER, token_layer=layer)
        if u is None or not token_layout.is_complete(u):
            what = "no" if u is None else "incomplete"
            raise UserError(f"expert {e!r} has {what} channel {channel!r} (token states) at "
                            f"layer {layer} for {task}/{split}; run: {fix}")
        out.append(_token_rows(u, cache_dir, task, arg, channel, verified))
    verified.save()
    return out


def _token_rows(u: zarr.Group, cache_dir: str | Path, task: str, arg: str,
                channel: str, verified: Verified) -> TokenRows:
    """``u``'s rows once its structure is whole and every chunk decodes, is finite and hashes
    to its recorded digest (``_trusted`` for a token unit; a chunk ``verified`` remembers as
    checked and untouched since is not hashed again); a row without tokens is refused."""
    start, skipped = time.perf_counter(), verified.skipped
    damage = token_layout.unit_damage(u)
    bad = {} if damage else token_layout.bad_chunks(u, verified)
    if not damage and bad:
        c, fault = next(iter(bad.items()))
        damage = f"chunk {c}: {fault}"
    if not damage and not isinstance(u.attrs.get(token_layout.SHA256), list):
        damage = "no checksum manifest"
    if damage:
        raise _damaged(cache_dir, task, u.path, damage, arg, hints=channel == ANSWER)
    rows = token_layout.token_rows(u)
    if (empty := np.flatnonzero(rows.lengths() == 0)).size:
        fix = st.fix_command(cache_dir, task, arg, force=True, hints=channel == ANSWER)
        raise UserError(f"{u.path} in store {task} holds {empty.size} rows without tokens "
                        f"(first {int(empty[0])}); rebuild it: {fix}")
    n, seconds = u[layout.DONE].shape[0], time.perf_counter() - start
    hashed = n - (verified.skipped - skipped)
    gib = token_layout.stored_bytes(u) * hashed / max(n, 1) / 2**30
    # the rate tells a user what a larger store's check will cost (docs/channels.md)
    log.info("%s/%s: %d of %d token chunks hashed (%.2f GiB) in %.2f s (%.0f s/GiB); the "
             "rest unchanged since they last passed", task, u.path, hashed, n, gib, seconds,
             seconds / gib if gib else 0.0)
    return rows
