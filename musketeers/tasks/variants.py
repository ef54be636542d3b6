"""Task names: a base task, an optional difficulty level and an optional prompt style.

``arithmetic`` is the paper's family with its prompt (DeepSeekZero). ``arithmetic:easy`` is the
same family's datasets with smaller knobs; ``arithmetic@direct`` the paper's items under
Reasoning Gym's ``direct`` system prompt; ``arithmetic:easy@direct`` both. A variant is its own
store (``stores/arithmetic:easy@direct.zarr``) and its own task spec, so its fingerprint covers
the prompt the experts read as well as the items: a variant never silently replaces a family.

Why variants exist: a 0.5B policy with 64-128 new tokens gets no reward from the paper's
settings on a CPU (measured; see BENCHMARKS.md, "A regime with a signal"), and GRPO needs
groups whose rewards differ. Easier items and a shorter answer format are the levers that do
not touch the method.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from musketeers.cache.errors import UserError

BASE_TASKS: tuple[str, ...] = (
    "arithmetic", "algorithmic", "logic", "gsm8k", "gsm_symbolic", "planted")
DEFAULT_PROMPT = "DeepSeekZero"  # the paper's (appendix, Listings 2-4)
# Reasoning Gym's own system prompts (reasoning_gym.utils.SYSTEM_PROMPTS), by its names
PROMPT_STYLES: tuple[str, ...] = ("DeepSeekZero", "default", "simple", "direct",
                                  "chain_of_draft")

# The easy level of each paper family: those of its datasets whose generators have a knob that
# makes a short answer reachable for a small model, turned down (bitwise_arithmetic and
# knights_knaves stay hard at their lowest setting: left out), plus ``products``, Reasoning
# Gym's plainest arithmetic generator. Scorers are built with the family's config
# (``dataset_config``), so no knob here may change how an answer is graded
# (decimal_arithmetic's tolerance does: it is left out).
LEVELS: dict[str, dict[str, tuple[tuple[str, dict[str, Any]], ...]]] = {
    "easy": {
        "arithmetic": (
            ("chain_sum", {"min_terms": 2, "max_terms": 3, "max_digits": 2}),
            ("decimal_chain_sum", {"max_terms": 3, "max_digits": 2, "max_decimal_places": 1}),
            ("simple_geometry", {"max_sides": 4}),
            ("complex_arithmetic", {"min_real": -5, "max_real": 5, "min_imag": -5,
                                    "max_imag": 5, "operations": ("+", "-"),
                                    "operations_weights": [0.5, 0.5]}),
            ("products", {"max_digits": 2}),
        ),
        "algorithmic": (
            ("isomorphic_strings", {"max_string_length": 5}),
            ("base_conversion", {"max_base": 10, "max_value": 100}),
            ("binary_alternation", {"min_n": 4, "max_n": 8, "p_solvable": 0.9}),
            ("caesar_cipher", {"min_words": 1, "max_words": 3, "max_rotation": 5}),
            ("rotate_matrix", {"min_n": 2, "max_n": 3}),
            ("string_manipulation", {"max_string_length": 6, "min_num_rules": 3,
                                     "max_num_rules": 3}),
        ),
        "logic": (
            ("syllogism", {}),
            ("propositional_logic", {"max_vars": 2, "max_statements": 2, "max_complexity": 1}),
            ("circuit_logic", {"min_terms": 2, "max_terms": 3, "max_inputs": 2}),
            ("self_reference", {"difficulty": 1}),
            ("aiw", {"max_entities": 3}),
        ),
    },
    # easy, turned down where the pocket policy (Qwen2.5-Coder-0.5B, direct prompt, 32 tokens)
    # still had silent groups, chosen per dataset with ``python -m musketeers.bench.signal
    # --by-source`` (BENCHMARKS.md, "The easier level"): fewer decimal terms and digits,
    # complex addition only, base conversion of numbers up to 16 in bases up to 10.
    # simple_geometry and caesar_cipher are left out: at their lowest knobs (a triangle; one
    # word shifted by 1) no sample and no trained greedy answer was right
    "easier": {
        "arithmetic": (
            ("chain_sum", {"min_terms": 2, "max_terms": 3, "max_digits": 2}),
            ("decimal_chain_sum", {"max_terms": 2, "max_digits": 1, "max_decimal_places": 1}),
            ("complex_arithmetic", {"min_real": -3, "max_real": 3, "min_imag": -3,
                                    "max_imag": 3, "operations": ("+",),
                                    "operations_weights": [1.0]}),
            ("products", {"max_digits": 2}),
        ),
        "algorithmic": (
            ("isomorphic_strings", {"max_string_length": 5}),
            ("base_conversion", {"max_base": 10, "max_value": 16}),
            ("binary_alternation", {"min_n": 4, "max_n": 8, "p_solvable": 0.9}),
            ("rotate_matrix", {"min_n": 2, "max_n": 3}),
            ("string_manipulation", {"max_string_length": 6, "min_num_rules": 3,
                                     "max_num_rules": 3}),
        ),
    },
}


@dataclass(frozen=True)
class TaskName:
    """``base[:level][@prompt]``, parsed and checked."""

    base: str
    level: str | None = None
    prompt: str = DEFAULT_PROMPT

    def __str__(self) -> str:
        level = f":{self.level}" if self.level else ""
        prompt = f"@{self.prompt}" if self.prompt != DEFAULT_PROMPT else ""
        return f"{self.base}{level}{prompt}"


def parse_task(task: str) -> TaskName:
    """The parts of a task name; a UserError naming the valid ones otherwise."""
    rest, _, prompt = str(task).partition("@")
    base, _, level = rest.partition(":")
    if base not in BASE_TASKS:
        raise UserError(f"unknown task '{task}'; valid: {', '.join(BASE_TASKS)} "
                        "(optionally :LEVEL and @PROMPT, e.g. arithmetic:easy@direct)")
    if level and base not in LEVELS.get(level, {}):
        have = [f"{b}:{lv}" for lv, fams in LEVELS.items() for b in fams]
        raise UserError(f"task {task!r}: no level {level!r} for {base}; valid: {', '.join(have)}")
    if "@" in task and prompt not in PROMPT_STYLES:
        raise UserError(f"task {task!r}: unknown prompt style {prompt!r}; valid: "
                        f"{', '.join(PROMPT_STYLES)}")
    if base == "planted" and (level or "@" in task):
        raise UserError(f"task {task!r}: the planted task has no levels or prompt styles")
    return TaskName(base, level or None, prompt or DEFAULT_PROMPT)


def packaged_tasks(prompts: tuple[str, ...] = PROMPT_STYLES) -> list[str]:
    """Every task name ``parse_task`` accepts: each base at each of its levels under each of
    ``prompts`` (the planted task has neither levels nor prompt styles)."""
    out = ["planted"] if "planted" in BASE_TASKS else []
    for base in (b for b in BASE_TASKS if b != "planted"):
        for level in (None, *(lv for lv, families in LEVELS.items() if base in families)):
            out += [str(TaskName(base, level, prompt)) for prompt in prompts]
    return out


def system_prompt(style: str = DEFAULT_PROMPT) -> str:
    """Reasoning Gym's system prompt ``style`` (its ``SYSTEM_PROMPTS``)."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    return SYSTEM_PROMPTS[style]


def members(name: TaskName, families: dict[str, tuple]) -> tuple[tuple[str, dict], ...]:
    """The (dataset, config) list of a family task at its level."""
    if name.level is None:
        return families[name.base]
    return LEVELS[name.level][name.base]
