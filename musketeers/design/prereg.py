"""A grid's pre-registration: what it tests, fixed in its YAML before any of its runs exist.

    preregistered:
      fixed: 2026-11-28            # when the block was written (before the first run)
      primary: exact               # the measure the confirmatory tests use
      seeds: [0, 1, 2]             # the confirmatory seeds
      arms: [perceiver/oracle, shuffled_experts/oracle, single]
      confirmatory: ["oracle > Single", "oracle > its shuffled experts"]

The report (``reports.verdict_table``) adjusts p-values by Holm over the confirmatory family
only, on the registered seeds only. A comparison outside the family, one whose arm is not
registered, or one that uses seeds added later, is printed as exploratory: its own p, never
a family-wise one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from musketeers.cache.errors import UserError
from musketeers.design.comparisons import COMPARISONS, arm, comparison_names
from musketeers.design.grid_yaml import is_int_list

PRIMARY = ("exact",)  # the measures a confirmatory test may use (the report's verdicts)
KEYS = ("fixed", "primary", "seeds", "arms", "confirmatory")


@dataclass(frozen=True)
class Preregistration:
    fixed: str
    primary: str
    seeds: tuple[int, ...]
    arms: tuple[str, ...]
    confirmatory: tuple[str, ...]
    # a grid without a block: its own seeds and every comparison, fixed by no one in advance
    implicit: bool = False

    def registered(self, name: str) -> bool:
        """Whether comparison ``name`` is in the confirmatory family."""
        return name in self.confirmatory

    def arm_missing(self, name: str) -> str | None:
        """The first arm of comparison ``name`` that was not registered, or None."""
        c = next(c for c in COMPARISONS if c.name == name)
        return next((a for a in (arm(c.tested), arm(c.control)) if a not in self.arms), None)


def read_prereg(raw: Any, path: Path) -> Preregistration | None:
    """The YAML's ``preregistered`` block, checked; None when the grid has none."""
    if raw is None:
        return None

    def bad(key: str, want: str, value: Any) -> UserError:
        return UserError(f"grid {path}: preregistered.{key} must be {want}, got {value!r}; "
                         "fix it there")

    if not isinstance(raw, dict):
        raise bad("", "a mapping of " + ", ".join(KEYS), raw)
    if unknown := sorted(set(raw) - set(KEYS)):
        raise bad(unknown[0], "one of " + ", ".join(KEYS), raw[unknown[0]])
    if raw.get("primary", "exact") not in PRIMARY:
        raise bad("primary", " or ".join(PRIMARY), raw.get("primary"))
    if not is_int_list(raw.get("seeds")) or not raw["seeds"]:
        raise bad("seeds", "a non-empty list of integers", raw.get("seeds"))
    family = raw.get("confirmatory")
    names = comparison_names()
    if not isinstance(family, list) or not family or any(n not in names for n in family):
        raise bad("confirmatory", "a list of the report's comparisons (" + "; ".join(names)
                  + ")", family)
    arms = raw.get("arms")
    if not isinstance(arms, list) or not all(isinstance(a, str) for a in arms):
        raise bad("arms", "a list of arms (method or method/team)", arms)
    pre = Preregistration(str(raw.get("fixed", "")), str(raw.get("primary", "exact")),
                          tuple(int(s) for s in raw["seeds"]), tuple(arms), tuple(family))
    for name in family:
        if (missing := pre.arm_missing(name)) is not None:
            raise bad("arms", f"every arm of the confirmatory comparisons ({name!r} needs "
                      f"{missing!r})", arms)
    return pre


def implicit(seeds: list[int]) -> Preregistration:
    """What a grid without a ``preregistered`` block is read as: every comparison on the
    grid's own seeds (its main comparison). Its p-values stay exploratory, and a part's
    seeds beyond them are marked."""
    arms = sorted({arm(k) for c in COMPARISONS for k in (c.tested, c.control)})
    return Preregistration("", "exact", tuple(seeds), tuple(arms), comparison_names(),
                           implicit=True)
