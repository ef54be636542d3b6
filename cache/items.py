"""The unit the cache stores per row: one prompt with what its scorer needs."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Item:
    """One prompt of a task split.

    ``entry`` is the task's own scorer input serialised as JSON (for Reasoning Gym, the
    dataset entry), so a cache alone is enough to train and evaluate. ``source`` names the
    sub-dataset (e.g. ``chain_sum``) for per-task reward normalisation.
    """

    id: str
    question: str
    system: str
    answer: str | None
    entry: str
    source: str

    def to_dict(self) -> dict:
        return asdict(self)


def items_fingerprint(items: list[Item]) -> str:
    """sha256 over every field of every item, in order: the identity of a split's rows."""
    h = hashlib.sha256()
    for it in items:
        h.update(json.dumps(it.to_dict(), sort_keys=True).encode())
        h.update(b"\n")
    return h.hexdigest()
