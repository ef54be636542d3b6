"""Admission: a task's reward is checked before any work is spent on it.

A reward that gives the gold answer 0, or that an answer built without the gold earns, makes
a run train on nothing or on a forgery, silently. ``precompute``, ``train`` and ``tasks show``
therefore admit a task first: on ``SAMPLE_PER_DATASET`` validation items of each of its source
datasets, graded by ``scoring.score`` (the path a policy's completion takes),

* **build**: the dataset generates items here (else the generator's one-line error);
* **gold**: the gold answer scores 1.0 on at least ``GOLD_SHARE`` of the items that have one
  (items without a gold answer, graded by a verifier, and items whose gold is no answer,
  empty or the question restated as an unevaluated integral (``hardening.no_answer``), are
  left out of this check);
* **forgery**: no forgery of the battery (``forgeries.FORGERIES``) earns full reward on
  ``GOLD_SHARE`` of the items (game_of_life_halting pays any non-empty answer), nor more than the
  dataset's best constant answer (its most common reference answer, ``forgeries``) by more
  than ``FORGERY_MARGIN``; nor does one constant answer earn full reward on ``GOLD_SHARE`` of
  the items (puzzle24 pays one expression on every item).

A task that fails is refused in one line naming the dataset, the check and ``OVERRIDE``.
Verdicts are cached as JSON (``MUSKETEERS_ADMISSION_DIR``, else ~/.cache/musketeers/admission)
under a key of the task's spec, Reasoning Gym's version and the source of the modules that
decide a grade, so a repeat costs a file read and any change to a scorer checks again.
``gsm8k`` (its numeric parser, no Reasoning Gym scorer) and ``planted`` (exact match on a
synthetic check) are admitted without a sample: no forgery reaches an equality test.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from musketeers.cache.errors import UserError
from musketeers.cache.items import Item

log = logging.getLogger(__name__)

SAMPLE_PER_DATASET = 32
GOLD_SHARE = 0.99
# how far a forgery's mean reward may exceed the constant's on the sample: partial-credit
# scorers pay any text a little (figlet_font: a constant word 0.04, "infinity" 0.07)
FORGERY_MARGIN = 0.05
OVERRIDE = "--allow-unadmitted-reward"
ADMISSION_DIR_ENV = "MUSKETEERS_ADMISSION_DIR"
EXEMPT = {"gsm8k": "graded by its numeric parser, no Reasoning Gym scorer",
          "planted": "exact match on the synthetic check's own answers"}
# the modules whose code decides a grade: their source is part of the cache key
_RULES = ("scoring.py", "hardening.py", "answer_grammar.py", "forgeries.py", "admission.py")


@dataclass(frozen=True)
class Verdict:
    """One source dataset's admission figures; ``failure`` None when it is admitted."""

    dataset: str
    items: int
    gold_items: int  # items whose gold answer was graded
    gold_share: float  # of those, the share scoring 1.0
    constant_score: float
    forgery: str  # the best-scoring forgery of the battery
    forgery_score: float
    failure: str | None = None


def cache_dir() -> Path:
    env = os.environ.get(ADMISSION_DIR_ENV)
    return Path(env) if env else Path.home() / ".cache" / "musketeers" / "admission"


