"""Ablation grids: a YAML file per budget lists runs; expand, skip finished runs, run the rest.

A grid entry is a mapping of TrainConfig fields. Any field given as a list is swept (the
cartesian product of all list-valued fields), and every entry is repeated over the grid's
seeds. Runs are named from their distinguishing fields, so the same run requested by two
entries (the default-team run feeds Table 1, Table 2, Figures 4–6) is run once, and a grid
that was interrupted resumes by running only what has no finished result.
"""

from __future__ import annotations

import itertools
import json
import logging
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, is_dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from musketeers import experiment, methods
from musketeers.cache.errors import UserError
from musketeers.reports.grid_yaml import check_grid, read_grid_yaml
from musketeers.reports.ledger import discard, timed
from musketeers.runlog import eval_files

log = logging.getLogger(__name__)

BUDGETS = ("smoke", "pocket", "paper")
# Order of the fields in a run's name.
NAME_FIELDS = ("task", "method", "team", "pooling", "latents")


def ignored(method: Any) -> tuple[str, ...]:
    """Config fields that change nothing ``method`` computes (the registry's ``ignores``):
    dropped from its run name, its table group and its staleness check. None for a name the
    registry does not know (an old run folder's), so such a run still reads, ungrouped."""
    spec = methods.REGISTRY.get(str(method))
    return spec.ignores if spec else ()


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

    def __post_init__(self) -> None:
        self.name = self.name or self.budget


@dataclass
class GridResult:
    trained: list[str] = field(default_factory=list)
    evaluated: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    stale: list[str] = field(default_factory=list)  # set aside and run again
    left: list[str] = field(default_factory=list)  # not started: past ``hours``


def grid_file(budget: str) -> Path:
    """The packaged grid YAML of a budget (musketeers/configs/ablations/<budget>.yaml)."""
    if budget not in BUDGETS:
        raise UserError(f"unknown budget {budget!r}; use --budget one of {', '.join(BUDGETS)}")
    return Path(str(resources.files("musketeers") / "configs" / "ablations" / f"{budget}.yaml"))


def run_name(budget: str, fields: dict[str, Any]) -> str:
    """Unique folder name ``<budget>-<task>-<method>[-team][-pooling][-mK]-s<seed>``."""
    skip = set(ignored(fields.get("method")))
    parts = [budget]
    for key in NAME_FIELDS:
        if key in skip or fields.get(key) is None:
            continue
        value = fields[key]
        parts.append(f"m{value}" if key == "latents" else str(value).replace(":", ""))
    parts.append(f"s{fields.get('seed', 0)}")
    return "-".join(parts)


def expand_entry(entry: dict[str, Any], seeds: Iterable[int]) -> list[dict[str, Any]]:
    """Every combination of the entry's list-valued fields, once per seed."""
    entry = dict(entry)
    entry.pop("eval_no_context", None)
    entry.pop("stage", None)
    entry_seeds = entry.pop("seeds", None)
    seeds = list(seeds)
    if entry_seeds == "first":  # a result that does not depend on the seed
        entry_seeds = seeds[:1]
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

    ``seeds`` replaces the grid's seeds, ``tasks`` keeps only those tasks' runs, and
    ``overrides`` (e.g. ``{"cache_dir": ...}``) is applied to every run last.
    """
    path = grid_file(str(source)) if str(source) in BUDGETS else Path(source)
    if not path.is_file():
        raise UserError(f"no grid file {path}; pass --budget one of {', '.join(BUDGETS)}")
    raw = read_grid_yaml(path)
    if "parts" in raw:  # an overlay on the experiment design, not a list of runs
        raw = {**raw, "runs": experiment.overlay_runs(raw, path)}
    check_grid(raw, path)
    budget = raw.get("budget", path.stem)
    defaults = dict(raw.get("defaults") or {})
    task_overrides = raw.get("task_overrides") or {}
    grid_seeds = seeds if seeds is not None else list(raw.get("seeds", [0]))
    runs: dict[str, GridRun] = {}
    for entry in raw.get("runs") or []:
        for fields in expand_entry(entry, grid_seeds):
            fields = {**defaults, **task_overrides.get(fields.get("task"), {}), **fields,
                      **(overrides or {})}
            if tasks is not None and fields.get("task") not in tasks:
                continue
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
        name=str(raw.get("name") or ""),  # Grid defaults it to the budget
    )


# ---------------------------------------------------------------- run status and execution


def is_finished(run_dir: Path) -> bool:
    """summary.json says done (or, lacking a status, covers every configured step)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    if "status" in summary:
        return summary["status"] == "done"
    try:
        steps = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("steps")
    except (OSError, yaml.YAMLError):
        return False
    return steps is not None and int(summary.get("steps") or 0) >= int(steps)


