"""Reasoning Gym tasks: task files (the paper's families among them), ``rg:NAME`` and gsm_symbolic.

A task file is a ``CompositeDataset`` of its datasets, weights and configs (``task_files``);
``rg:NAME`` and gsm_symbolic are one dataset at its defaults. Items are deterministic
functions of (seed, index): Reasoning Gym seeds item ``i`` with ``Random(seed + i)`` in the
composite and in the datasets of the packaged families, and the composite's virtual
size is fixed at ``STREAM_SIZE`` whatever ``limit`` asks for, so item ``i`` of a limited split
is item ``i`` of the full one and a limit only generates what it returns.

Split rule (disjointness by construction). Train and val read two streams with seeds far
apart (``SEEDS``); a streamed entry is kept for a split only when the sha256 of its question
text falls in that split's buckets (``split_of``: 2 of 3 buckets train, 1 val). A question
that both streams produce therefore lands in one split only, so the splits never share a
question even for datasets with few distinct questions, and no split needs the other to be
generated first. The cost is ~1.8× the generated entries (24k + 12k for 16k + 4k).

Hash seed. ``polynomial_multiplication``, ``intermediate_integration`` and
``isomorphic_strings`` iterate over sets (of sympy symbols, of characters), so their items
depend on Python's string-hash seed. Items are therefore generated under ``PYTHONHASHSEED=0``:
in this process when it already runs so, otherwise in one child process per ``prebuild`` call
(a test checks a process with another hash seed gets identical items).

Within a split, questions may repeat as Reasoning Gym draws them (as in the paper): measured on
the full algorithmic train split, 2,301 of 16,000 repeat an earlier one, mostly ``jugs``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from dataclasses import asdict
from functools import cache
from typing import Any

from musketeers.cache.errors import UserError
from musketeers.cache.items import Item
from musketeers.cache.progress import progress
from musketeers.cache.store import store_name

from .task_files import load_task_file, packaged, packaged_files
from .variants import is_composite, members, parse_task, system_prompt

SPLIT_SIZES = {"train": 16_000, "val": 4_000}
SEEDS = {"train": 1_000, "val": 1_000_000}  # streams never reach 999k entries (STREAM_SIZE)
STREAM_SIZE = 500_000
_BUCKETS = 3
_VAL_BUCKET = 2


def split_of(question: str) -> str:
    """The only split that may hold ``question``: sha256 bucket 2 of 3 is val, else train."""
    digest = hashlib.sha256(question.encode("utf-8", "surrogatepass")).digest()
    return "val" if int.from_bytes(digest[:8], "big") % _BUCKETS == _VAL_BUCKET else "train"


def dataset_config(name: str) -> dict[str, Any]:
    """The config of dataset ``name`` in the first packaged family that lists it ({} when none
    does): the scorer's config for an item whose task is not known (a hand-made item)."""
    for family in packaged_files():
        for d in packaged(family).datasets:
            if d.name == name:
                return d.config
    return {}


def task_members(task: str) -> tuple[tuple[str, dict[str, Any]], ...]:
    """(dataset, config) of every member of a Reasoning Gym task name (level included)."""
    return tuple((d.name, d.config) for d in members(parse_task(task)))


def task_id(task: str) -> str:
    """The task's name in its items' ids and its spec: a task file's path spelled any way
    gives the same items (``store_name``)."""
    return store_name(task)


def scorer_config(item_id: str, source: str) -> dict[str, Any]:
    """The config the item's own task gave dataset ``source``: its scorer is built with it
    (Reasoning Gym's composite grades with its member datasets, configs included). The id
    names the task; a task not resolved in this process falls back to ``dataset_config``."""
    task = item_id.rsplit("-", 2)[0]
    cfg = _RESOLVED.get(task, {}).get(source)
    return dict(dataset_config(source) if cfg is None else cfg)


# task id -> {dataset: config} of every task whose items were built in this process
_RESOLVED: dict[str, dict[str, dict[str, Any]]] = {}


# datasets that cannot stream STREAM_SIZE items, refused before any work: acre builds its
# whole stream when constructed (hours at this size)
_NO_STREAM = {"acre": f"it builds all {STREAM_SIZE} items of its stream up front"}


def cannot_generate(dataset: str, reason: str) -> UserError:
    """The one-line refusal of a dataset this process cannot generate items of."""
    return UserError(f"dataset {dataset} cannot be generated here: {reason}; drop it from "
                     "the task")


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


@cache
def make_dataset(task: str, split: str):
    """The split's stream: a composite (task files) or a single dataset, fixed seed and size.

    Each member is built alone first, so a dataset that cannot be built is named in one line
    (word_ladder refuses a stream this long)."""
    import reasoning_gym
    from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

    seed = SEEDS[split]
    name = parse_task(task)
    built = {}
    for d in members(name):
        if d.name in _NO_STREAM:
            raise cannot_generate(d.name, _NO_STREAM[d.name])
        try:
            built[d.name] = reasoning_gym.create_dataset(d.name, seed=seed, size=STREAM_SIZE,
                                                         **d.config)
        except Exception as exc:
            raise cannot_generate(d.name, _reason(exc)) from exc
    if not is_composite(name):
        return next(iter(built.values()))
    specs = [DatasetSpec(name=d.name, weight=d.weight, config=dict(d.config))
             for d in members(name)]
    return CompositeDataset(CompositeConfig(size=STREAM_SIZE, seed=seed, datasets=specs))


def entry_to_json(entry: dict[str, Any]) -> str:
    """The entry as JSON; tuples become lists, which every scorer used here accepts (tested)."""
    return json.dumps(entry, sort_keys=True, ensure_ascii=False, default=str)


