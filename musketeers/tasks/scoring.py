"""Rewards: the text in the last ``<answer>…</answer>`` graded by the item's own scorer.

Completions come from a sampling policy and may be anything: no tag, nested or unclosed
tags, megabytes of text, lone surrogates, LaTeX. ``score`` never raises; it returns 0.0 when
the completion cannot be graded.

The answer is found by ``musketeers.tasks.extraction``.

Extracted answers longer than ``MAX_ANSWER_CHARS`` score 0.0 without reaching the scorer. It is
far above any gold answer of the packaged tasks (a test checks it) and above the long gold
lists some datasets have (palindrome_partitioning's pass 4096 characters); the scorers that
parse their input with sympy, whose cost grows with the input, have the answer grammar's
tighter cap (``answer_grammar``).

Threat model. The policy is trained to maximise this reward, so it will find any way to forge
it, and the grading machine is shared: completions are hostile input. Three Reasoning Gym
scorers ``eval`` the answer (``sympy.parse_expr`` or ``eval``), so ``__import__('os')...``
ran on the grader, and ``print(1.0)`` wrote a grade into the worker's reply pipe that shifted
every later grade by one. Defences, each enough alone for what it covers:

1. ``answer_grammar``: an answer to an evaluating scorer must fit a whitelist grammar of that
   dataset's gold answers (no names but variables and math functions, no quotes, underscores
   or attribute access), else it scores 0.0: what reaches ``eval`` can only build numbers,
   sympy expressions and lists of ints, never run other code.
2. Protocol: each request carries a random id that the reply must echo; any other output
   kills the worker and the request is graded again by a fresh one (0.0 if it misbehaves
   again). The replies travel on a private descriptor, and the child's stdout and stderr are
   ``/dev/null``, so a scorer's ``print`` cannot reach them at all.
3. ``sandbox``: the child runs in its own temporary directory, and an audit hook refuses it
   processes, sockets, ``ctypes`` and writes outside that directory (tests run as root, so
   permissions would not).

Hostile text can also be slow: ``10**10**10`` or deep parentheses hang sympy or exhaust memory,
beyond a signal's reach (C-level big-int arithmetic). The scorers therefore run in one
persistent child process (``_ScorerWorker``): an answer not graded within ``SCORE_TIMEOUT_S``
scores 0.0 and the child is killed and restarted on the next call; the child's address space is
capped at ``WORKER_MEMORY_BYTES``. GSM8K and planted answers are graded in this process
(``extraction``'s matchers: bounded pure-Python parsing).
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import secrets
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from functools import cache
from pathlib import Path
from typing import Any

from musketeers.cache.items import Item

from . import answer_grammar, hardening, sandbox
from .extraction import (  # noqa: F401  (EXTRACTIONS: part of this API)
    EXTRACTIONS,
    MAX_ANSWER_CHARS,
    exact_match,
    extract_answer,
    numeric_match,
)

log = logging.getLogger(__name__)

SCORE_TIMEOUT_S = 10.0
WORKER_START_TIMEOUT_S = 180.0
WORKER_MEMORY_BYTES = 4 << 30
MAX_REPLY_BYTES = 4096


@cache
def _rg_scorer(source: str, config_json: str | None):
    """``score_answer`` of the Reasoning Gym dataset ``source``, built with ``config_json``
    (the config the item's task gave it; None: ``dataset_config``'s).

    A composite entry names its sub-dataset in ``metadata["source_dataset"]``; the scorer of
    that sub-dataset (not the composite's) grades it, with that dataset's config, as Reasoning
    Gym's composite does: some scorers read their config (decimal_arithmetic's tolerance).
    """
    import reasoning_gym

    from .reasoning_gym_tasks import dataset_config

    cfg = dict(dataset_config(source) if config_json is None else json.loads(config_json))
    cfg.setdefault("seed", 0)
    cfg.setdefault("size", 1)
    return reasoning_gym.create_dataset(source, **cfg).score_answer


# metadata fields that a scorer compares, as tuples, with what it parses from the answer: the
# item's JSON made them lists, and ``(1,) == [1]`` is false, so the gold answer scored 0.05
_TUPLE_FIELDS = {"arc_agi": ("output",), "rearc": ("output",)}


def _as_tuples(value: Any) -> Any:
    return tuple(_as_tuples(v) for v in value) if isinstance(value, list) else value


def _restore_tuples(source: str, entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` with the fields ``source``'s scorer reads as tuples made tuples again."""
    metadata = entry.get("metadata")
    fields = [f for f in _TUPLE_FIELDS.get(source, ()) if isinstance(metadata, dict)
              and f in metadata]
    if not fields:
        return entry
    return {**entry, "metadata": {**metadata, **{f: _as_tuples(metadata[f]) for f in fields}}}


