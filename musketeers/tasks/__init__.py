"""Tasks: items (prompt, gold answer, scorer entry) and their rewards.

``arithmetic``, ``algorithmic``, ``logic``: the paper's Reasoning Gym composites (appendix,
Listings 2–4), packaged task files; ``rg:NAME``: any Reasoning Gym dataset; ``FILE.yaml``: a
task file of one's own; ``gsm_symbolic``: Reasoning Gym's GSM8K-like generator; ``gsm8k``: the
official split from local jsonl; ``planted``: the synthetic planted-expert check.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from musketeers.cache.errors import UserError
from musketeers.cache.items import Item
from musketeers.cache.layout import SPLITS

from .extraction import EXTRACTIONS, MAX_ANSWER_CHARS, extract_answer
from .gsm8k import build_gsm8k_items, gsm8k_task_spec
from .planted import SIZES as PLANTED_SIZES
from .planted import build_planted_items, planted_task_spec
from .reasoning_gym_tasks import SPLIT_SIZES, build_rg_items, rg_task_spec
from .scoring import score
from .task_files import packaged, packaged_files
from .variants import BASE_TASKS, PROMPT_STYLES, parse_task, system_prompt

log = logging.getLogger(__name__)

# the base tasks (``--task all``); any of them may carry :LEVEL and @PROMPT (``variants``)
TASKS: tuple[str, ...] = BASE_TASKS


def families() -> dict[str, tuple[tuple[str, dict[str, Any]], ...]]:
    """The packaged families' datasets and configs: {family: ((dataset, config), ...)}."""
    return {name: tuple((d.name, d.config) for d in packaged(name).datasets)
            for name in packaged_files()}

__all__ = [
    "EXTRACTIONS", "MAX_ANSWER_CHARS", "PROMPT_STYLES", "SPLITS", "TASKS", "Item",
    "build_items", "check_disjoint", "check_items", "check_task", "extract_answer", "families",
    "parse_task", "read_checked_items", "score", "task_spec",
]


def check_task(task: str) -> str:
    """``task`` if it names a task (a base task, optionally :LEVEL and @PROMPT; rg:NAME; a task
    file, read and checked now); UserError naming the valid ones otherwise."""
    parse_task(task)
    return task


def _check(task: str, split: str | None = None) -> None:
    parse_task(task)
    if split is not None and split not in SPLITS:
        raise UserError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")


def build_items(task: str, split: str, limit: int | None = None,
                gsm8k_dir: str | Path | None = None) -> list[Item]:
    """The first ``limit`` items (all when None) of ``task``'s ``split``.

    Item ``i`` does not depend on ``limit``; a limit above the split's size returns the split.
    """
    _check(task, split)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise UserError(f"--limit must be a positive integer, got {limit!r}")
    name = parse_task(task)
    if name.base == "gsm8k":
        return build_gsm8k_items(split, limit, gsm8k_dir, system_prompt(name.prompt))
    if name.base == "planted":
        size = PLANTED_SIZES[split]
        return build_planted_items(split, size if limit is None else min(limit, size))
    size = SPLIT_SIZES[split]
    return build_rg_items(task, split, size if limit is None else min(limit, size))


def task_spec(task: str) -> dict[str, Any]:
    """JSON-able description of ``task`` (datasets, weights, configs, seeds, sizes), in the
    form a store's attributes give it back: a tuple in a config reads back as a list, and a
    spec that differs from its stored copy only by that would refuse to reopen the store."""
    name = parse_task(task)
    if name.is_reasoning_gym:
        spec = rg_task_spec(task)
    elif name.base == "gsm8k":
        spec = gsm8k_task_spec(name.prompt)
    else:
        spec = planted_task_spec()
    return json.loads(json.dumps(spec))


def check_items(task: str, split: str, items: list[Item],
                gsm8k_dir: str | Path | None = None, fix: str = "") -> None:
    """Refuse stored ``items`` that are not the ones ``task`` generates for ``split``.

    A store is data that anyone with write access can edit, and an item's entry reaches its
    scorer: regenerating the split and comparing fingerprints is what makes a store's items
    trustworthy (a few seconds for a few hundred items). ``fix``: the command that rebuilds.
    """
    from musketeers.cache.items import items_fingerprint

    try:
        expected = build_items(task, split, len(items), gsm8k_dir)
    except UserError:
        if parse_task(task).base != "gsm8k":
            raise
        # GSM8K is read from files this machine may not have; its scorer parses numbers in
        # this process and evaluates nothing, so an unverified store can mislabel, not run code
        log.warning("GSM8K files not found: the stored %s items are not checked against them",
                    split)
        return
    if items_fingerprint(expected) == items_fingerprint(items):
        return
    bad = next((i for i, (a, b) in enumerate(zip(items, expected, strict=False)) if a != b),
               min(len(items), len(expected)))
    raise UserError(f"the stored {task}/{split} items are not the ones the task generates "
                    f"(first difference at row {bad}): the store was edited or built by "
                    f"another version; rebuild it{': ' + fix if fix else ''}")


def read_checked_items(cache_dir: str | Path, task: str, split: str) -> list[Item]:
    """A store's ``split`` items, refused unless they are the ones ``task`` generates: every
    reader whose items reach a scorer, a probe or a report goes through here."""
    from musketeers.cache import reader, store

    items = reader.read_items(cache_dir, task, split)
    # the precompute that rebuilds the whole store: its items and every expert
    check_items(task, split, items, fix=store.fix_command(cache_dir, task, force=True))
    return items


def check_disjoint(train: list[Item], val: list[Item]) -> None:
    """Fail loudly when a question appears in both splits (by exact question text)."""
    shared = {it.question for it in train} & {it.question for it in val}
    if shared:
        example = next(iter(shared))[:80]
        raise RuntimeError(f"train and val share {len(shared)} questions, e.g. {example!r}")
