"""Ablation grids, declared: a YAML file per budget lists runs; ``load_grid`` expands them.

A grid entry is a mapping of TrainConfig fields. Any field given as a list is swept (the
cartesian product of all list-valued fields), and every entry is repeated over the grid's
seeds. Runs are named from their distinguishing fields, so the same run requested by two
entries (the default-team run feeds Table 1, Table 2, Figures 4–6) is run once. The runner
(``musketeers.grid``) and the report (``musketeers.reports``) both read a grid from here.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from musketeers.cache.errors import UserError
from musketeers.cache.store import store_name
from musketeers.cache.tokens import POOLED
from musketeers.cache.untrusted import safe_name
from musketeers.config import DEFAULT_TOKEN_LAYER
from musketeers.design import experiment
from musketeers.design.grid_yaml import check_grid, read_grid_yaml
from musketeers.design.prereg import Preregistration, read_prereg
from musketeers.method.asked import share_percent
from musketeers.method.methods import fixed_steps, ignored

BUDGETS = ("smoke", "pocket", "paper")
# Order of the fields in a run's name.
NAME_FIELDS = ("task", "method", "team", "pooling", "channel", "token_layer", "token_positions",
               "latents", "warmup_permute_share")


@dataclass(frozen=True)
class GridRun:
    """One run of a grid: its folder name, its TrainConfig fields, and what to evaluate."""

    name: str
    fields: dict[str, Any]
    eval_no_context: bool = False
    stage: int = 1  # runs go by (stage, seed, task): a night that ends early ends complete


@dataclass
class Grid:
    budget: str
    description: str
    defaults: dict[str, Any]
    runs: list[GridRun]
    eval_limit: int | None = None
    estimate: str = ""
    precompute: dict[str, Any] | None = None  # settings, or None: the stores must exist
    # the report folder and ledger's name (the YAML's ``name``, default the budget), so a
    # finished grid can be kept as a published result beside the budget's current grid
    name: str = ""
    # the YAML's own seeds: the main comparison; a part's longer seed list adds power beyond it
    seeds: list[int] = field(default_factory=list)
    # what the report tests, fixed before any run (``design.prereg``); None: exploratory
    prereg: Preregistration | None = None

    def __post_init__(self) -> None:
        self.name = self.name or self.budget


def grid_file(budget: str) -> Path:
    """The packaged grid YAML of a budget (musketeers/configs/ablations/<budget>.yaml)."""
    if budget not in BUDGETS:
        raise UserError(f"unknown budget {budget!r}; use --budget one of {', '.join(BUDGETS)}")
    return Path(str(resources.files("musketeers") / "configs" / "ablations" / f"{budget}.yaml"))


def _unnamed(fields: dict[str, Any]) -> set[str]:
    """The name fields a run's name leaves out although given: the pooled channel and the
    last layer (the defaults, so a grid from before channels keeps its names) and positions on
    the pooled channel (one token, code 0: nothing changes); on a token channel the pooling,
    which it does not read."""
    channel = fields.get("channel")
    if channel in (None, POOLED):
        return {"channel", "token_layer", "token_positions"}
    last = fields.get("token_layer") in (None, DEFAULT_TOKEN_LAYER)
    return {"pooling", "token_layer"} if last else {"pooling"}


def _name_part(key: str, value: Any) -> str:
    """One field's part of a run's name: a task file's path as its store's name (no slashes in
    a folder's name), ``m``/``L`` before latents and layer, ``pos`` for positions, and the
    asked share as its exact percent (``ask50``, ``ask50.4``: two shares never share a name)."""
    if key == "token_positions":
        return "pos"
    if key == "warmup_permute_share":
        return f"ask{share_percent(value)}"
    if key == "task":
        value = store_name(str(value))
    prefix = {"latents": "m", "token_layer": "L"}.get(key, "")
    return f"{prefix}{value}".replace(":", "")


def run_name(budget: str, fields: dict[str, Any]) -> str:
    """Unique folder name
    ``<budget>-<task>-<method>[-team][-pooling][-channel][-L<layer>][-pos][-mK][-askP]-s<seed>``
    (P: the percent of the warm-up's rows asked another row's question; none asked: unnamed)."""
    skip = set(ignored(fields.get("method"))) | _unnamed(fields)
    parts = [budget]
    for key in NAME_FIELDS:
        if key in skip or fields.get(key) is None or fields.get(key) is False or (
                key == "warmup_permute_share" and not fields[key]):
            continue
        parts.append(safe_name(_name_part(key, fields[key]), f"the grid's {key}",
                               f"give {key} a plain value in the grid file"))
    parts.append(safe_name(f"s{fields.get('seed', 0)}", "the grid's seed",
                           "give seeds as integers in the grid file"))
    return safe_name("-".join(parts), "run name", "rename the grid's budget")


def expand_entry(entry: dict[str, Any], seeds: Iterable[int],
                 selected: Iterable[int] | None = None) -> list[dict[str, Any]]:
    """Every combination of the entry's list-valued fields, once per seed: the entry's own
    seeds (those of them in ``selected``, when the command line picked seeds) or else
    ``seeds``."""
    entry = dict(entry)
    entry.pop("eval_no_context", None)
    entry.pop("stage", None)
    entry_seeds = entry.pop("seeds", None)
    seeds = list(seeds)
    if entry_seeds == "first":  # a result that does not depend on the seed
        entry_seeds = seeds[:1]
    elif entry_seeds is not None and selected is not None:
        keep = set(selected)
        entry_seeds = [s for s in entry_seeds if s in keep]
    keys = [k for k, v in entry.items() if isinstance(v, list)]
    combos = itertools.product(*(entry[k] for k in keys)) if keys else [()]
    out = []
    for combo in combos:
        for seed in entry_seeds if entry_seeds is not None else seeds:
            out.append({**entry, **dict(zip(keys, combo, strict=True)), "seed": int(seed)})
    return out


def load_grid(
    source: str | Path,
    seeds: list[int] | None = None,
    tasks: list[str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> Grid:
    """Read a grid YAML (a budget name or a path).

    ``seeds`` replaces the grid's seeds and keeps only those of an entry's own list,
    ``tasks`` keeps only those tasks' runs, and ``overrides`` (e.g. ``{"cache_dir": ...}``)
    is applied to every run last.
    """
    path = grid_file(str(source)) if str(source) in BUDGETS else Path(source)
    if not path.is_file():
        raise UserError(f"no grid file {path}; pass --budget one of {', '.join(BUDGETS)}")
    raw = read_grid_yaml(path)
    if "parts" in raw:  # an overlay on the experiment design, not a list of runs
        raw = {**raw, "runs": experiment.overlay_runs(raw, path)}
    check_grid(raw, path)
    budget = safe_name(raw.get("budget", path.stem), f"grid {path}: budget",
                       "give the grid a plain budget (smoke, pocket, paper)")
    defaults = dict(raw.get("defaults") or {})
    task_overrides = raw.get("task_overrides") or {}
    grid_seeds = seeds if seeds is not None else list(raw.get("seeds", [0]))
    runs: dict[str, GridRun] = {}
    for entry in raw.get("runs") or []:
        for fields in expand_entry(entry, grid_seeds, seeds):
            fields = {**defaults, **task_overrides.get(fields.get("task"), {}), **fields,
                      **(overrides or {})}
            if tasks is not None and fields.get("task") not in tasks:
                continue
            if (steps := fixed_steps(fields.get("method"))) is not None:
                fields["steps"] = steps  # the method's, as `train` would run it
            name = run_name(budget, fields)
            no_ctx = bool(entry.get("eval_no_context"))
            stage = int(entry.get("stage", 1))
            if name in runs:  # one run listed twice (Figure 5 reuses Table 1's): one union
                before = runs[name]
                clash = {k for k in before.fields.keys() & fields.keys()
                         if before.fields[k] != fields[k]}
                if clash:
                    raise UserError(f"grid {path}: run {name} is listed twice with different "
                                    f"{', '.join(sorted(clash))}; give it one entry")
                fields = {**before.fields, **fields}
                no_ctx = no_ctx or before.eval_no_context
                stage = min(stage, before.stage)
            runs[name] = GridRun(name, fields, no_ctx, stage)
    if not runs:
        raise UserError(f"grid {path} selects no runs; check --tasks/--seeds")
    # seed-major within a stage, so that whatever finishes first is every method of one
    # (task, seed) rather than one method over every seed
    tasks_seen = list(dict.fromkeys(r.fields.get("task") for r in runs.values()))
    ordered = sorted(runs.values(), key=lambda r: (r.stage, r.fields.get("seed", 0),
                                                   tasks_seen.index(r.fields.get("task"))))
    return Grid(
        budget=budget,
        description=str(raw.get("description", "")).strip(),
        defaults=defaults,
        runs=ordered,
        eval_limit=raw.get("eval_limit"),
        estimate=str(raw.get("estimate", "")).strip(),
        precompute=raw.get("precompute") or None,
        # the report folder's and ledger's name: one folder under --reports-dir, --runs-dir
        name=safe_name(raw.get("name") or budget, f"grid {path}: name",
                       "give the grid a plain name"),
        seeds=[int(s) for s in grid_seeds],
        prereg=read_prereg(raw.get("preregistered"), path),
    )
