"""Answer grammars: what an answer may look like before a scorer that evaluates it sees it.

Nine Reasoning Gym scorers run the model's text as code (reasoning_gym 0.1.25, every dataset's
``score_answer`` scanned; a test repeats the scan):

* ``polynomial_multiplication``, ``puzzle24``, ``countdown``: ``sympy.parse_expr(answer)``,
  which is Python ``eval``;
* ``intermediate_integration``, ``simple_integration``: ``sympy.parse_expr(answer,
  local_dict=...)``, the same;
* ``binary_matrix``, ``spiral_matrix``, ``string_insertion``, ``n_queens``: ``eval(answer)``
  when the answer is not the gold text verbatim (partial credit for a Python list).

So ``__import__('os').system(...)`` in an answer runs on the grading machine. Each of these
datasets gets a whitelist grammar here, built from the tokens its gold answers use (a test
checks that every gold answer of 200 generated items per dataset passes, so the grammar never
costs a correct answer its reward). An answer outside its grammar scores 0.0 without reaching
the scorer. The grammars admit no quotes, underscores, attribute access, brackets beyond what
the golds use, and no names but the item's variable and a fixed list of math functions: with
those, ``eval`` can only build numbers, sympy expressions or lists of ints. Values can still
be huge (``9**9**9``); the scorer's time and memory caps in ``scoring`` handle that.

Every other scorer reads the answer with ``Decimal``, ``float``, ``int``, ``json.loads``,
string comparison or its own parser (``propositional_logic``), never ``eval``; a few evaluate
a field of the entry instead (``EVALUATES_ENTRY``), which ``check_items`` proves is the one the
task generates. Whatever a grammar misses, every Reasoning Gym scorer runs in the sandboxed
scorer process (``scoring``, ``sandbox``). A test fails when any dataset's ``score_answer``
mentions ``eval``, ``parse_expr``, ``sympify`` or ``simplify`` and is in neither table.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_MAX_CHARS = 4096  # same as scoring.MAX_ANSWER_CHARS; a second guard for direct callers
_SPACE = r"[ \t]+"
_NUMBER = r"\d+(?:\.\d+)?"  # a dot only between digits: never ``1 .real`` attribute access
_NAME = r"[A-Za-z]+"  # no underscore, no digit: no dunders, no ``_``-prefixed internals
_OPERATOR = r"\*\*|[-+*/^()]"
_EXPR_TOKEN = re.compile(rf"{_SPACE}|{_NUMBER}|{_NAME}|{_OPERATOR}|(?P<comma>,)")
_VARIABLE = re.compile(r"[A-Za-z]")  # gold variables are single letters (simple_integration: X)

# sympy names an antiderivative may use; gold answers use sin, cos, exp, log, asin, atan,
# sqrt and ``Integral`` (sympy's unevaluated integral, when it found no closed form). All are
# classes or functions of sympy expressions: without quotes nothing can reach sympify-of-text.
_MATH_NAMES = frozenset({
    "sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "acot",
    "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "exp", "log", "ln", "sqrt", "Abs",
    "pi", "E", "Integral",
})


def _expression(answer: str, names: set[str], commas: bool) -> bool:
    """``answer`` is numbers, ``names``, arithmetic operators, parentheses (and commas)."""
    pos = 0
    for m in _EXPR_TOKEN.finditer(answer):
        if m.start() != pos:  # a character no token matches
            return False
        pos = m.end()
        if m.group("comma") is not None and not commas:
            return False
        token = m.group()
        if token[0].isalpha() and token not in names:
            return False
    return pos == len(answer)


def _variables(values: Any) -> set[str]:
    return {v for v in values if isinstance(v, str) and _VARIABLE.fullmatch(v)}


def _polynomial(answer: str, entry: dict[str, Any]) -> bool:
    """A polynomial in the item's variable: ``2240*x**3 + 3584*x**2 - 896*x``."""
    names = _variables(entry.get("metadata", {}).get("variables", ()))
    return _expression(answer, names, commas=False)


def _antiderivative(answer: str, entry: dict[str, Any]) -> bool:
    """An expression in the item's variable, ``C`` and math functions:
    ``-4*(-2*x - 8)**(3/2)/3 + C``; commas only for ``Integral(f, x)``."""
    names = _variables([entry.get("metadata", {}).get("variable")]) | {"C"} | _MATH_NAMES
    return _expression(answer, names, commas=True)


# gold form: rows of space-separated ints, one row per line ("0 1\n1 0"); the scorer also gives
# partial credit for a Python list of lists of ints ("[[0, 1], [1, 0]]"), which it evals
_GRID = re.compile(r"\d+(?:[ \t]+\d+)*(?:[ \t]*\r?\n[ \t]*\d+(?:[ \t]+\d+)*)*")
_ROW = r"\[\s*\d+(?:\s*,\s*\d+)*\s*,?\s*\]"
_LIST_OF_LISTS = re.compile(rf"\[\s*{_ROW}(?:\s*,\s*{_ROW})*\s*,?\s*\]")