def _grade_rg(source: str, answer: str | None, entry_json: str,
              config_json: str | None = None) -> float:
    """The grade, or 0.0 for an answer outside the grammar of a scorer that evaluates it, or
    one of the forgeries its scorer would reward (``hardening``)."""
    entry = json.loads(entry_json)
    source = entry.get("metadata", {}).get("source_dataset") or source
    entry = _restore_tuples(source, entry)
    if not answer_grammar.entry_admits(source, entry):
        return 0.0  # an edited store: the entry's evaluated field is not an expression
    if not answer_grammar.admits(source, answer, entry) or hardening.forged(answer, entry, source):
        return 0.0
    return float(_rg_scorer(source, config_json)(answer, entry))


def _import_every_module(package: Any) -> None:
    """Import every submodule of ``package`` now, before the sandbox: some datasets import
    theirs when first built (arc_1d), and a module's import may reach frames (``typing``
    does), which the sandbox refuses; such a scorer would grade every answer 0.0."""
    import importlib
    import pkgutil

    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        try:
            importlib.import_module(module.name)
        except Exception:  # a contributed script that is no module (code.contrib): unused
            continue


def _serve(root: str, private: bool = True) -> None:
    """The scorer child: per request line ``[id, source, answer, entry_json, config_json]``,
    one reply line
    ``{"id": id, "score": grade}``. ``root``: its temporary directory (see ``sandbox``).
    ``private=False`` leaves the protocol on fds 0 and 1 (only tests want that)."""
    import resource

    try:
        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    except (ValueError, OSError):  # not every platform allows it
        pass
    # the channel first: what an import prints must not reach the protocol
    requests, replies = sandbox.private_channel() if private else (sys.stdin, sys.stdout)
    import reasoning_gym  # noqa: F401  (import before "ready": start-up is not grading time)

    _import_every_module(reasoning_gym)
    sandbox.confine(root)
    replies.write("ready\n")
    replies.flush()
    for line in requests:
        try:
            request_id, source, answer, entry_json, config_json = json.loads(line)
        except Exception:  # not a request: nothing to answer to
            continue
        try:
            value = _grade_rg(source, answer, entry_json, config_json)
        except Exception:  # a scorer bug on hostile text is a zero reward
            value = 0.0
        if not 0.0 <= value <= 1.0:  # NaN included; the parent takes nothing else
            value = 0.0 if math.isnan(value) else min(max(value, 0.0), 1.0)
        replies.write(json.dumps({"id": request_id, "score": value}) + "\n")
        replies.flush()


class _Misbehaved(Exception):
    """The worker wrote something other than the reply it owed: its channel is not trusted."""


