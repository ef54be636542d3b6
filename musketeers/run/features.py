"""Precompute a task's expert features: tasks and teams (the method's side) meet the cache.

The cache knows nothing of tasks or teams: it runs causal LMs over a list of items. This is
the one place that builds a task's items, resolves a team into expert specs and hands both to
``musketeers.cache.precompute``; the CLI and the ablation grid both call it.
"""

from __future__ import annotations

import os
from pathlib import Path

from musketeers.cache.errors import UserError

CACHE_DIR_ENV = "MUSKETEERS_CACHE_DIR"


def cache_root(cache_dir: Path | str | None) -> Path:
    return Path(cache_dir or os.environ.get(CACHE_DIR_ENV) or "stores")


def expand_tasks(task: str) -> list[str]:
    """``all`` means every real task (the synthetic ``planted`` task is built by its demo)."""
    from musketeers.tasks import TASKS, check_task

    if task == "all":
        return [t for t in TASKS if t != "planted"]
    return [check_task(task)]


def precompute_features(
    task: str = "logic", *, team: str | None = None, roster: str = "pocket",
    experts: list[str] | None = None, team_file: Path | None = None, limit: int | None = None,
    cache_dir: Path | str | None = None, device: str = "auto", dtype: str = "auto",
    hints: bool = False, force: bool = False, gsm8k_dir: Path | None = None,
    batch_tokens: int = 8192, chunk_rows: int = 64, router: bool = True, compile: str = "auto",
    token_layers: tuple[int, ...] = (), splits: tuple[str, ...] | None = None,
) -> list[Path]:
    """Run every expert of a team once over a task's train and val items into its store
    (``splits``: only those; a later run without it adds the others).

    Experts already complete in the store are skipped; under ``torchrun`` the ranks shard
    the rows (musketeers.cache.dist). Returns the store paths written. Hints are scored
    here, under the task's own scorer: the cache knows no task.
    """
    from musketeers.cache.backbone import want_compile
    from musketeers.cache.devices import resolve_device, resolve_dtype
    from musketeers.cache.dist import Dist
    from musketeers.cache.experts import check_expert
    from musketeers.cache.precompute import PrecomputeConfig, precompute_task
    from musketeers.cache.store import check_cache_dir
    from musketeers.tasks import SPLITS, build_items, score, task_spec
    from musketeers.teams import resolve_team

    if limit is not None and limit < 1:
        raise UserError(f"--limit must be a positive integer, got {limit}")
    if splits is not None and (not splits or set(splits) - set(SPLITS)):
        raise UserError(f"--split {', '.join(splits) or '(none)'}: pass one of "
                        f"{', '.join(SPLITS)}, e.g. --split val")
    if chunk_rows < 1:
        raise UserError(f"--chunk-rows must be positive, got {chunk_rows}")
    if batch_tokens < 1:
        raise UserError(f"--batch-tokens must be positive, got {batch_tokens}")
    want_compile(compile, 0)  # a bad --compile fails before any work
    tasks = expand_tasks(task)
    # Every option is checked before anything is created (the cache dir included).
    check_cache_dir(cache_root(cache_dir), create=False)
    specs = resolve_team(team, roster, experts, team_file)
    for spec in specs:
        check_expert(spec)
    dev = resolve_device(device)
    cfg = PrecomputeConfig(device=dev, dtype=resolve_dtype(dtype, dev), batch_tokens=batch_tokens,
                           hints=hints, force=force, router=router, chunk_rows=chunk_rows,
                           compile=compile, token_layers=tuple(token_layers),
                           scorer=score if hints else None)
    dist = Dist.from_env(dev)
    # Build every split first: a missing GSM8K file fails before any model loads.
    plans = {t: (task_spec(t), {s: build_items(t, s, limit, gsm8k_dir)
                                  for s in dict.fromkeys(splits or SPLITS)})
             for t in tasks}
    root = check_cache_dir(cache_root(cache_dir))
    paths = []
    try:
        for t, (spec, splits) in plans.items():
            path = precompute_task(root, t, spec, splits, specs, cfg, dist)
            if dist.rank == 0:
                print(f"{t}: {path} ({', '.join(s.name for s in specs)})")
            paths.append(path)
    finally:
        dist.close()
    return paths
