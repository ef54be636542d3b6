"""Forgeries: answers that Reasoning Gym's own scorers reward although they answer nothing.

A policy under RL maximises the reward, so it finds whatever a scorer accepts. Found by the
forgery battery (``forgeries.battery``) against reasoning_gym 0.1.25, each reproduced in
``docs/upstream-scorer-bugs.md``:

* ``complex_arithmetic``: ``nan`` (also ``NaN``, ``nanj``, ``-nan``) scores 1.0 on every item:
  the scorer returns ``min(1.0, exp(-abs(answer - gold)))``; the distance is NaN, and
  ``min(1.0, nan)`` is 1.0 because every comparison with NaN is false.
* ``intermediate_integration``: ``Integral(<integrand>, x)`` scores 1.0: the scorer checks
  that the answer's derivative equals the integrand, which the unevaluated integral's does.
* ``propositional_logic``: restating a premise scores 0.775 on average: the scorer grades
  a conclusion's validity, and every premise follows from the premises.

``forged`` rejects these before the scorer runs (a reward of 0.0). Each rule applies only
where the gold answer does not itself take that form, so it never costs a correct answer.
"""

from __future__ import annotations

import re
from typing import Any

# a non-finite number as Python, numpy or sympy write it, alone or as a complex part
_NON_FINITE = re.compile(r"(?<![a-z])(nan|inf|infinity|zoo|oo)j?(?![a-z])", re.IGNORECASE)
# sympy objects that stand for a computation instead of its result
_UNEVALUATED = re.compile(r"(?<![A-Za-z])(Integral|Derivative|Limit|Subs|integrate|diff)\s*\(")
_SPACE = re.compile(r"\s+")


def _premises(entry: dict[str, Any]) -> list[str]:
    return [p for p in entry.get("metadata", {}).get("premises", []) if isinstance(p, str)]


def _bare(text: str) -> str:
    """A logic statement without spaces or its outermost parentheses."""
    text = _SPACE.sub("", text)
    while text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    return text


def forged(answer: str | None, entry: dict[str, Any]) -> str | None:
    """Why ``answer`` is a forgery of ``entry``'s scorer, or None when it may be graded."""
    if not isinstance(answer, str):
        return None
    gold = entry.get("answer")
    gold = gold if isinstance(gold, str) else ""
    if _NON_FINITE.search(answer) and not _NON_FINITE.search(gold):
        return "a non-finite number"
    if _UNEVALUATED.search(answer) and not _UNEVALUATED.search(gold):
        return "an unevaluated integral, derivative or limit"
    premises = {_bare(p) for p in _premises(entry)}
    if premises and _bare(answer) in premises:
        return "a premise restated"
    return None
