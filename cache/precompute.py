"""Run frozen experts over a task's items, chunk by chunk, resumable, into the Zarr store.

Per expert and split: rows are cut into chunks of ``chunk_rows``; within a chunk prompts are
sorted by length and batched under a token budget, the backbone (no LM head) runs once per
batch under ``torch.inference_mode`` and every pooling comes out of that one pass (Eq. 5,
``pooling.py``). A chunk's arrays are written, then its ``done`` flag. Because a chunk's
batches depend only on the chunk's own rows, a resumed or sharded run computes exactly the
same bytes as an uninterrupted one.

What one chunk computes (poolings, prompt-token and answer states, hints) is ``compute``'s;
the token units those states fill are ``channels``'; how a unit is prepared, filled chunk by
chunk and sealed is ``units``'.
"""

from __future__ import annotations

import errno
import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import zarr

from musketeers.cache import layout
from musketeers.cache import store as st
from musketeers.cache.backbone import Backbone, want_compile
from musketeers.cache.channels import TokenUnits, resolve_layers, unit_fingerprint
from musketeers.cache.compute import Scorer
from musketeers.cache.compute import compute_hints as compute_hints  # re-exported
from musketeers.cache.compute import compute_rows as compute_rows  # re-exported
from musketeers.cache.compute import context_length as context_length  # re-exported
from musketeers.cache.compute import greedy_hints as greedy_hints  # re-exported
from musketeers.cache.compute import prompt_seqs as prompt_seqs  # re-exported
from musketeers.cache.damage import unit_damage
from musketeers.cache.devices import dtype_name
from musketeers.cache.devices import resolve_device as resolve_device  # re-exported
from musketeers.cache.devices import resolve_dtype as resolve_dtype  # re-exported
from musketeers.cache.dist import Dist
from musketeers.cache.errors import UserError
from musketeers.cache.experts import (
    ExpertSpec,
    check_expert,
    load_expert,
    resolve_local,
    tokenizer_fingerprint,
)
from musketeers.cache.items import Item, items_fingerprint
from musketeers.cache.tokens import ANSWER, TOKENS
from musketeers.cache.units import finish, prepare_group, prepare_hints
from musketeers.cache.units import run_chunks as run_chunks  # re-exported
from musketeers.cache.verify import corrupt_chunks
from musketeers.cache.zarrio import Damaged, dense_writes, require_container

log = logging.getLogger("musketeers.precompute")
Rebuild = Callable[..., str]  # (experts=None) -> the ``--force`` command that rebuilds


@dataclass
class PrecomputeConfig:
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    batch_tokens: int = layout.BATCH_TOKENS
    chunk_rows: int = layout.CHUNK_ROWS
    max_length: int = 4096
    hints: bool = False
    hint_tokens: int = 128
    seed: int = 0
    force: bool = False
    router: bool = True
    compile: str = "auto"  # torch.compile the backbone: auto (large CUDA runs), on, off
    # hidden-state indices (-1 = last layer) whose every prompt token is stored (channel
    # ``tokens``), and with ``hints`` every answer token too (``answer``)
    token_layers: tuple[int, ...] = ()
    scorer: Scorer | None = None  # the task's reward of a hint: stored as ``hint_scores``


def write_split_items(root: zarr.Group, split: str, items: list[Item], task: str,
                      cfg: PrecomputeConfig, dist: Dist, rebuild: Rebuild) -> None:
    """Items are built once and stored once per split, before any expert runs; damaged items
    are rewritten (the same items: the experts' rows stay valid)."""
    fp = items_fingerprint(items)

    def write() -> None:
        sg = require_container(root, split)
        try:
            g = layout.items_group(sg)
            damaged = g is not None and unit_damage(g) is not None
        except Damaged:
            g, damaged = None, True
        if damaged:
            log.warning("%s/%s/items: damaged; rewriting them", task, split)
            del sg[layout.ITEMS]
        state = None if damaged else layout.items_ready(sg, fp)
        if state is False and not cfg.force:
            raise UserError(f"{task}/{split} holds other items (another --limit or task "
                            f"version); rebuild: {rebuild()}")
        if state is False:
            del root[split]
            sg = root.require_group(split)
        if state is not True or corrupt_chunks(sg[layout.ITEMS], arrays=layout.ITEM_FIELDS):
            layout.write_items(sg, items, fp, cfg.chunk_rows)

    dist.on_rank0(write)


