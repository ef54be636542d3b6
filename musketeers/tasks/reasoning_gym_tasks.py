"""Reasoning Gym tasks: the paper's three families (appendix, Listings 2–4) and gsm_symbolic.

Each family is a ``CompositeDataset`` of its listed datasets, weight 1 each, with the listed
config overrides. Items are deterministic functions of (seed, index): Reasoning Gym seeds
item ``i`` with ``Random(seed + i)`` in every dataset used here, and the composite's virtual
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

from musketeers.cache.items import Item
from musketeers.cache.progress import progress

from .variants import members, parse_task, system_prompt

FAMILIES: dict[str, tuple[tuple[str, dict[str, Any]], ...]] = {
    # Listing 2
    "arithmetic": (
        ("complex_arithmetic", {}),
        ("intermediate_integration", {}),
        ("polynomial_equations", {}),
        ("polynomial_multiplication", {}),
        ("simple_geometry", {}),
        ("bitwise_arithmetic", {}),
        ("chain_sum", {}),
        ("decimal_arithmetic", {}),
        ("decimal_chain_sum", {}),
    ),
    # Listing 3
    "algorithmic": (
        ("ab", {}),
        ("base_conversion", {}),
        ("binary_alternation", {"p_solvable": 0.9}),
        ("binary_matrix", {"min_n": 2, "max_n": 6}),
        ("caesar_cipher", {"max_words": 10}),
        ("cryptarithm", {}),
        ("isomorphic_strings", {"max_string_length": 8}),
        ("jugs", {"difficulty": 6}),
        ("rotate_matrix", {"min_n": 2, "max_n": 6}),
        ("string_manipulation", {"max_string_length": 15, "max_num_rules": 6}),
    ),
    # Listing 4
    "logic": (
        ("aiw", {}),
        ("circuit_logic", {}),
        ("knights_knaves", {}),
        ("propositional_logic", {}),
        ("self_reference", {}),
        ("syllogism", {}),
        ("zebra_puzzles", {}),
    ),
}
SINGLES: dict[str, dict[str, Any]] = {"gsm_symbolic": {}}
RG_TASKS = (*FAMILIES, *SINGLES)

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
    """Our config overrides for a Reasoning Gym dataset name ({} when it has none)."""
    for family in FAMILIES.values():
        for member, cfg in family:
            if member == name:
                return cfg
    return SINGLES.get(name, {})


def task_members(task: str) -> tuple[tuple[str, dict[str, Any]], ...]:
    """(dataset, config) of every member of a Reasoning Gym task name (level included)."""
    name = parse_task(task)
    if name.base in SINGLES:
        return ((name.base, SINGLES[name.base]),)
    return members(name, FAMILIES)


@cache
def make_dataset(task: str, split: str):
    """The split's stream: a composite (families) or a single dataset, fixed seed and size."""
    import reasoning_gym
    from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

    seed = SEEDS[split]
    base = parse_task(task).base
    if base in SINGLES:
        return reasoning_gym.create_dataset(base, seed=seed, size=STREAM_SIZE, **SINGLES[base])
    specs = [DatasetSpec(name=n, weight=1, config=dict(c)) for n, c in task_members(task)]
    return CompositeDataset(CompositeConfig(size=STREAM_SIZE, seed=seed, datasets=specs))


def entry_to_json(entry: dict[str, Any]) -> str:
    """The entry as JSON; tuples become lists, which every scorer used here accepts (tested)."""
    return json.dumps(entry, sort_keys=True, ensure_ascii=False, default=str)


def build_rg_items(task: str, split: str, n: int) -> list[Item]:
    """The first ``n`` items of ``split``, generated under ``PYTHONHASHSEED=0``."""
    prebuild([(task, split, n)])
    return list(_built(task, split, n))


def _built(task: str, split: str, n: int) -> tuple[Item, ...] | None:
    # item i never depends on n, so a longer list already built answers a shorter request
    done = max((m for (t, s, m) in _BUILT if (t, s) == (task, split) and m >= n), default=None)
    return None if done is None else _BUILT[task, split, done][:n]


def prebuild(requests: list[tuple[str, str, int]]) -> None:
    """Build several (task, split, n) at once, in one child process when one is needed.

    Saves the child's start-up (importing Reasoning Gym) per split: callers that need both
    splits of a task (precompute, tests) ask for them together.
    """
    todo = [r for r in requests if _built(*r) is None]
    if not todo:
        return
    if not sys.flags.hash_randomization:
        for r in todo:
            _BUILT[r] = tuple(_generate(*r))
        return
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    level = logging.getLogger("musketeers.progress").getEffectiveLevel()
    code = f"from {__name__} import _child; _child({todo!r}, {level})"
    # stderr is inherited: the child's progress bar or log lines reach the user
    out = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                         check=True).stdout
    for r, rows in zip(todo, json.loads(out), strict=True):
        _BUILT[r] = tuple(Item(**row) for row in rows)


_BUILT: dict[tuple[str, str, int], tuple[Item, ...]] = {}


def _generate(task: str, split: str, n: int) -> list[Item]:
    """The first ``n`` items of ``split``: streamed entries whose question belongs to it."""
    ds = make_dataset(task, split)
    system = system_prompt(parse_task(task).prompt)
    items: list[Item] = []
    idx = 0
    with progress(f"{task} {split} items", total=n) as bar:
        while len(items) < n:
            if idx >= STREAM_SIZE:
                raise RuntimeError(f"{task}/{split}: stream exhausted after {idx} entries")
            entry = ds[idx]
            idx += 1
            question = entry["question"]
            if split_of(question) != split:
                continue
            source = entry.get("metadata", {}).get("source_dataset", task)
            answer = entry.get("answer")
            items.append(Item(
                id=f"{task}-{split}-{len(items):05d}",
                question=question,
                system=system,
                answer=None if answer is None else str(answer),
                entry=entry_to_json(entry),
                source=source,
            ))
            bar.advance()
    return items


def rg_task_spec(task: str) -> dict[str, Any]:
    """JSON-able description of a Reasoning Gym task: everything its items depend on."""
    import reasoning_gym

    name = parse_task(task)
    spec = {
        "task": task,
        "generator": f"reasoning_gym=={getattr(reasoning_gym, '__version__', '?')}",
        "kind": "composite" if name.base in FAMILIES else "dataset",
        "datasets": [{"name": n, "weight": 1, "config": dict(c)} for n, c in task_members(task)],
        "seeds": dict(SEEDS),
        "sizes": dict(SPLIT_SIZES),
        "stream_size": STREAM_SIZE,
        "split_rule": "sha256(question)[:8] mod 3 == 2 -> val, else train; streams filtered",
        "system_prompt": name.prompt,
    }
    if name.level:  # stores written before levels existed keep their fingerprint
        spec["level"] = name.level
    return spec



def _child(requests: list[tuple[str, str, int]], level: int) -> None:
    """Entry of the ``PYTHONHASHSEED=0`` child: one JSON list of item lists on stdout."""
    logging.basicConfig(level=level, format="%(message)s")
    json.dump([[asdict(it) for it in _generate(*r)] for r in requests], sys.stdout)
