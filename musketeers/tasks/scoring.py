"""Rewards: the text in the last ``<answer>…</answer>`` graded by the item's own scorer.

Completions come from a sampling policy and may be anything: no tag, nested or unclosed
tags, megabytes of text, lone surrogates, LaTeX. ``score`` never raises; it returns 0.0 when
the completion cannot be graded.

Extraction (``extract_answer``) is linear time: it takes the last ``</answer>`` and the last
``<answer>`` before it. Reasoning Gym's regex (``<answer>\\s?(.*?)\\s?</answer>``) gives the
same text for well-formed completions, but it is quadratic on many unclosed openings, and on
nested tags it returns the outer text with an inner ``<answer>`` in it; ours returns the
innermost, last pair.

Extracted answers longer than ``MAX_ANSWER_CHARS`` score 0.0 without reaching the scorer:
no gold answer of any task here is near that long (a test checks it), and some scorers parse
their input with sympy, whose cost grows with the input.

Reasoning Gym scorers ``eval`` or ``sympy.parse_expr`` what the model wrote: ``10**10**10``
or deep parentheses hang them or exhaust memory, beyond a signal's reach (C-level big-int
arithmetic). They therefore run in one persistent child process (``_ScorerWorker``): an
answer not graded within ``SCORE_TIMEOUT_S`` scores 0.0 and the child is killed and restarted
on the next call; the child's address space is capped at ``WORKER_MEMORY_BYTES``. GSM8K and
planted answers are graded here (bounded pure-Python parsing).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import select
import subprocess
import sys
import threading
from decimal import Decimal, InvalidOperation
from functools import cache
from typing import Any

from musketeers.cache.items import Item

log = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 4096
SCORE_TIMEOUT_S = 10.0
WORKER_START_TIMEOUT_S = 180.0
WORKER_MEMORY_BYTES = 4 << 30
_OPEN, _CLOSE = "<answer>", "</answer>"


def extract_answer(completion: Any) -> str | None:
    """Text inside the last ``<answer>…</answer>`` pair, stripped; None when there is none."""
    if not isinstance(completion, str):
        return None
    end = completion.rfind(_CLOSE)
    if end < 0:
        return None
    start = completion.rfind(_OPEN, 0, end)
    if start < 0:
        return None
    return completion[start + len(_OPEN) : end].strip()


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


@cache
def _rg_scorer(source: str):
    """``score_answer`` of the Reasoning Gym dataset ``source``, built with our config for it.

    A composite entry names its sub-dataset in ``metadata["source_dataset"]``; the scorer of
    that sub-dataset (not the composite's) grades it, so the JSON entry alone is enough.
    """
    import reasoning_gym

    from .reasoning_gym_tasks import dataset_config

    cfg = dict(dataset_config(source))
    cfg.setdefault("seed", 0)
    cfg.setdefault("size", 1)
    return reasoning_gym.create_dataset(source, **cfg).score_answer


def _grade_rg(source: str, answer: str | None, entry_json: str) -> float:
    entry = json.loads(entry_json)
    source = entry.get("metadata", {}).get("source_dataset") or source
    return float(_rg_scorer(source)(answer, entry))


def _serve() -> None:
    """The scorer child: one JSON request per stdin line, one float per stdout line."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    except (ImportError, ValueError, OSError):  # not every platform allows it
        pass
    import reasoning_gym  # noqa: F401  (import before "ready": start-up is not grading time)

    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            source, answer, entry_json = json.loads(line)
            value = _grade_rg(source, answer, entry_json)
        except Exception:  # a scorer bug on hostile text is a zero reward
            value = 0.0
        out.write(f"{value!r}\n")
        out.flush()


class _ScorerWorker:
    """A persistent child running Reasoning Gym scorers under a per-answer time limit."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _readline(self, timeout: float) -> str | None:
        assert self._proc is not None and self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout)
        return self._proc.stdout.readline() if ready else None

    def _start(self) -> None:
        code = "from musketeers.tasks.scoring import _serve; _serve()"
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, encoding="utf-8", bufsize=1, env=env,
        )
        if self._readline(WORKER_START_TIMEOUT_S) != "ready\n":
            self.stop()
            raise RuntimeError("the Reasoning Gym scorer process did not start")

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for f in (self._proc.stdin, self._proc.stdout):
                if f is not None:
                    f.close()
            self._proc = None

    def __call__(self, source: str, answer: str | None, entry_json: str) -> float:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self.stop()
                self._start()
            assert self._proc is not None and self._proc.stdin is not None
            try:
                self._proc.stdin.write(json.dumps([source, answer, entry_json]) + "\n")
                self._proc.stdin.flush()
                line = self._readline(SCORE_TIMEOUT_S)
            except (BrokenPipeError, OSError, ValueError):
                line = None
            if not line:  # timed out or died (e.g. the memory cap): kill, restart next call
                log.debug("scorer %s gave no grade in %.0f s; reward 0", source, SCORE_TIMEOUT_S)
                self.stop()
                return 0.0
            return float(line)


_WORKER = _ScorerWorker()


def _rg_score(item: Item, answer: str | None) -> float:
    return _WORKER(item.source, answer, item.entry)


_SCORERS = {
    "gsm8k": lambda item, answer: numeric_match(answer, item.answer),
    "planted": lambda item, answer: exact_match(answer, item.answer),
}


def score(item: Item, completion: str) -> float:
    """Reward in [0, 1] for ``completion`` on ``item``; never raises (0.0 when ungradable)."""
    try:
        answer = extract_answer(completion)
        if answer is not None and len(answer) > MAX_ANSWER_CHARS:
            return 0.0
        scorer = _SCORERS.get(item.source, _rg_score)
        value = float(scorer(item, answer))
    except Exception as exc:  # a scorer bug on hostile text is a zero reward, not a crash
        log.debug("scorer %s raised %r; reward 0", item.source, exc)
        return 0.0
    if math.isnan(value):
        return 0.0
    return min(max(value, 0.0), 1.0)