def expert_fingerprint(spec: ExpertSpec, model, tokenizer, cfg: PrecomputeConfig,
                       items_fp: str) -> dict:
    expert = {"name": spec.name, "kind": spec.kind, "ref": spec.ref, "file": spec.file}
    if spec.oracle:  # only then, so every store built before oracles keeps its fingerprints
        expert["oracle"] = True
    return {
        "format_version": layout.FORMAT_VERSION,
        "expert": expert,
        "weights_sha256": model.musketeers_sha256,
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "dtype": dtype_name(cfg.dtype),
        "items_fingerprint": items_fp,
        "pooling": {"seed": cfg.seed, "max_length": cfg.max_length, "truncation": "keep_last",
                    "chunk_rows": cfg.chunk_rows, "batch_tokens": cfg.batch_tokens},
    }


def precompute_expert(root: zarr.Group, splits: dict[str, list[Item]], spec: ExpertSpec,
                      task: str, cfg: PrecomputeConfig, dist: Dist, rebuild: Rebuild) -> None:
    dist.on_rank0(lambda: resolve_local(spec))  # converts/builds once, before others load
    model, tokenizer = load_expert(spec, cfg.device, cfg.dtype)
    backbone = Backbone(model, want_compile(cfg.compile, sum(map(len, splits.values())),
                                            cfg.device))
    n_layers = model.config.get_text_config().num_hidden_layers
    d = model.config.get_text_config().hidden_size
    fix = rebuild(layout.expert_arg(spec.name, spec.kind, spec.ref))
    asked = resolve_layers(cfg.token_layers, n_layers, spec.name)
    layers = tuple(asked)
    for split, items in splits.items():
        sg = root[split]
        fp = expert_fingerprint(spec, model, tokenizer, cfg, items_fingerprint(items))

        def make(g, n=len(items)):
            layout.make_expert(g, n, n_layers=n_layers, d=d, chunk_rows=cfg.chunk_rows,
                               dtype=str(cfg.dtype).removeprefix("torch."))

        g, work = _prepare(sg, layout.expert_path(spec.name), fp, cfg, fix, make, dist)
        desc = f"{task}/{split} {spec.name}"
        side = _token_units(g, TOKENS, asked, fp, cfg, dist)
        if work or (side is not None and side.todo()):
            def compute(lo, hi, tick, items=items):
                return compute_rows(model, tokenizer, items[lo:hi], np.arange(lo, hi), cfg,
                                    backbone, spec.oracle, layers=layers)

            run_chunks(g, len(items), cfg.chunk_rows, dist, desc, compute, side=side)
            if work:
                finish(g, dist)
            _finish_side(side, dist)
        else:
            log.info("%s: complete, skipped", desc)
        if not cfg.hints:
            continue
        work = dist.on_rank0(lambda g=g, items=items: prepare_hints(g, items, cfg.scorer))
        g = zarr.open_group(g.store, path=g.path, mode="r+")  # sees rank 0's new arrays
        side = _token_units(g, ANSWER, asked, fp, cfg, dist)
        if work or (side is not None and side.todo()):
            def hints(lo, hi, tick, items=items):
                return compute_hints(model, tokenizer, items[lo:hi], cfg, spec.oracle,
                                     layers=layers, tick=tick)

            run_chunks(g, len(items), cfg.chunk_rows, dist, f"{desc} hints", hints,
                       flag=layout.HINTS_FLAG, side=side)
            if work:
                finish(g, dist, layout.HINTS_FLAG)
            _finish_side(side, dist)


def _token_units(g: zarr.Group, channel: str, asked: dict[int, int], expert_fp: dict,
                 cfg: PrecomputeConfig, dist: Dist) -> TokenUnits | None:
    """The expert's token units of ``channel`` at the layers ``asked`` (rank 0 creates or
    repairs them), None without ``--token-states``."""
    if not asked:
        return None
    layers = tuple(asked)
    extra = {"hint_tokens": cfg.hint_tokens} if channel == ANSWER else {}
    fps = {k: unit_fingerprint(expert_fp, channel, k, extra) for k in layers}
    paths = dist.on_rank0(lambda: TokenUnits.prepare(g, channel, layers, asked, fps,
                                                     cfg.chunk_rows))
    return TokenUnits.open(g.store, paths)


