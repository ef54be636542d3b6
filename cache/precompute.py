"""Run frozen experts over a task's items, chunk by chunk, resumable, into the Zarr store.

Per expert and split: rows are cut into chunks of ``chunk_rows``; within a chunk prompts are
sorted by length and batched under a token budget, the backbone (no LM head) runs once per
batch under ``torch.inference_mode`` and every pooling comes out of that one pass (Eq. 5,
``pooling.py``). A chunk's arrays are written, then its ``done`` flag. Because a chunk's
batches depend only on the chunk's own rows, a resumed or sharded run computes exactly the
same bytes as an uninterrupted one.

Truncation rule: a prompt longer than the expert's context (or ``max_length``) keeps its
*last* tokens, where the question ends and the answer starts; it is counted in ``truncated``.
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
from musketeers.cache.backbone import Backbone, forward_pool, pad, want_compile
from musketeers.cache.batching import length_batches
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
from musketeers.cache.pooling import random_positions
from musketeers.cache.progress import progress
from musketeers.cache.prompts import oracle_view, render_prompt
from musketeers.cache.verify import corrupt_chunks
from musketeers.cache.zarrio import Damaged, child, chunk_range, dense_writes, require_container

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


def context_length(model, max_length: int) -> int:
    cfg = model.config
    limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    return min(max_length, limit) if limit else max_length


@torch.inference_mode()
def greedy_hints(model, tokenizer, seqs: list[list[int]], max_new_tokens: int) -> list[str]:
    """The expert's own greedy answer (output-level collaboration baseline), left-padded."""
    device = next(model.parameters()).device
    ids, mask = pad(seqs, tokenizer.pad_token_id, "left")
    out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                         max_new_tokens=max_new_tokens, do_sample=False,
                         pad_token_id=tokenizer.pad_token_id)
    return tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)


def prompt_seqs(tokenizer, items: list[Item], limit: int,
                oracle: bool = False) -> tuple[list[list[int]], list[bool]]:
    """Token ids per item under the truncation rule (keep the last ``limit``); which were cut.
    An oracle expert reads each question with its gold answer (``oracle_view``)."""
    seqs, truncated = [], []
    for it in items:
        ids = render_prompt(tokenizer, oracle_view(it) if oracle else it)
        truncated.append(len(ids) > limit)
        seqs.append(ids[-limit:])
    return seqs, truncated


def compute_rows(model, tokenizer, items: list[Item], rows: np.ndarray,
                 cfg: PrecomputeConfig, backbone: Backbone | None = None,
                 oracle: bool = False) -> tuple[dict, int]:
    """Every pooled array for ``items`` (global row indices ``rows``), and the token count.

    ``backbone`` is the model's (possibly compiled) backbone pass; by default the plain one.
    """
    backbone = backbone or Backbone(model)
    seqs, truncated = prompt_seqs(tokenizer, items, context_length(model, cfg.max_length),
                                  oracle)
    n_tok = np.array([len(s) for s in seqs], dtype=np.int32)
    rand = random_positions(rows, n_tok, cfg.seed)
    out: dict = {"n_tokens": n_tok, "truncated": np.array(truncated), "random_pos": rand}
    for batch in length_batches(n_tok.tolist(), cfg.batch_tokens):
        pooled = forward_pool(backbone, [seqs[i] for i in batch], rand[batch],
                              tokenizer.pad_token_id)
        for k, v in pooled.items():
            out.setdefault(k, np.zeros((len(items),) + v.shape[1:], np.float32))[batch] = v
    return out, int(n_tok.sum())


def compute_hints(model, tokenizer, items: list[Item], cfg: PrecomputeConfig,
                  oracle: bool = False) -> tuple[dict, int]:
    """The ``hints`` array for ``items``: greedy answers, batched like the poolings."""
    seqs, _ = prompt_seqs(tokenizer, items, context_length(model, cfg.max_length), oracle)
    hints = np.empty(len(items), dtype=object)
    for batch in length_batches([len(s) for s in seqs], cfg.batch_tokens):
        hints[batch] = greedy_hints(model, tokenizer, [seqs[i] for i in batch], cfg.hint_tokens)
    return {"hints": hints}, sum(len(s) for s in seqs)


def run_chunks(g: zarr.Group, n: int, chunk_rows: int, dist: Dist, desc: str,
               compute: Callable[[int, int], tuple[dict, int]], flag: str = layout.DONE) -> None:
    """Compute this rank's unfinished chunks: arrays first, then the chunk's ``flag``."""
    flags = layout.done_flags(g, flag)
    mine = dist.my_chunks(len(flags))
    todo = [c for c in mine if not flags[c]]
    total = sum(np.subtract(*chunk_range(c, n, chunk_rows)[::-1]) for c in todo)
    with progress(desc, total=int(total)) as bar:
        for c in todo:
            lo, hi = chunk_range(c, n, chunk_rows)
            arrays, tokens = compute(lo, hi)
            for name, values in arrays.items():
                refuse_non_finite(g, name, values, lo, hi)
                g[name][lo:hi] = values
            layout.set_done(g, c, flag)
            bar.advance(hi - lo, tokens=tokens)


