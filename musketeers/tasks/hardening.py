"""Forgeries: answers that Reasoning Gym's own scorers reward although they answer nothing.

A policy under RL maximises the reward, so it finds whatever a scorer accepts. Found by the
forgery battery (``forgeries.battery``) against reasoning_gym 0.1.25, each reproduced in
``docs/upstream-scorer-bugs.md``:

* ``complex_arithmetic``: ``nan`` (also ``NaN``, ``nanj``, ``-nan``, and ``nani``, ``NaN j``,
  `` n a n i``: the scorer drops spaces, lowers the case and reads ``i`` as ``j``) scores 1.0 on
  every item: the scorer returns ``min(1.0, exp(-abs(answer - gold)))``; the distance is NaN,
  and ``min(1.0, nan)`` is 1.0 because every comparison with NaN is false. The answer is
  therefore judged as that scorer parses it (``_PARSERS``), not as written.
* ``intermediate_integration``: ``Integral(<integrand>, x)`` scores 1.0: the scorer checks
  that the answer's derivative equals the integrand, which the unevaluated integral's does. It
  is refused even where the gold is itself such an integral (about one item in ten: sympy did
  not integrate it), since it restates the question (``no_answer``).
* ``propositional_logic``: restating a premise scores 0.775 on average, and all premises
  joined with ∧ score 1.0: the scorer grades a conclusion's validity, and the premises follow
  from themselves. An answer equivalent (same truth table) to a premise or to a conjunction of
  premises is refused, whatever its spelling.

``forged`` rejects these before the scorer runs (a reward of 0.0). Each rule but the
unevaluated one applies only where the gold answer does not itself take that form, so it never
costs a correct answer.
"""

from __future__ import annotations

import cmath
import itertools
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


def _complex(text: str) -> complex | None:
    from reasoning_gym.algebra.complex_arithmetic import ComplexArithmeticDataset

    try:
        value = ComplexArithmeticDataset.parse_string_to_complex(text)
    except (ValueError, TypeError, OverflowError):
        return None
    return value if isinstance(value, complex) else None


# dataset -> the number its scorer reads from an answer (Reasoning Gym's own parser)
_PARSERS = {"complex_arithmetic": _complex}


def _non_finite(source: str | None, text: str) -> bool:
    """Whether ``text``, as ``source``'s scorer reads it, is (or holds) a non-finite number."""
    if _NON_FINITE.search(text):
        return True
    parse = _PARSERS.get(source or "")
    value = parse(text) if parse is not None else None
    return value is not None and not cmath.isfinite(value)


def _restates_premises(answer: str, premises: list[str]) -> bool:
    """Whether ``answer`` has the truth table of a premise or of a conjunction of premises
    (as Reasoning Gym's propositional_logic parses them), or names an atom no premise does
    (the scorer checks only capitals: ``nani`` is a fresh variable, which follows from
    contradictory premises)."""
    from reasoning_gym.logic.propositional_logic import Expression

    def names(e: Any) -> set[str]:
        if e.operator is None:
            return {e.left}
        return names(e.left) | (names(e.right) if e.right is not None else set())

    try:
        parsed = [Expression.from_string(p) for p in premises]
        said = Expression.from_string(answer)
        known = set().union(*map(names, parsed))
        if not names(said) <= known:
            return True
        variables = sorted(known)
        if len(variables) > _MAX_VARIABLES or len(parsed) > _MAX_PREMISES:
            return False
        rows = [dict(zip(variables, bits, strict=True))
                for bits in itertools.product((False, True), repeat=len(variables))]
        table = tuple(said.evaluate(r) for r in rows)
        tables = [tuple(p.evaluate(r) for r in rows) for p in parsed]
    except (ValueError, KeyError, AttributeError, RecursionError):
        return False  # not a statement the scorer can read: it grades it itself
    for k in range(1, len(tables) + 1):
        for chosen in itertools.combinations(tables, k):
            if tuple(all(col) for col in zip(*chosen, strict=True)) == table:
                return True
    return False


_MAX_VARIABLES = 12  # Reasoning Gym's premises use a handful; beyond, the scorer decides
_MAX_PREMISES = 8


def no_answer(entry: dict[str, Any]) -> bool:
    """Whether ``entry``'s gold answer is itself no answer: empty (string_manipulation; no
    scorer pays an empty answer), or the question restated as an unevaluated integral
    (intermediate_integration, when sympy could not integrate). No answer earns such an item
    a reward: admission leaves it out of its gold check."""
    gold = entry.get("answer")
    return gold == "" or (isinstance(gold, str) and _UNEVALUATED.search(gold) is not None)


def forged(answer: str | None, entry: dict[str, Any], source: str | None = None) -> str | None:
    """Why ``answer`` is a forgery of ``entry``'s scorer, or None when it may be graded.
    ``source``: the dataset whose scorer grades it (the entry's own when None)."""
    if not isinstance(answer, str):
        return None
    source = source or entry.get("metadata", {}).get("source_dataset")
    gold = entry.get("answer")
    gold = gold if isinstance(gold, str) else ""
    if _non_finite(source, answer) and not _non_finite(source, gold):
        return "a non-finite number"
    if _UNEVALUATED.search(answer):  # a gold of that form is no answer either (no_answer)
        return "an unevaluated integral, derivative or limit"
    premises = _premises(entry)
    if premises and (_bare(answer) in {_bare(p) for p in premises}
                     or _restates_premises(answer, premises)):
        return "a premise restated or premises conjoined"
    return None
