"""The experiment: every cell of the paper's tables and figures, and the controls behind its
claims, declared once.

A ``Part`` is what one table, figure or claim needs: a few entries of TrainConfig fields (a
list value is swept), on the paper's task families. The grids (``configs/ablations/*.yaml``)
are overlays on this design: a budget (``budgets.BUDGETS``, the size of every run), the seeds,
which families run as which task (``arithmetic`` as ``arithmetic:easier@direct`` in the pocket
grid), the policy and roster, and per part whether it runs on every seed or the first, in
which stage, restricted to which values (``only``), with which extra fields (``set``). The
report reads the same parts: Table 2's poolings, Figure 5's tasks and Figure 6's m come from
here, not from literals in the tables.

A user's own grid can still list its ``runs:`` directly (``musketeers ablate --grid``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musketeers.cache.errors import UserError
from musketeers.design.grid_yaml import is_int_list

# The paper's task families, in its column order.
FAMILIES = ("algorithmic", "arithmetic", "logic", "gsm8k")
TEAMS = ("default", "generalist", "naive", "llm")
POOLINGS = ("first_token", "first_layer", "random_token", "random_layer")  # Table 2 (+ last)
LATENTS = (2, 4, 16, 32, 64, 128)  # Figure 6 (+ the default m = 8)
DEFAULT_LATENTS = 8  # the paper's m
DEFAULT_POOLING = "last"


@dataclass(frozen=True)
class Part:
    """One table's, figure's or claim's runs. Entries without ``task`` run on every family."""

    name: str
    feeds: str  # what the report builds from it
    entries: tuple[dict[str, Any], ...]
    first_seed_only: bool = False  # a result that does not depend on the seed
    stage: int = 1  # parts run in stage order

    def values(self, key: str) -> tuple[Any, ...]:
        """Every value ``key`` takes in this part's entries (lists flattened), in order."""
        out: list[Any] = []
        for entry in self.entries:
            v = entry.get(key)
            for x in v if isinstance(v, list | tuple) else [v]:
                if x is not None and x not in out:
                    out.append(x)
        return tuple(out)


OURS = {"method": "perceiver", "team": "default"}

DESIGN: tuple[Part, ...] = (
    Part("untrained", "the regime claim: Single after training against its start",
         ({"method": "untrained"},), first_seed_only=True, stage=0),
    Part("table1", "Table 1's main rows and §4.2's claims: Single and Ours per team",
         ({"method": "single"}, {"method": "perceiver", "team": list(TEAMS)})),
    Part("controls", "every claim for Ours is stated against these (Table 1's control rows)",
         ({"method": ["shuffled_experts", "shuffled_reward"], "team": "default"},)),
    # the positive control: an oracle expert reads the gold answer. If Ours with it does not
    # beat Single and its own shuffled experts, no null result of a real team means anything
    Part("positive_control", "the oracle team against Single and its shuffled experts",
         ({"method": ["perceiver", "shuffled_experts"], "team": "oracle",
           "eval_no_context": True},)),
    Part("strong", "a team with an expert stronger than the policy, against the same controls",
         ({"method": ["perceiver", "shuffled_experts"], "team": "strong"},)),
    Part("zero_context", "Table 1's zero-context row: C's information, or m more positions?",
         ({"method": "zero_context", "team": "default"},)),
    Part("baselines", "Table 1's other methods",
         ({"method": ["hard_routing", "output_collab", "no_cross_attn"], "team": "default"},)),
    # its control: the shuffled-experts run (the controls part's) evaluated without C too; a
    # policy trained beside m context positions may lose accuracy without them whatever they
    # hold. ``eval_only``: this part adds an evaluation to that run and changes none of its
    # training settings (an overlay's ``set`` skips it), so the run is not trained twice.
    Part("figure5", "Figure 5 and its claim: Ours with and without C, against its control",
         ({"task": ["logic", "arithmetic"], **OURS, "eval_no_context": True},
          {"task": ["logic", "arithmetic"], "method": "shuffled_experts", "team": "default",
           "eval_no_context": True, "eval_only": True})),
    Part("table2", "Table 2: pooling (last = Table 1's Ours)",
         ({"task": "arithmetic", **OURS, "pooling": list(POOLINGS)},)),
    Part("figure6", "Figure 6: the number of latent queries m (8 = Table 1's Ours)",
         ({"task": "arithmetic", **OURS, "latents": list(LATENTS)},)),
)
PARTS = {p.name: p for p in DESIGN}


@dataclass
class PartSettings:
    """An overlay's settings for one part (the grid YAML's ``parts: {name: {...}}``)."""

    # "all" (the grid's seeds), "first", or the part's own list (a comparison that needs
    # more seeds than the rest of the grid for its power)
    seeds: str | list[int] = "all"
    stage: int | None = None  # None: the part's own
    tasks: list[str] | None = None  # families, replacing the part's own
    only: dict[str, list[Any]] = field(default_factory=dict)  # keep these values of a field
    set: dict[str, Any] = field(default_factory=dict)  # extra TrainConfig fields


def part_entries(part: Part, settings: PartSettings, families: dict[str, str]
                 ) -> list[dict[str, Any]]:
    """The part's entries as grid entries (the custom-grid format ``grids.expand_entry``
    reads): families mapped to the overlay's tasks (a family it does not run is dropped),
    ``only`` applied to swept and fixed values, ``set`` added, seeds and stage attached."""
    out = []
    for entry in part.entries:
        entry = dict(entry)
        if not entry.pop("eval_only", False):
            entry.update(settings.set)
        own = settings.tasks or entry.pop("task", None) or list(families)
        entry.pop("task", None)  # replaced by the overlay's tasks, if it names them
        tasks = [families[t] for t in (own if isinstance(own, list) else [own])
                 if t in families]
        keep = True
        for key, allowed in settings.only.items():
            if key not in entry:
                continue
            v = entry[key]
            if isinstance(v, list):
                v = [x for x in v if x in allowed]
                keep = keep and bool(v)
            else:
                keep = keep and v in allowed
            entry[key] = v
        if not tasks or not keep:
            continue
        entry["task"] = tasks
        entry["stage"] = part.stage if settings.stage is None else settings.stage
        if settings.seeds == "first" or part.first_seed_only:
            entry["seeds"] = "first"
        elif isinstance(settings.seeds, list):
            entry["seeds"] = list(settings.seeds)
        out.append(entry)
    return out


def overlay_runs(raw: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    """The runs of an overlay grid: ``tasks`` (the families it runs, or a mapping from family
    to the task run for it) and ``parts`` (which parts of ``DESIGN`` it runs, each
    with its ``PartSettings``), in the design's order."""
    tasks = raw.get("tasks") or list(FAMILIES)
    families = dict(tasks) if isinstance(tasks, dict) else {t: t for t in tasks}
    parts = raw.get("parts") or {}
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise UserError(f"grid {path}: unknown parts {sorted(unknown)}; the design has "
                        f"{', '.join(PARTS)} (musketeers/design/experiment.py)")
    runs = []
    for part in DESIGN:
        if part.name not in parts:
            continue
        try:
            settings = PartSettings(**(parts[part.name] or {}))
        except TypeError as exc:
            raise UserError(f"grid {path}: part {part.name}: {exc}; a part takes seeds, "
                            "stage, tasks, only and set") from None
        seeds = settings.seeds
        if seeds not in ("all", "first") and not (is_int_list(seeds) and seeds):
            raise UserError(f"grid {path}: part {part.name}: seeds must be 'all', 'first' or "
                            f"a list of integers, got {seeds!r}; fix it there")
        runs += part_entries(part, settings, families)
    return runs