class _ScorerWorker:
    """A persistent, sandboxed child running Reasoning Gym scorers under a per-answer time limit.

    Each request carries a fresh random id and the child echoes it with the grade; the parent
    accepts exactly that reply. Any other output (a stray line, another id, non-JSON, bytes
    left over between requests) means the channel is not trusted: the child is killed and the
    request is graded once more by a fresh one (0.0 if that one misbehaves too). A timeout or a
    dead child (e.g. the memory cap) is the answer's doing: 0.0, and a fresh child next call.
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._root: str | None = None
        self._buffer = b""
        self._lock = threading.Lock()
        self._owner = os.getpid()
        self.starts = 0  # children started, for tests and logs

    def _child_code(self, root: str) -> str:
        """The child's program (``python -c``); the package's own root leads ``sys.path``
        instead of the cwd, a temporary directory the child may write."""
        package_root = str(Path(__file__).resolve().parents[2])
        return (f"import sys; sys.path[0] = {package_root!r}\n"
                f"from musketeers.tasks.scoring import _serve; _serve({root!r})")

    def _readline(self, deadline: float) -> bytes | None:
        """The next line (without its newline); None on timeout or end of output."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_REPLY_BYTES:
                raise _Misbehaved(f"a {len(self._buffer)}-byte reply line")
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _pending(self) -> bool:
        """Whether the child wrote anything since its last reply (it owes nothing now)."""
        assert self._proc is not None and self._proc.stdout is not None
        return bool(self._buffer) or bool(select.select([self._proc.stdout], [], [], 0)[0])

    def _start(self) -> None:
        self._root = tempfile.mkdtemp(prefix="musketeers-scorer-")
        env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
        self._proc = subprocess.Popen(
            [sys.executable, "-c", self._child_code(self._root)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, cwd=self._root, env=env, bufsize=0,
        )
        self.starts += 1
        if self._readline(time.monotonic() + WORKER_START_TIMEOUT_S) != b"ready":
            self.stop()
            raise RuntimeError("the Reasoning Gym scorer process did not start")

    def stop(self) -> None:
        if self._owner != os.getpid():  # a forked copy: leave the parent's child alone
            return
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for f in (self._proc.stdin, self._proc.stdout):
                if f is not None:
                    f.close()
            self._proc = None
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
        self._buffer = b""

    def _ask(self, source: str, answer: str | None, entry_json: str,
             config_json: str | None) -> float | None:
        """The child's grade; None on timeout or death; raises ``_Misbehaved``."""
        if self._owner != os.getpid():  # forked: the child and its pipes are the parent's
            self._proc, self._root, self._buffer, self._owner = None, None, b"", os.getpid()
        if self._proc is None or self._proc.poll() is not None:
            self.stop()
            self._start()
        assert self._proc is not None and self._proc.stdin is not None
        if self._pending():
            raise _Misbehaved("output between requests")
        request_id = secrets.token_hex(8)  # unguessable: a forged reply cannot name it
        try:
            request = [request_id, source, answer, entry_json, config_json]
            self._proc.stdin.write((json.dumps(request) + "\n").encode())
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            return None
        line = self._readline(time.monotonic() + SCORE_TIMEOUT_S)
        if line is None:
            return None
        try:
            reply = json.loads(line)
            value = reply["score"] if reply["id"] == request_id and len(reply) == 2 else None
        except (ValueError, TypeError, KeyError, RecursionError):
            value = None
        if type(value) is not float or not 0.0 <= value <= 1.0:
            raise _Misbehaved(f"not the reply to {request_id}: {line[:80]!r}")
        return value

    def __call__(self, source: str, answer: str | None, entry_json: str,
                 config_json: str | None = None) -> float:
        with self._lock:
            for attempt in (1, 2):
                try:
                    value = self._ask(source, answer, entry_json, config_json)
                except _Misbehaved as exc:
                    log.warning("scorer worker misbehaved (%s); restarting it (try %d of 2)",
                                exc, attempt)
                    self.stop()
                    continue
                if value is None:  # timed out or died: kill it, a fresh one next call
                    log.debug("scorer %s gave no grade in %.0f s; reward 0", source,
                              SCORE_TIMEOUT_S)
                    self.stop()
                    return 0.0
                return value
            return 0.0


_WORKER = _ScorerWorker()
atexit.register(_WORKER.stop)  # its temporary directory goes with it


def _rg_score(item: Item, answer: str | None) -> float:
    from .reasoning_gym_tasks import scorer_config

    config = json.dumps(scorer_config(item.id, item.source), sort_keys=True)
    return _WORKER(item.source, answer, item.entry, config)


_SCORERS = {
    "gsm8k": lambda item, answer: numeric_match(answer, item.answer),
    "planted": lambda item, answer: exact_match(answer, item.answer),
}


def score(item: Item, completion: str, extraction: str = "strict") -> float:
    """Reward in [0, 1] for ``completion`` on ``item``, its answer found by ``extraction``
    (EXTRACTIONS); never raises (0.0 when ungradable)."""
    try:
        answer = extract_answer(completion, extraction)
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
