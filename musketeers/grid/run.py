"""Run a grid: train and evaluate every run that has no finished result, resumable, each
call's wall time in the ledger, a stale run set aside and run again."""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from musketeers.cache.untrusted import confine
from musketeers.design.gridspec import Grid, GridRun
from musketeers.grid.ledger import timed
from musketeers.grid.status import (
    of_final_checkpoint,
    plain,
    run_status,
    set_aside,
    stale_fields,
)
from musketeers.run.runlog import eval_files

log = logging.getLogger(__name__)


@dataclass
class GridResult:
    trained: list[str] = field(default_factory=list)
    evaluated: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    stale: list[str] = field(default_factory=list)  # set aside and run again
    left: list[str] = field(default_factory=list)  # not started: past ``hours``


def _default_config_fn(fields: dict[str, Any]) -> Any:
    from musketeers.config import resolve_config

    return resolve_config(overrides=fields)


def _default_train_fn(cfg: Any) -> Path:
    """Train, resuming an earlier, interrupted attempt (from step 0 if it saved no checkpoint)."""
    from musketeers.run.runfolder import has_run
    from musketeers.run.trainer import train

    run = cfg.run_path()
    train(cfg, resume=has_run(run))
    return run


def _default_eval_fn(run_dir: Path, limit: int | None, context: bool) -> dict:
    from musketeers.config import read_run_config
    from musketeers.run.evaluate import evaluate
    from musketeers.run.launch import torch_threads

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
        (run_dir / "config.yaml").write_text(yaml.safe_dump(plain(resolved), sort_keys=False))
    return line


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
    goes to ``ledger`` (``musketeers.grid.ledger``). ``on_done(run, run_dir)`` is called
    as each run is finished and evaluated (``ablate`` publishes it there and then), and
    ``on_stale(name, kept)`` as a stale run is set aside to ``kept`` (``ablate`` sets its
    published copy aside too, so the published folder never mixes two settings either).

    ``hours`` bounds this invocation: a run is not started when it would end past it, judged
    by the longest run this invocation has finished (so the first always starts). What is
    left stays to do, for the same command to pick up; a night or a machine lease that ends
    at a known time then stops between runs instead of losing one half-trained.
    """
    train_fn = train_fn or _default_train_fn
    eval_fn = eval_fn or _default_eval_fn
    config_fn = config_fn or _default_config_fn
    result = GridResult()
    todo = []
    for run in grid.runs:
        # a run folder that is a symlink out of --runs-dir would take every write with it
        confine(runs_dir / run.name, runs_dir, what=f"run folder of {run.name}")
        if (runs_dir / run.name / "config.yaml").is_file():
            changed = stale_fields(runs_dir / run.name,
                                   config_fn({**run.fields, "run_dir": str(runs_dir / run.name)}))
            if changed:
                result.stale.append(run.name)
                kept = set_aside(runs_dir, run.name, changed, ledger)
                if on_stale:
                    on_stale(run.name, kept)
        status = run_status(runs_dir / run.name, run.eval_no_context, grid.eval_limit)
        if status == "done":
            result.skipped.append(run.name)
        else:
            if status != "trained":  # a value the config refuses: one line, nothing written
                config_fn({**run.fields, "run_dir": str(runs_dir / run.name)})
            todo.append((run, status))
    log.info("grid %s: %d runs, %d finished, %d to do", grid.name, len(grid.runs),
             len(result.skipped), len(todo))
    start, longest = time.monotonic(), 0.0
    for i, (run, status) in enumerate(_progress(todo, f"ablate {grid.name}")):
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
                # or at another size (an `eval --limit` by hand), or torn from its samples
                if not of_final_checkpoint(run_dir, out, grid.eval_limit):
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