def build_rg_items(task: str, split: str, n: int) -> list[Item]:
    """The first ``n`` items of ``split``, generated under ``PYTHONHASHSEED=0``."""
    _RESOLVED[task_id(task)] = dict(task_members(task))
    prebuild([(task, split, n)])
    return list(_built(task_id(task), task, split, n) or ())


def _built(key: str, task: str, split: str, n: int) -> tuple[Item, ...] | None:
    # item i never depends on n, so a longer list already built answers a shorter request
    done = max((m for (t, s, m) in _BUILT if (t, s) == (key, split) and m >= n), default=None)
    return None if done is None else _BUILT[key, split, done][:n]


def prebuild(requests: list[tuple[str, str, int]]) -> None:
    """Build several (task, split, n) at once, in one child process when one is needed.

    Saves the child's start-up (importing Reasoning Gym) per split: callers that need both
    splits of a task (precompute, tests) ask for them together.
    """
    # a task file's path spelled two ways, or edited between calls, is told apart by its id
    requests = [(task_id(t), t, s, n) for t, s, n in requests]
    todo = [r for r in requests if _built(*r) is None]
    if not todo:
        return
    if not sys.flags.hash_randomization:
        for key, task, split, n in todo:
            _BUILT[key, split, n] = tuple(_generate(task, split, n))
        return
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    level = logging.getLogger("musketeers.progress").getEffectiveLevel()
    code = f"from {__name__} import _child; _child({[r[1:] for r in todo]!r}, {level})"
    # stderr is inherited: the child's progress bar or log lines reach the user
    proc = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                          check=False)
    try:
        reply = json.loads(proc.stdout)
    except ValueError:
        reply = None
    if isinstance(reply, dict) and isinstance(reply.get("error"), str):
        raise UserError(reply["error"])
    if proc.returncode != 0 or not isinstance(reply, list):
        names = ", ".join(sorted({d for _, t, _, _ in todo for d, _ in task_members(t)}))
        raise UserError(f"the items of {names} could not be generated (the generating "
                        f"process exited with {proc.returncode}); drop the dataset that "
                        "fails from the task")
    for (key, _, split, n), rows in zip(todo, reply, strict=True):
        _BUILT[key, split, n] = tuple(Item(**row) for row in rows)


_BUILT: dict[tuple[str, str, int], tuple[Item, ...]] = {}


def _generate(task: str, split: str, n: int) -> list[Item]:
    """The first ``n`` items of ``split``: streamed entries whose question belongs to it."""
    ds = make_dataset(task, split)
    system = system_prompt(parse_task(task).prompt)
    name = task_id(task)
    items: list[Item] = []
    idx = 0
    with progress(f"{task} {split} items", total=n) as bar:
        while len(items) < n:
            if idx >= STREAM_SIZE:
                raise RuntimeError(f"{task}/{split}: stream exhausted after {idx} entries")
            try:
                entry = ds[idx]
            except Exception as exc:  # a generator's bug on one index: name the dataset
                source = _member_of(task, idx, split)
                raise cannot_generate(source, f"item {idx}: {_reason(exc)}") from exc
            idx += 1
            question = entry["question"]
            if split_of(question) != split:
                continue
            source = entry.get("metadata", {}).get("source_dataset", name)
            answer = entry.get("answer")
            items.append(Item(
                id=f"{name}-{split}-{len(items):05d}",
                question=question,
                system=system,
                answer=None if answer is None else str(answer),
                entry=entry_to_json(entry),
                source=source,
            ))
            bar.advance()
    return items


def _member_of(task: str, idx: int, split: str) -> str:
    """The member dataset whose generator stream index ``idx`` of ``task`` falls to, as the
    composite draws it (seeded by ``seed + idx``); the task's name when that is not known."""
    ds = make_dataset(task, split)
    try:
        from random import Random

        rng = Random(ds.seed + idx)
        return rng.choices(ds.dataset_names, weights=ds.weights, k=1)[0]
    except Exception:  # not a composite (one dataset), or a composite of another shape
        only = members(parse_task(task))
        return only[0].name if len(only) == 1 else task_id(task)


def rg_task_spec(task: str) -> dict[str, Any]:
    """JSON-able description of a Reasoning Gym task: everything its items depend on."""
    import reasoning_gym

    name = parse_task(task)
    spec: dict[str, Any] = {
        "task": task_id(task),
        "generator": f"reasoning_gym=={getattr(reasoning_gym, '__version__', '?')}",
        "kind": "composite" if is_composite(name) else "dataset",
        "datasets": [{"name": d.name, "weight": d.weight, "config": dict(d.config)}
                     for d in members(name)],
        "seeds": dict(SEEDS),
        "sizes": dict(SPLIT_SIZES),
        "stream_size": STREAM_SIZE,
        "split_rule": "sha256(question)[:8] mod 3 == 2 -> val, else train; streams filtered",
        "system_prompt": name.prompt,
    }
    if name.level:  # stores written before levels existed keep their fingerprint
        spec["level"] = name.level
    if name.is_file:  # an edited file, even one whose datasets read the same, is another task
        spec["file_sha256"] = load_task_file(name.base).sha256
    return spec


def _child(requests: list[tuple[str, str, int]], level: int) -> None:
    """Entry of the ``PYTHONHASHSEED=0`` child: one JSON list of item lists on stdout."""
    logging.basicConfig(level=level, format="%(message)s")
    # the reply gets stdout to itself: what a generator prints (bf prints dots) goes to stderr
    reply = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    try:
        result: Any = [[asdict(it) for it in _generate(*r)] for r in requests]
    except UserError as exc:
        result = {"error": str(exc)}
    except Exception as exc:  # what no generator should raise, still told in one line
        result = {"error": f"the items could not be generated: {_reason(exc)}"}
    json.dump(result, reply)
    reply.flush()