def _finish_side(side: TokenUnits | None, dist: Dist) -> None:
    if side is not None:
        dist.barrier()
        dist.on_rank0(side.finish)


def _prepare(sg, path, fp, cfg, rebuild, make, dist: Dist):
    """Rank 0 creates or repairs the group; every rank then sees the same state."""
    work = dist.on_rank0(lambda: prepare_group(sg, path, fp, cfg.force, rebuild, make))
    return zarr.open_group(sg.store, path=f"{sg.path}/{path}", mode="r+"), work


def precompute_router(root: zarr.Group, splits: dict[str, list[Item]], task: str,
                      cfg: PrecomputeConfig, dist: Dist, rebuild: Rebuild) -> None:
    from musketeers.cache import router

    model, tokenizer = router.load_encoder(cfg.device)
    for split, items in splits.items():
        fp = {"encoder": layout.ROUTER_ENCODER, "items_fingerprint": items_fingerprint(items),
              "format_version": layout.FORMAT_VERSION}

        def make(g, n=len(items)):
            layout.make_router(g, n, router.DIM, cfg.chunk_rows)

        g, work = _prepare(root[split], layout.router_path(), fp, cfg, rebuild(), make, dist)
        if not work:
            continue

        def compute(lo, hi, tick, items=items):
            texts = [it.question for it in items[lo:hi]]
            return {"emb": router.embed(texts, model, tokenizer, device=cfg.device)}, 0

        run_chunks(g, len(items), cfg.chunk_rows, dist, f"{task}/{split} router", compute)
        finish(g, dist)


def precompute_task(cache_dir: str | Path, task: str, task_spec: dict,
                    splits: dict[str, list[Item]], specs: list[ExpertSpec],
                    cfg: PrecomputeConfig, dist: Dist | None = None) -> Path:
    """Store every expert's poolings (and router embeddings) for a task's splits."""
    for split, items in splits.items():
        if not items:
            raise UserError(f"task {task} has no {split} items; check its source data")
    for spec in specs:
        check_expert(spec)  # a bad --experts folder fails before the store is touched
    dist = dist or Dist.from_env()
    root_dir = st.check_cache_dir(cache_dir)
    path = st.store_path(root_dir, task)
    # Fix commands rebuild this store as it is being built: same folder, same item count.
    limit = max(len(items) for items in splits.values()) if splits else None

    team = ",".join(layout.expert_arg(s.name, s.kind, s.ref) for s in specs) or None

    options = st.build_options(cfg.chunk_rows, cfg.batch_tokens, dtype_name(cfg.dtype),
                               cfg.token_layers)

    def rebuild(experts: str | None = None) -> str:
        return st.precompute_command(task, experts or team, cache_dir, force=True, limit=limit,
                                     hints=cfg.hints, options=options)

    # Rank 0 alone holds the store's lock for the whole sharded run: other ranks write only
    # their own chunks inside it, and a second, unrelated precompute is still refused.
    lock = st.Lock(st.lock_path(path))
    dist.on_rank0(lock.acquire)
    try:
        with dense_writes():
            _fill(path, task, task_spec, splits, specs, cfg, dist, rebuild)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        # Every chunk is flagged only after its writes: a rerun resumes where this one stopped.
        resume = st.precompute_command(task, team, cache_dir, limit=limit, hints=cfg.hints,
                                       options=options)
        raise UserError(f"no space left on device while writing {path}; free space, then "
                        f"resume with: {resume}") from None
    finally:
        lock.release()
    return path


def _fill(path: Path, task: str, task_spec: dict, splits: dict[str, list[Item]],
          specs: list[ExpertSpec], cfg: PrecomputeConfig, dist: Dist, rebuild: Rebuild) -> None:
    def open_root() -> None:
        if path.exists():
            st.remove_partials(path)  # safe: the lock is held, no write is under way
        st.open_root(path, task, task_spec, force=cfg.force, rebuild=rebuild())

    dist.on_rank0(open_root)
    root = zarr.open_group(path, mode="r+")
    for split, items in splits.items():
        write_split_items(root, split, items, task, cfg, dist, rebuild)
    if cfg.router:
        precompute_router(root, splits, task, cfg, dist, rebuild)
    for spec in specs:
        precompute_expert(root, splits, spec, task, cfg, dist, rebuild)
        gc.collect()  # the expert's weights (its locals are gone) before the next loads
