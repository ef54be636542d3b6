"""Where a completion's answer is, and the plain matchers that grade it.

Extraction (``extract_answer``) is linear time: it takes the last ``</answer>`` and the last
``<answer>`` before it. Reasoning Gym's regex (``<answer>\\s?(.*?)\\s?</answer>``) gives the
same text for well-formed completions, but it is quadratic on many unclosed openings, and on
nested tags it returns the outer text with an inner ``<answer>`` in it; ours returns the
innermost, last pair. GSM8K's numbers and the planted task's strings are matched here, in
bounded pure Python; the Reasoning Gym scorers run in ``musketeers.tasks.scoring``'s sandbox.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

# Extracted answers longer than this score 0.0 without reaching a scorer (see scoring)
MAX_ANSWER_CHARS = 65536
_OPEN, _CLOSE = "<answer>", "</answer>"


# How an answer is found in a completion. ``strict`` (the paper's, Reasoning Gym's): the last
# ``<answer>…</answer>`` pair only. ``lenient``: when there is none, the text after a last
# unclosed ``<answer>``, else after the last ``</think>``, else the last non-empty line; for
# small policies that answer right but drop the tags. A run names its choice (``extraction``)
# and the report prints it beside every number, since the two are different rewards.
EXTRACTIONS = ("strict", "lenient")


def extract_answer(completion: Any, extraction: str = "strict") -> str | None:
    """The graded answer of ``completion`` (see EXTRACTIONS), stripped; None when there is
    none."""
    if not isinstance(completion, str):
        return None
    end = completion.rfind(_CLOSE)
    start = completion.rfind(_OPEN, 0, end) if end >= 0 else -1
    if start >= 0:
        return completion[start + len(_OPEN) : end].strip()
    if extraction == "strict":
        return None
    if extraction != "lenient":
        raise ValueError(f"unknown extraction {extraction!r}; valid: {', '.join(EXTRACTIONS)}")
    opened = completion.rfind(_OPEN)
    if opened > end:  # an <answer> left open (the completion stopped before closing it)
        return completion[opened + len(_OPEN) :].strip() or None
    think = completion.rfind("</think>")
    rest = completion[think + len("</think>") :] if think >= 0 else completion
    lines = [ln.strip() for ln in rest.replace(_CLOSE, "").splitlines() if ln.strip()]
    return lines[-1] if lines else None


_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")


def parse_number(text: str) -> Decimal | None:
    """A plain number as GSM8K writes final answers: commas, ``$`` and a trailing ``.`` ignored."""
    t = text.strip().replace(",", "").replace("$", "").rstrip(".").strip()
    if not t or len(t) > 64 or not _NUMBER.match(t):
        return None
    try:
        value = Decimal(t)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def numeric_match(answer: str | None, gold: str | None) -> float:
    """GSM8K's reward: 1.0 when the answer is the gold number exactly (``18.00`` == ``18``)."""
    if answer is None or gold is None:
        return 0.0
    a, g = parse_number(answer), parse_number(gold)
    return 1.0 if a is not None and g is not None and a == g else 0.0


def exact_match(answer: str | None, gold: str | None) -> float:
    """The planted task's reward: the extracted text equals the gold string."""
    return 1.0 if answer is not None and gold is not None and answer == gold else 0.0