def refuse_non_finite(g: zarr.Group, name: str, values: np.ndarray, lo: int, hi: int) -> None:
    """A NaN or inf vector (a half dtype overflowing) is never stored: the reader would refuse
    it, and a run on it trains to NaN metrics."""
    values = np.asarray(values)
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        raise UserError(f"{g.path}: the expert computed non-finite values (NaN or inf) in "
                        f"{name}, rows {lo}:{hi}; precompute it in float32 (--dtype float32)")


def prepare_group(split: zarr.Group, path: str, fingerprint: dict, cfg: PrecomputeConfig,
                  rebuild: str, make: Callable[[zarr.Group], None]) -> bool:
    """Whether the group needs work. Creates it, refuses a fingerprint mismatch, or marks the
    chunks that ``verify`` finds corrupt or absent as not done so they are recomputed."""
    kind, name = path.rsplit("/", 1)  # a layout.expert_path or layout.router_path
    parent = require_container(split, kind)
    try:
        g = child(parent, name)
        # No fingerprint (killed while creating it), a lost or unreadable array: the group's
        # rows cannot be trusted, and recomputing it costs what resuming every chunk would.
        damage = None if g is None or cfg.force else unit_damage(g)
    except Damaged:
        g, damage = True, "unreadable metadata"
    if g is not None and (cfg.force or damage):
        if damage:
            log.warning("%s/%s: %s; recomputing it", split.path, path, damage)
        del parent[name]
        g = None
    if g is not None:
        if layout.fingerprint(g) != fingerprint:
            raise UserError(f"{split.path}/{path} was built from other inputs; rebuild: {rebuild}")
        return _reopen_bad(g, layout.DONE)
    layout.create_unit(parent, name, fingerprint, make)
    return True


def prepare_hints(g: zarr.Group) -> bool:
    """Whether the expert's hints need work. Hints are their own resumable unit (``hints``,
    ``hints_done`` flags, ``hints_complete``: ``layout.add_hints``), so adding them to a
    complete expert runs only generation."""
    layout.add_hints(g)
    return _reopen_bad(g, layout.HINTS_FLAG)


def _reopen_bad(g: zarr.Group, flag: str) -> bool:
    """Clear the flags of corrupt chunks of the unit ``flag`` guards; whether work remains."""
    bad = corrupt_chunks(g, flag=flag)
    if layout.is_complete(g, flag) and not bad and layout.done_flags(g, flag).all():
        return False
    for c in sorted(bad):
        layout.set_done(g, c, flag, done=False)
    if bad:
        log.warning("%s: recomputing %s chunks %s", g.path, flag, sorted(bad))
    layout.mark_complete(g, flag, False)
    return True


def finish(g: zarr.Group, dist: Dist, flag: str = layout.DONE) -> None:
    """After every rank's chunks: rank 0 records the unit's digests and marks it complete if
    every flag is set."""
    dist.barrier()
    if dist.rank == 0 and layout.done_flags(g, flag).all():
        layout.seal(g, flag)
        layout.mark_complete(g, flag)
    dist.barrier()


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
    fix = rebuild(st.expert_arg(spec.name, spec.kind, spec.ref))
    for split, items in splits.items():
        sg = root[split]
        fp = expert_fingerprint(spec, model, tokenizer, cfg, items_fingerprint(items))

        def make(g, n=len(items)):
            layout.make_expert(g, n, n_layers=n_layers, d=d, chunk_rows=cfg.chunk_rows,
                               dtype=str(cfg.dtype).removeprefix("torch."))

        g, work = _prepare(sg, layout.expert_path(spec.name), fp, cfg, fix, make, dist)
        desc = f"{task}/{split} {spec.name}"
        if work:
            def compute(lo, hi, items=items):
                return compute_rows(model, tokenizer, items[lo:hi], np.arange(lo, hi), cfg,
                                    backbone, spec.oracle)

            run_chunks(g, len(items), cfg.chunk_rows, dist, desc, compute)
            finish(g, dist)
        else:
            log.info("%s: complete, skipped", desc)
        if cfg.hints and dist.on_rank0(lambda g=g: prepare_hints(g)):
            def hints(lo, hi, items=items):
                return compute_hints(model, tokenizer, items[lo:hi], cfg, spec.oracle)

            g = zarr.open_group(g.store, path=g.path, mode="r+")  # sees rank 0's new arrays
            run_chunks(g, len(items), cfg.chunk_rows, dist, f"{desc} hints", hints,
                       flag=layout.HINTS_FLAG)
            finish(g, dist, layout.HINTS_FLAG)


def _prepare(sg, path, fp, cfg, rebuild, make, dist: Dist):
    """Rank 0 creates or repairs the group; every rank then sees the same state."""
    work = dist.on_rank0(lambda: prepare_group(sg, path, fp, cfg, rebuild, make))
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

        def compute(lo, hi, items=items):
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

    team = ",".join(st.expert_arg(s.name, s.kind, s.ref) for s in specs) or None

    options = st.build_options(cfg.chunk_rows, cfg.batch_tokens, dtype_name(cfg.dtype))

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
