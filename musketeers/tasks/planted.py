"""The planted-expert task: the answer is a seeded digit nobody can read off the prompt.

Every prompt asks the same question; only the item's tag differs (a split and index, which
carry no information about the digit, drawn independently per item with ``Random(seed + i)``).
A policy can beat chance (0.1) only through a context vector that carries the digit, which the
trainer's check plants in one expert's cached vectors. Items are built here; vectors are not.
"""

from __future__ import annotations

import json
from random import Random
from typing import Any

from musketeers.cache.items import Item

SIZES = {"train": 4_096, "val": 1_024}
SEEDS = {"train": 7_000, "val": 9_000_000}
SYSTEM = "Reply with the answer inside <answer></answer> tags."
QUESTION = "[{tag}] What is the secret digit? Answer with <answer>d</answer>, d in 0-9."


def planted_digit(split: str, index: int) -> int:
    """The seeded answer of item ``index`` of ``split`` (0–9, uniform, independent per item)."""
    return Random(SEEDS[split] + index).randrange(10)


def build_planted_items(split: str, n: int) -> list[Item]:
    items = []
    for i in range(n):
        digit = str(planted_digit(split, i))
        question = QUESTION.format(tag=f"{split[0]}{i}")
        items.append(Item(
            id=f"planted-{split}-{i:05d}",
            question=question,
            system=SYSTEM,
            answer=digit,
            entry=json.dumps({"question": question, "answer": digit}, sort_keys=True),
            source="planted",
        ))
    return items


def planted_task_spec() -> dict[str, Any]:
    return {
        "task": "planted",
        "seeds": dict(SEEDS),
        "sizes": dict(SIZES),
        "question": QUESTION,
        "system": SYSTEM,
        "answer": "Random(seed + index).randrange(10)",
        "scorer": "exact match of the last <answer>",
    }