def _key(task: str) -> str:
    import importlib.metadata

    from . import task_spec

    here = Path(__file__).parent
    parts = [json.dumps(task_spec(task), sort_keys=True),
             importlib.metadata.version("reasoning_gym"),
             str(SAMPLE_PER_DATASET), str(GOLD_SHARE), str(FORGERY_MARGIN),
             *((here / name).read_text(encoding="utf-8") for name in _RULES)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _read_cached(path: Path) -> list[Verdict] | None:
    try:
        return [Verdict(**row) for row in json.loads(path.read_text(encoding="utf-8"))]
    except (OSError, ValueError, TypeError):  # absent, unreadable or of another shape
        return None


def _write_cached(path: Path, verdicts: list[Verdict]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps([asdict(v) for v in verdicts]), encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:  # a read-only home: the check is only repeated next time
        log.warning("admission verdicts not cached (%s)", exc)


def judge(source: str, group: list[Item]) -> Verdict:
    """The gold and forgery checks of one source dataset's ``group`` of items."""
    from .forgeries import FORGERIES, best_scores, constant_answers, entry_of
    from .hardening import no_answer
    from .scoring import score

    # None: a verifier grades it; no_answer: an empty or unevaluated gold (see the docstring)
    graded = [it for it in group if it.answer is not None and not no_answer(entry_of(it))]
    gold = [score(it, f"<answer>{it.answer}</answer>") for it in graded]
    gold_share = sum(g >= 1.0 for g in gold) / len(gold) if gold else 1.0
    constant = constant_answers(group).get(source)
    constant_exact, constant_score = best_scores(
        group, lambda it: [] if constant is None else [constant])
    battery = {name: best_scores(group, answers) for name, answers in FORGERIES.items()}
    forgery = max(battery, key=lambda name: battery[name][1])
    forgery_exact, forgery_score = battery[forgery]
    failure = None
    if gold_share < GOLD_SHARE:
        failure = (f"the gold answer scores 1 on {100 * gold_share:.0f}% of {len(gold)} items "
                   f"(needs {100 * GOLD_SHARE:.0f}%)")
    elif forgery_exact >= GOLD_SHARE:  # a constant that scores as well is no excuse
        failure = (f"the forgery '{forgery}' scores 1 on {100 * forgery_exact:.0f}% of the "
                   "items: the reward cannot tell an answer from none")
    elif constant_exact >= GOLD_SHARE and len(group) > 1:
        failure = (f"one constant answer ({constant!r:.40}) scores 1 on "
                   f"{100 * constant_exact:.0f}% of the items: the reward does not read the "
                   "question")
    elif forgery_score > constant_score + FORGERY_MARGIN:
        failure = (f"the forgery '{forgery}' scores {forgery_score:.2f}, above the best constant "
                   f"answer's {constant_score:.2f}")
    return Verdict(source, len(group), len(gold), gold_share, constant_score, forgery,
                   forgery_score, failure)


def sample(task: str) -> dict[str, list[Item]]:
    """Up to ``SAMPLE_PER_DATASET`` validation items of each source dataset of ``task``."""
    from . import build_items
    from .reasoning_gym_tasks import task_members

    n = SAMPLE_PER_DATASET * len(task_members(task))
    by_source: dict[str, list[Item]] = defaultdict(list)
    for it in build_items(task, "val", n):
        if len(by_source[it.source]) < SAMPLE_PER_DATASET:
            by_source[it.source].append(it)
    return dict(sorted(by_source.items()))


def check_reward(task: str) -> list[Verdict]:
    """Every source dataset's verdict (cached); [] for an exempt task. Raises the build's
    UserError when a dataset cannot be generated."""
    from .variants import parse_task

    if parse_task(task).base in EXEMPT:
        return []
    path = cache_dir() / f"{_key(task)}.json"
    cached = _read_cached(path)
    if cached is not None:
        return cached
    verdicts = [judge(source, group) for source, group in sample(task).items()]
    _write_cached(path, verdicts)
    return verdicts


def refusal(task: str, verdict: Verdict) -> str:
    return (f"task {task!r}: dataset {verdict.dataset} has no trustworthy reward: "
            f"{verdict.failure}; drop it from the task, or pass {OVERRIDE} if you know why")


def admit(task: str, allow: bool = False) -> list[Verdict]:
    """``task``'s verdicts; UserError naming the first dataset that fails, unless ``allow``
    (then a warning per failing dataset)."""
    verdicts = check_reward(task)
    for v in verdicts:
        if v.failure is None:
            continue
        if not allow:
            raise UserError(refusal(task, v))
        log.warning("%s (admitted by %s)", refusal(task, v), OVERRIDE)
    return verdicts