def _int_matrix(answer: str, entry: dict[str, Any]) -> bool:
    return bool(_GRID.fullmatch(answer) or _LIST_OF_LISTS.fullmatch(answer))


def _arithmetic(answer: str, entry: dict[str, Any]) -> bool:
    """Numbers, + - * / ** and parentheses: ``3*(10 - 6 + 4)``."""
    return _expression(answer, set(), commas=False)


# gold: space-separated ints ("3 8 1 6"); partial credit for a flat Python list of them
_INT_LIST = re.compile(r"\[\s*-?\d+(?:\s*,\s*-?\d+)*\s*,?\s*\]")
_INTS = re.compile(r"-?\d+(?:\s+-?\d+)*")


def _int_sequence(answer: str, entry: dict[str, Any]) -> bool:
    return bool(_INTS.fullmatch(answer) or _INT_LIST.fullmatch(answer))


# gold: letters ("BAEDBD"); partial credit for a Python list of one-letter strings
_CHAR_LIST = re.compile(r"\[\s*(?:(['\"])[A-Za-z]\1\s*,\s*)*(['\"])[A-Za-z]\2\s*,?\s*\]")


def _letters(answer: str, entry: dict[str, Any]) -> bool:
    return answer.isascii() and (answer.isalpha() or bool(_CHAR_LIST.fullmatch(answer)))


# gold: rows of "_" and "Q" ("_ Q _ _\n..."); partial credit for a list of lists of them
_BOARD = re.compile(r"[_Q]+(?:[ \t]+[_Q]+)*(?:[ \t]*\r?\n[ \t]*[_Q]+(?:[ \t]+[_Q]+)*)*")
_QUOTED_CELL = r"['\"][_Q]['\"]"
_BOARD_ROW = rf"\[\s*{_QUOTED_CELL}(?:\s*,\s*{_QUOTED_CELL})*\s*,?\s*\]"
_BOARD_LIST = re.compile(rf"\[\s*(?:{_BOARD_ROW}\s*,?\s*)+\]")


def _queens_board(answer: str, entry: dict[str, Any]) -> bool:
    return bool(_BOARD.fullmatch(answer) or _BOARD_LIST.fullmatch(answer))


# dataset name -> does this answer fit the dataset's answer grammar? (see the module docstring)
GRAMMARS: dict[str, Callable[[str, dict[str, Any]], bool]] = {
    "polynomial_multiplication": _polynomial,
    "intermediate_integration": _antiderivative,
    "simple_integration": _antiderivative,
    "binary_matrix": _int_matrix,
    "puzzle24": _arithmetic,
    "countdown": _arithmetic,
    "spiral_matrix": _int_sequence,
    "string_insertion": _letters,
    "n_queens": _queens_board,
}


# Scorers that ``eval`` a field of the entry itself: bitwise_arithmetic evaluates
# ``metadata.problem`` (hex numbers, + - * << >> and parentheses). The entry comes from a
# store, which anyone with write access to it can edit: each such field must fit its grammar,
# so an edited store cannot hand the evaluator code.
_BITWISE_PROBLEM = re.compile(r"[0-9a-fx()+\-*<> ]{1,512}")
ENTRY_GRAMMARS: dict[str, tuple[str, re.Pattern[str]]] = {
    "bitwise_arithmetic": ("problem", _BITWISE_PROBLEM),
}
# scorers that evaluate a field of the entry (the gold answer, an integrand): number_sorting
# evals its gold list when it is not JSON; the others parse their gold expression with sympy
EVALUATES_ENTRY = frozenset({"bitwise_arithmetic", "number_sorting",
                             "polynomial_multiplication", "intermediate_integration",
                             "simple_integration"})


def entry_admits(source: str, entry: dict[str, Any]) -> bool:
    """Whether every entry field that ``source``'s scorer evaluates fits its grammar."""
    rule = ENTRY_GRAMMARS.get(source)
    if rule is None:
        return True
    value = entry.get("metadata", {}).get(rule[0]) if isinstance(entry, dict) else None
    return isinstance(value, str) and bool(rule[1].fullmatch(value))


def admits(source: str, answer: str | None, entry: dict[str, Any]) -> bool:
    """Whether ``answer`` may reach the scorer of ``source`` (None always may: it scores 0)."""
    grammar = GRAMMARS.get(source)
    if grammar is None or answer is None:
        return True
    return isinstance(answer, str) and len(answer) <= _MAX_CHARS and grammar(answer, entry)
