"""Task names: a base task, an optional difficulty level and an optional prompt style.

``arithmetic`` is the paper's family with its prompt (DeepSeekZero). ``arithmetic:easy`` is the
same family's datasets with smaller knobs; ``arithmetic@direct`` the paper's items under
Reasoning Gym's ``direct`` system prompt; ``arithmetic:easy@direct`` both. A variant is its own
store (``stores/arithmetic:easy@direct.zarr``) and its own task spec, so its fingerprint covers
the prompt the experts read as well as the items: a variant never silently replaces a family.
The families and their levels are task files (``musketeers/configs/tasks``, ``task_files``).

Besides the named tasks, ``rg:NAME[@PROMPT]`` is any Reasoning Gym dataset at its defaults, and
``FILE.yaml[:LEVEL][@PROMPT]`` a task file of one's own (its ``prompt`` when no @PROMPT).

Why levels exist: a 0.5B policy with 64-128 new tokens gets no reward from the paper's
settings on a CPU (measured; see docs/benchmarks-history.md, "A regime with a signal"), and
GRPO needs groups whose rewards differ. Easier items and a shorter answer format are the levers
that do not touch the method.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from musketeers.cache.errors import UserError
from musketeers.cache.store import TASK_FILE

from .task_files import DatasetEntry, check_dataset_name, load_task_file, packaged, packaged_files

# tasks with generators of their own (not task files); gsm_symbolic is one Reasoning Gym dataset
BUILTIN_TASKS: tuple[str, ...] = ("gsm8k", "gsm_symbolic", "planted")
BASE_TASKS: tuple[str, ...] = (*packaged_files(), *BUILTIN_TASKS)
RG_PREFIX = "rg:"
DEFAULT_PROMPT = "DeepSeekZero"  # the paper's (appendix, Listings 2-4)
# Reasoning Gym's own system prompts (reasoning_gym.utils.SYSTEM_PROMPTS), by its names
PROMPT_STYLES: tuple[str, ...] = ("DeepSeekZero", "default", "simple", "direct",
                                  "chain_of_draft")


@dataclass(frozen=True)
class TaskName:
    """``base[:level][@prompt]``, parsed and checked."""

    base: str  # a named task, rg:NAME or a task file's path
    level: str | None = None
    prompt: str = DEFAULT_PROMPT

    @property
    def is_file(self) -> bool:
        return TASK_FILE.fullmatch(self.base) is not None

    @property
    def is_reasoning_gym(self) -> bool:
        """Items from Reasoning Gym (every task but gsm8k and planted)."""
        return self.base not in ("gsm8k", "planted")

    def __str__(self) -> str:
        level = f":{self.level}" if self.level else ""
        prompt = f"@{self.prompt}" if self.prompt != DEFAULT_PROMPT else ""
        return f"{self.base}{level}{prompt}"


def _check_prompt(task: str, prompt: str) -> str:
    if prompt not in PROMPT_STYLES:
        raise UserError(f"task {task!r}: unknown prompt style {prompt!r}; valid: "
                        f"{', '.join(PROMPT_STYLES)}")
    return prompt


def _parse_file(task: str, path: str, suffix: str) -> TaskName:
    """``PATH.yaml[:LEVEL][@PROMPT]``: the file is read and checked here."""
    spec = load_task_file(path)
    rest, at, prompt = suffix.partition("@")
    level = rest.removeprefix(":") or None
    if level is not None and level not in spec.levels:
        raise UserError(f"task {task!r}: {path} has no level {level!r}; valid: "
                        f"{', '.join(spec.levels) or 'none'}")
    prompt = prompt if at else (spec.prompt or DEFAULT_PROMPT)
    return TaskName(path, level, _check_prompt(task, prompt))


def parse_task(task: str) -> TaskName:
    """The parts of a task name; a UserError naming the valid ones otherwise."""
    task = str(task)
    if (m := TASK_FILE.fullmatch(task)) is not None:
        return _parse_file(task, m["path"], m["suffix"])
    rest, at, prompt = task.partition("@")
    if at:
        _check_prompt(task, prompt)
    if rest.startswith(RG_PREFIX):
        check_dataset_name(rest.removeprefix(RG_PREFIX), f"task {task!r}")
        return TaskName(rest, None, prompt or DEFAULT_PROMPT)
    base, _, level = rest.partition(":")
    if base not in BASE_TASKS:
        raise UserError(f"unknown task '{task}'; valid: {', '.join(BASE_TASKS)} "
                        "(optionally :LEVEL and @PROMPT, e.g. arithmetic:easy@direct), "
                        "rg:NAME for any Reasoning Gym dataset, or a task file FILE.yaml")
    if level and level not in levels(base):
        have = [f"{b}:{lv}" for b in packaged_files() for lv in levels(b)]
        raise UserError(f"task {task!r}: no level {level!r} for {base}; valid: {', '.join(have)}")
    if base == "planted" and (level or at):
        raise UserError(f"task {task!r}: the planted task has no levels or prompt styles")
    return TaskName(base, level or None, prompt or DEFAULT_PROMPT)


def levels(base: str) -> tuple[str, ...]:
    """The levels of a named task (only the packaged task files have any)."""
    return tuple(packaged(base).levels) if base in packaged_files() else ()


def packaged_tasks(prompts: tuple[str, ...] = PROMPT_STYLES) -> list[str]:
    """Every named task ``parse_task`` accepts: each base at each of its levels under each of
    ``prompts`` (the planted task has neither levels nor prompt styles)."""
    out = ["planted"] if "planted" in BASE_TASKS else []
    for base in (b for b in BASE_TASKS if b != "planted"):
        for level in (None, *levels(base)):
            out += [str(TaskName(base, level, prompt)) for prompt in prompts]
    return out


def task_family(task: str) -> str:
    """The column a run of ``task`` fills in tables and claims: its base task, without level
    or prompt (``arithmetic:easy@direct`` -> ``arithmetic``, ``rg:gcd@direct`` -> ``rg:gcd``,
    ``mix.yaml:easy`` -> ``mix.yaml``). Read from the string alone: a report rebuilt where a
    task file is absent still groups its runs."""
    if (m := TASK_FILE.fullmatch(task)) is not None:
        return m["path"]
    rest = task.partition("@")[0]
    return rest if rest.startswith(RG_PREFIX) else rest.partition(":")[0]


BUILTIN_TITLES = {"gsm8k": "GSM8K", "gsm_symbolic": "GSM-Symbolic", "planted": "Planted"}


def task_title(family: str) -> str:
    """A task's title in tables and claims, taken from the task: a task file's ``title``
    (packaged or one's own; its name when it has none), a built-in task's, a Reasoning Gym
    dataset's own name. A task file that cannot be read here is titled by its stem."""
    if family in packaged_files():
        return packaged(family).title
    if family in BUILTIN_TITLES:
        return BUILTIN_TITLES[family]
    if family.startswith(RG_PREFIX):
        return family.removeprefix(RG_PREFIX)
    if TASK_FILE.fullmatch(family) is not None:
        try:
            return load_task_file(family).title
        except UserError:
            return Path(family).stem
    return family


def system_prompt(style: str = DEFAULT_PROMPT) -> str:
    """Reasoning Gym's system prompt ``style`` (its ``SYSTEM_PROMPTS``)."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    return SYSTEM_PROMPTS[style]


def members(name: TaskName) -> tuple[DatasetEntry, ...]:
    """The Reasoning Gym datasets of a task (its level's, when it names one)."""
    if name.is_file:
        return load_task_file(name.base).members(name.level)
    if name.base in packaged_files():
        return packaged(name.base).members(name.level)
    return (DatasetEntry(name.base.removeprefix(RG_PREFIX)),)


def is_composite(name: TaskName) -> bool:
    """A task file is a Reasoning Gym composite; ``rg:NAME`` and gsm_symbolic one dataset."""
    return name.is_file or name.base in packaged_files()
