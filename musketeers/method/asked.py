"""Rows asked another row's question: a seeded derangement σ of a split's rows (row i is asked
row σ(i)'s question, and keeps its own gold answer, scorer entry and expert states).

From the question's side an oracle expert then read another item's answer, and that answer is
the target: nothing in the question computes it, so reading C is the only way to score such a
row. Two users: the permuted-target experiment (``musketeers.bench.permuted``, every row of
every split), and the warm-up's ``warmup_permute_share`` (a lever beyond the paper: a share of
the train rows only, drawn afresh each step, so that the supervised warm-up teaches φ to read C
where the question would otherwise answer and C go unread; GRPO and the evaluation see the real
task).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol, TypeVar

import numpy as np

from musketeers.cache.items import Item
from musketeers.method.methods import derangement
from musketeers.runtime.seeds import derived_seed

_PERMUTE_TAG = 0x9E27  # derived_seed stream of the targets' permutation
_SHARE_TAG = 0x9E28  # derived_seed stream of the rows a partial permutation moves


class Rows(Protocol):
    """A split as a dataclass whose ``items`` line up with its other rows (``SplitData``)."""

    items: list[Item]


R = TypeVar("R", bound=Rows)


def target_permutation(n: int, seed: int) -> list[int]:
    """σ: row i is asked row σ(i)'s question. Seeded, so fixed per (n, seed), and a
    derangement, so no row keeps its own question (n ≥ 2)."""
    return derangement(n, derived_seed(seed, _PERMUTE_TAG)).tolist()


def share_permutation(n: int, seed: int, share: float) -> list[int]:
    """σ for ``permute_share``: a seeded ``share`` of the n rows (rounded; none below two) is
    deranged among itself, every other row keeps its own question (σ(i) = i). Share 1 is
    ``target_permutation``."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"a share of rows is in [0, 1], not {share}")
    k = round(share * n)
    sigma = list(range(n))
    if k < 2:
        return sigma
    moved = np.sort(np.random.default_rng(derived_seed(seed, _SHARE_TAG)).choice(
        n, size=k, replace=False))
    for i, j in zip(moved, moved[target_permutation(k, seed)], strict=True):
        sigma[int(i)] = int(j)
    return sigma


def share_percent(share: float) -> str:
    """A share of rows asked as its exact percent (0.5 → ``50``, 0.504 → ``50.4``): the one
    spelling of a share in run names, labels and claims, so two shares never read alike."""
    return f"{100 * float(share):.6g}"


def share_label(share: float) -> str:
    """A share as a label's words (0.5 → ``50% asked``): one wording in tables and claims."""
    return f"{share_percent(share)}% asked"


def asked(data: R, sigma: list[int]) -> R:
    """``data`` with row i asked row σ(i)'s question (and system prompt), all else its own."""
    items = [replace(it, question=data.items[j].question, system=data.items[j].system)
             for it, j in zip(data.items, sigma, strict=True)]
    return replace(data, items=items)  # type: ignore[type-var]


def permute_targets(data: R, seed: int) -> R:
    """``data`` with each row asked another row's question (``target_permutation``)."""
    return asked(data, target_permutation(len(data.items), seed))


def permute_share(data: R, seed: int, share: float) -> R:
    """``data`` with a seeded ``share`` of its rows asked another of those rows' question
    (``share_permutation``); ``data`` itself where the share moves no row."""
    sigma = share_permutation(len(data.items), seed, share)
    return data if sigma == list(range(len(sigma))) else asked(data, sigma)
