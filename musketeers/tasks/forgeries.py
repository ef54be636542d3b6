"""Shortcuts and forgeries: what a task rewards without the task being solved.

A gain is evidence only after the task's shortcuts are measured: the policy can learn to
answer one constant, or to copy something from the question, and a scorer may reward
answers that say nothing (``hardening``). For each source dataset of a split this measures

* the two **shortcuts**: one constant answer (the split's most common gold answer of that
  dataset) and copying the input (the best of the question's last quoted string or number
  and every number or expression span in it); the better one's mean score is the
  dataset's *shortcut baseline*, and its exact is printed beside every task;
* the **forgery battery**: non-finite numbers (in the spellings scorers normalise), unevaluated
  integrals, every premise restated, doubly negated or all conjoined, the question itself, an
  empty answer and a huge one. A forgery must score no more than
  the shortcut baseline.

Everything is graded by ``scoring.score`` on ``<answer>…</answer>`` completions, the path a
policy's completion takes.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from musketeers.cache.items import Item

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_QUOTED = re.compile(r"[\"'`]([^\"'`\n]{1,200})[\"'`]")
_EXPRESSION = re.compile(r"[-+*/^()\d.\sA-Za-z]*\d[-+*/^()\d.\sA-Za-z]*")

NON_FINITE = ("nan", "NaN", "nanj", "-nan", "inf", "-inf", "infinity", "nan + nanj", "oo",
              "zoo",
              # spellings a scorer normalises into one of the above (complex_arithmetic drops
              # spaces, lowers the case, reads i as j and strips outer parentheses)
              "nani", "NaN j", " n a n i", "N a N", "nan+nani", "(nan)", "-nani", "infi",
              "inf+infi")


def copy_input(question: str) -> str:
    """The copy-input shortcut: the question's last quoted string, else its last number,
    else its last word."""
    quoted = _QUOTED.findall(question)
    if quoted:
        return quoted[-1].strip()
    numbers = _NUMBER.findall(question)
    if numbers:
        return numbers[-1]
    words = question.split()
    return words[-1].strip(".?!:") if words else ""


def reference_answer(item: Item) -> str | None:
    """The gold answer; for a dataset graded by a verifier (no gold), Reasoning Gym's example
    answer when it gives one (propositional_logic)."""
    if item.answer is not None:
        return item.answer
    example = entry_of(item).get("metadata", {}).get("example_answer")
    return example if isinstance(example, str) else None


def constant_answers(items: list[Item]) -> dict[str, str]:
    """Per source dataset, its most common reference answer in ``items`` (ties: the first
    seen)."""
    by_source: dict[str, Counter] = defaultdict(Counter)
    for it in items:
        answer = reference_answer(it)
        if answer is not None:
            by_source[it.source][answer] += 1
    return {src: c.most_common(1)[0][0] for src, c in by_source.items()}


def entry_of(item: Item) -> dict[str, Any]:
    import json

    try:
        return json.loads(item.entry)
    except ValueError:
        return {}


def _echoes(item: Item) -> list[str]:
    """Every number and arithmetic expression of the question, as separate answers."""
    spans = {m.group().strip() for m in _EXPRESSION.finditer(item.question)}
    return sorted(s for s in spans if s and len(s) <= 200)[:20]


def _premises(item: Item) -> list[str]:
    return [p for p in entry_of(item).get("metadata", {}).get("premises", [])
            if isinstance(p, str)]


def _conjoined(item: Item) -> list[str]:
    """The premises joined with ∧, in their order and reversed (each premise parenthesised)."""
    premises = [f"({p})" for p in _premises(item)]
    return [" ∧ ".join(premises), " ∧ ".join(reversed(premises))] if len(premises) > 1 else []


def _integral(item: Item) -> list[str]:
    meta = entry_of(item).get("metadata", {})
    integrand, var = meta.get("integrand"), meta.get("variable", "x")
    return [f"Integral({integrand}, {var})"] if integrand else []


# forgery name -> the answers it tries on an item; an item's grade is the best of them, as a
# policy that found the trick would use its best variant
FORGERIES: dict[str, Callable[[Item], list[str]]] = {
    "non-finite": lambda it: list(NON_FINITE),
    "unevaluated integral": _integral,
    "premise restated": _premises,
    "premise doubly negated": lambda it: [f"¬¬({p})" for p in _premises(it)],
    "premises conjoined": _conjoined,
    "question echoed": lambda it: [it.question],
    "empty": lambda it: [""],
    "huge": lambda it: ["9" * 4000],
}


def copies(item: Item) -> list[str]:
    """The copy-input shortcut's candidates for ``item``."""
    return [copy_input(item.question), *_echoes(item)]


@dataclass
class SourceReport:
    """One source dataset's shortcut and forgery figures (exact shares, mean scores)."""

    source: str
    items: int
    constant: str | None
    constant_exact: float
    constant_score: float
    copy_exact: float
    copy_score: float
    forgery_score: dict[str, float]

    @property
    def shortcut_exact(self) -> float:
        return max(self.constant_exact, self.copy_exact)

    @property
    def shortcut_baseline(self) -> float:
        """The better shortcut's mean score: what a forgery may not beat."""
        return max(self.constant_score, self.copy_score)

    @property
    def worst_forgery(self) -> tuple[str, float]:
        if not self.forgery_score:
            return "", 0.0
        return max(self.forgery_score.items(), key=lambda kv: kv[1])


def _grade(item: Item, answer: str) -> float:
    from musketeers.tasks.scoring import score

    return score(item, f"<answer>{answer}</answer>", "strict")


def best_scores(group: list[Item], answers: Callable[[Item], list[str]]) -> tuple[float, float]:
    """(exact, mean score) of each item's best answer among ``answers(item)``."""
    best = [max((_grade(it, a) for a in answers(it)), default=0.0) for it in group]
    return sum(b >= 1.0 for b in best) / len(group), sum(best) / len(group)


def measure(items: list[Item], forgeries: bool = True) -> list[SourceReport]:
    """Shortcut exact and (optionally) the forgery battery, per source dataset of ``items``."""
    constants = constant_answers(items)
    by_source: dict[str, list[Item]] = defaultdict(list)
    for it in items:
        by_source[it.source].append(it)
    reports = []
    for src, group in sorted(by_source.items()):
        const = constants.get(src)
        const_exact, const_score = best_scores(group, lambda it, c=const: [] if c is None else [c])
        copy_exact, copy_score = best_scores(group, copies)
        scores = {name: best_scores(group, answers)[1] for name, answers in FORGERIES.items()} \
            if forgeries else {}
        reports.append(SourceReport(src, len(group), const, const_exact, const_score,
                                    copy_exact, copy_score, scores))
    return reports