# TrainConfig fields a finished run may differ in from the grid and still be its run: where
# files live and what hardware ran it, not what was computed.
NOT_STALE = ("run_dir", "cache_dir", "device", "threads")


def stale_fields(run_dir: Path, cfg: Any) -> dict[str, tuple[Any, Any]]:
    """{field: (value in the run's config.yaml, value the grid would run now)} for every field
    that differs, outside NOT_STALE; {} for a folder without config.yaml. A changed default
    (e.g. where C enters the policy) makes every earlier run of that field stale."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return {}
    saved = yaml.safe_load(path.read_text()) or {}
    now = _plain(asdict(cfg) if is_dataclass(cfg) else dict(cfg))
    ignore = {*NOT_STALE, *ignored(now.get("method"))}
    return {k: (saved[k], now[k]) for k in sorted(saved.keys() & now.keys())
            if k not in ignore and saved[k] != now[k]}


def set_aside(runs_dir: Path, name: str, changed: dict[str, tuple[Any, Any]],
              ledger: Path | None) -> Path:
    """Move a stale run to ``<runs_dir>/stale/<name>.<time>`` (kept, out of the report) and
    mark its earlier calls in the ledger as discarded."""
    dest = runs_dir / "stale" / f"{name}.{time.strftime('%Y%m%d-%H%M%S')}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    (runs_dir / name).rename(dest)
    what = ", ".join(f"{k}: {old!r} → {new!r}" for k, (old, new) in changed.items())
    log.warning("run %s was made with other settings (%s): moved to %s; running it again",
                name, what, dest)
    discard(ledger, name)
    return dest


def of_final_checkpoint(run_dir: Path, name: str) -> bool:
    """Whether the evaluation ``name`` exists and graded the run's last step: an evaluation
    run while the run was still training graded an earlier checkpoint, and is redone."""
    try:
        ev = json.loads((run_dir / name).read_text())
        steps = int(json.loads((run_dir / "summary.json").read_text()).get("steps") or 0)
    except (OSError, ValueError, TypeError, AttributeError):
        return False
    checkpoint = ev.get("checkpoint") if isinstance(ev, dict) else None
    # evaluations from before the checkpoint was recorded are taken as they are
    return checkpoint is None or checkpoint == f"step-{steps:06d}"


def run_status(run_dir: Path, no_context: bool = False) -> str:
    """``done`` (trained and evaluated), ``trained`` (needs evaluation), ``failed``, ``missing``."""
    if is_finished(run_dir):
        evals = [eval_files(c)[0] for c in ((True, False) if no_context else (True,))]
        return "done" if all(of_final_checkpoint(run_dir, e) for e in evals) else "trained"
    if (run_dir / "error.txt").is_file():
        return "failed"
    return "missing"


def _default_config_fn(fields: dict[str, Any]) -> Any:
    from musketeers.config import resolve_config

    return resolve_config(overrides=fields)


def _default_train_fn(cfg: Any) -> Path:
    """Train, resuming an earlier, interrupted attempt (from step 0 if it saved no checkpoint)."""
    from musketeers.runfolder import has_run
    from musketeers.trainer import train

    run = cfg.run_path()
    train(cfg, resume=has_run(run))
    return run


def _default_eval_fn(run_dir: Path, limit: int | None, context: bool) -> dict:
    from musketeers.config import read_run_config
    from musketeers.evaluate import evaluate
    from musketeers.trainer import torch_threads

    with torch_threads(read_run_config(run_dir).threads):  # the run's own thread setting
        return evaluate(run_dir, limit=limit, no_context=not context)


def _record_failure(run_dir: Path, exc: BaseException, cfg: Any, fields: dict[str, Any]) -> str:
    """Write error.txt (one line, then the traceback) and, if the run died before writing its
    config, the config it was given, so the tables can still place the failure."""
    run_dir.mkdir(parents=True, exist_ok=True)
    line = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    (run_dir / "error.txt").write_text(line + "\n" + traceback.format_exc())
    if not (run_dir / "config.yaml").is_file():
        resolved = asdict(cfg) if is_dataclass(cfg) and not isinstance(cfg, type) else fields
        (run_dir / "config.yaml").write_text(yaml.safe_dump(_plain(resolved), sort_keys=False))
    return line


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _write_eval(run_dir: Path, name: str, result: dict) -> None:
    """Write what the evaluation returned over any earlier one (evaluate() writes the same
    result itself; a stale file of an earlier checkpoint must not survive)."""
    tmp = run_dir / f"{name}.tmp"
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(run_dir / name)


def run_grid(
    grid: Grid,
    runs_dir: Path,
    train_fn: Callable[[Any], Path] | None = None,
    eval_fn: Callable[[Path, int | None, bool], dict] | None = None,
    config_fn: Callable[[dict[str, Any]], Any] | None = None,
    ledger: Path | None = None,
    on_done: Callable[[GridRun, Path], None] | None = None,
    hours: float | None = None,
    on_stale: Callable[[str, Path], None] | None = None,
) -> GridResult:
    """Train and evaluate every run of ``grid`` that has no finished result under ``runs_dir``.

    A run folder whose saved config differs from the grid's (``stale_fields``) is set aside
    under ``runs_dir/stale`` and run again, so one table never mixes two settings.

    A run that raises is recorded (error.txt) and the grid goes on; a failed run is retried the
    next time the grid runs. The three callables default to the trainer, the evaluator and
    the TrainConfig loader; tests inject fakes. Each training and evaluation call's wall time
    goes to ``ledger`` (``musketeers.reports.ledger``). ``on_done(run, run_dir)`` is called
    as each run is finished and evaluated (``ablate`` publishes it there and then), and
    ``on_stale(name, kept)`` as a stale run is set aside to ``kept`` (``ablate`` sets its
    published copy aside too, so the published folder never mixes two settings either).

    ``hours`` bounds this invocation: a run is not started when it would end past it, judged
    by the longest run this invocation has finished (so the first always starts). What is
    left stays to do, for the same command to pick up; a session or a night that ends at a
    known time then stops between runs instead of losing one half-trained.
    """
    train_fn = train_fn or _default_train_fn
    eval_fn = eval_fn or _default_eval_fn
    config_fn = config_fn or _default_config_fn
    result = GridResult()
    todo = []
    for run in grid.runs:
        if (runs_dir / run.name / "config.yaml").is_file():
            changed = stale_fields(runs_dir / run.name,
                                   config_fn({**run.fields, "run_dir": str(runs_dir / run.name)}))
            if changed:
                result.stale.append(run.name)
                kept = set_aside(runs_dir, run.name, changed, ledger)
                if on_stale:
                    on_stale(run.name, kept)
        status = run_status(runs_dir / run.name, run.eval_no_context)
        if status == "done":
            result.skipped.append(run.name)
        else:
            todo.append((run, status))
    log.info("grid %s: %d runs, %d finished, %d to do", grid.budget, len(grid.runs),
             len(result.skipped), len(todo))
    start, longest = time.monotonic(), 0.0
    for i, (run, status) in enumerate(_progress(todo, f"ablate {grid.budget}")):
        elapsed = time.monotonic() - start
        if hours is not None and elapsed + longest > hours * 3600:
            result.left = [r.name for r, _ in todo[i:]]
            log.info("stopping after %.2f h: the next run (%s) would end past --hours %g "
                     "(the longest so far took %.0f min); %d runs left for the next "
                     "invocation", elapsed / 3600, run.name, hours, longest / 60,
                     len(result.left))
            break
        run_dir = runs_dir / run.name
        fields = {**run.fields, "run_dir": str(run_dir)}
        cfg: Any = None
        (run_dir / "error.txt").unlink(missing_ok=True)  # this attempt's outcome replaces it
        try:
            if status != "trained":
                cfg = config_fn(fields)
                with timed(ledger, "train", run.name):
                    run_dir = Path(train_fn(cfg))
                result.trained.append(run.name)
            for context in (True, False) if run.eval_no_context else (True,):
                out = eval_files(context)[0]
                # an evaluation run mid-training graded an earlier checkpoint: redo it
                if not of_final_checkpoint(run_dir, out):
                    with timed(ledger, "eval", f"{run.name}/{out}"):
                        result_ = eval_fn(run_dir, grid.eval_limit, context)
                    _write_eval(run_dir, out, result_)
            result.evaluated.append(run.name)
            longest = max(longest, time.monotonic() - start - elapsed)
            if on_done is not None:
                on_done(run, run_dir)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # noqa: BLE001 - one failed run must not stop the grid
            result.failed[run.name] = _record_failure(run_dir, exc, cfg, fields)
            log.warning("run %s failed: %s", run.name, result.failed[run.name])
    return result


def _progress(items: list, label: str) -> Iterable:
    """A Rich bar on a terminal; periodic log lines (runs/s, ETA) otherwise."""
    if sys.stderr.isatty():
        from rich.progress import track

        yield from track(items, description=label)
        return
    start = time.monotonic()
    for i, item in enumerate(items):
        if i:
            rate = i / (time.monotonic() - start)
            log.info("%s: %d/%d runs, %.3f runs/s, ETA %.0f s", label, i, len(items), rate,
                     (len(items) - i) / rate)
        yield item
    log.info("%s: %d/%d runs in %.0f s", label, len(items), len(items), time.monotonic() - start)
