"""A grid YAML read and checked before anything runs: one line naming the file and the key
for text that is not UTF-8, not YAML, or not a grid's shape (what ``load_grid`` indexes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from musketeers.cache.errors import UserError


def read_grid_yaml(path: Path) -> dict[str, Any]:
    """The grid file's top-level mapping; UserError for anything ``load_grid`` cannot use."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise UserError(f"grid {path} is not UTF-8 text (byte {exc.start}); save it as "
                        "UTF-8") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise UserError(f"grid {path} is not valid YAML{line} "
                        f"({getattr(exc, 'problem', None) or type(exc).__name__}); fix it "
                        "there") from None
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise UserError(f"grid {path} must be a mapping (budget:, seeds:, runs:, ...), not a "
                        f"{type(raw).__name__}; see musketeers/configs/ablations/smoke.yaml")
    return raw


def check_grid(raw: dict[str, Any], path: Path) -> None:
    """The types ``load_grid`` relies on, each refused with its key."""
    def bad(key: str, want: str, value: Any) -> UserError:
        return UserError(f"grid {path}: {key} must be {want}, got {value!r}; fix it there")

    if not is_int_list(raw.get("seeds", [0])):
        raise bad("seeds", "a list of integers", raw.get("seeds"))
    for key in ("defaults", "task_overrides", "precompute"):
        if not isinstance(raw.get(key) or {}, dict):
            raise bad(key, "a mapping", raw.get(key))
    for task, fields in (raw.get("task_overrides") or {}).items():
        if not isinstance(fields, dict):
            raise bad(f"task_overrides.{task}", "a mapping", fields)
    runs = raw.get("runs") or []
    if not isinstance(runs, list):
        raise bad("runs", "a list of mappings", runs)
    for i, entry in enumerate(runs):
        if not isinstance(entry, dict):
            raise bad(f"runs[{i}]", "a mapping of run fields", entry)
        seeds = entry.get("seeds")
        if seeds is not None and seeds != "first" and not is_int_list(seeds):
            raise bad(f"runs[{i}].seeds", "a list of integers or 'first'", seeds)
        if not is_int(entry.get("stage", 1)):
            raise bad(f"runs[{i}].stage", "an integer", entry.get("stage"))
    if raw.get("eval_limit") is not None and not is_int(raw["eval_limit"]):
        raise bad("eval_limit", "an integer", raw["eval_limit"])


def is_int(value: Any) -> bool:
    """An integer that is not a bool (YAML reads `true` as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_int_list(value: Any) -> bool:
    """A list of integers, each as ``is_int`` takes it."""
    return isinstance(value, list) and all(is_int(v) for v in value)
