"""The permuted-target experiment: is the pipe the limit, or the policy's own route?

The oracle expert reads an item's gold answer. Here every row of a split is asked another
row's question (a fixed, seeded derangement σ of the split: row i is asked row σ(i)'s
question), and keeps its own gold answer, scorer entry and expert states. From the question's
side, the oracle read another item's answer, and that answer is the target the policy is
trained and graded against: nothing in the question computes it, so reading C is the policy's
only way to score. The team's other experts read the target's row too, so a run with the oracle
alone (``--experts``) isolates it.

The permutation itself is the method's (``musketeers.method.asked``), shared with the
warm-up's ``warmup_permute_share``: only a share of the train rows permuted, among themselves, so
that a warm-up on that mix can score those rows only through C while the real rows keep the
question's route, and the validation split stays the real task.

Exact is then reported by the target's length: short answers read but long ones not means
the channel is too narrow for a long answer; every length read means a null result on the real
task came from the policy's own route (it answers from the question and ignores C).
"""

from __future__ import annotations

from collections import Counter

from musketeers.cache.items import Item
from musketeers.reports.probes import wilson


def answer_length(answer: str) -> int:
    """An answer's length: its digits (a number's sign and point aside), or its characters
    where it has none."""
    text = answer.strip()
    return sum(c.isdigit() for c in text) or len(text)


def constant_answer(items: list[Item]) -> str:
    """The most common gold answer of ``items`` (ties: the first seen): the shortcut a policy
    that ignores C and the question can at best say."""
    return Counter(it.answer for it in items if it.answer is not None).most_common(1)[0][0]


def by_length(items: list[Item], right: dict[str, list[bool]]
              ) -> list[dict[str, object]]:
    """Per target length: n and each condition's exact (%) with its 95 % Wilson interval."""
    lengths = [answer_length(it.answer or "") for it in items]
    rows = []
    for length in sorted(set(lengths)):
        at = [i for i, k in enumerate(lengths) if k == length]
        row: dict[str, object] = {"length": length, "n": len(at)}
        for cond, hits in right.items():
            k = sum(hits[i] for i in at)
            low, high = wilson(k, len(at))
            row[cond] = (100 * k / len(at), 100 * low, 100 * high)
        rows.append(row)
    return rows


def length_table(channel: str, rows: list[dict[str, object]], conditions: list[str]
                 ) -> list[str]:
    """A Markdown table of ``by_length``'s rows: exact % [95 % interval] per condition."""
    out = [f"channel `{channel}`: exact % [95 % Wilson interval] by the target's length",
           "", "| length | n | " + " | ".join(conditions) + " |",
           "|---:|---:|" + "---:|" * len(conditions)]
    for row in rows:
        cells = []
        for cond in conditions:
            p, low, high = row[cond]  # type: ignore[misc]
            cells.append(f"{p:.1f} [{low:.0f}, {high:.0f}]")
        out.append(f"| {row['length']} | {row['n']} | " + " | ".join(cells) + " |")
    return out
