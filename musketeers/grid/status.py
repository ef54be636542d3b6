"""A grid run's state on disk: finished, evaluated at its last step, failed, or stale (made
with other settings than the grid's), and what is done with a stale one."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from musketeers.config import NOT_COMPUTED
from musketeers.grid.ledger import discard
from musketeers.method.methods import ignored
from musketeers.run.runfolder import is_finished
from musketeers.run.runlog import eval_files

log = logging.getLogger(__name__)

# TrainConfig fields a finished run may differ in from the grid and still be its run: where
# files live and how the hardware ran it (each prompt samples alike in any decode batch), not
# what was computed.
NOT_STALE = NOT_COMPUTED


def stale_fields(run_dir: Path, cfg: Any) -> dict[str, tuple[Any, Any]]:
    """{field: (value in the run's config.yaml, value the grid would run now)} for every field
    that differs, outside NOT_STALE; {} for a folder without config.yaml. A changed default
    (e.g. where C enters the policy) makes every earlier run of that field stale."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return {}
    saved = yaml.safe_load(path.read_text()) or {}
    now = plain(asdict(cfg) if is_dataclass(cfg) else dict(cfg))
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


def of_final_checkpoint(run_dir: Path, name: str, limit: int | None = None) -> bool:
    """Whether the evaluation ``name`` exists, is whole (``eval_sound``) and graded the run's
    last step: an evaluation run while the run was still training graded an earlier
    checkpoint, and is redone."""
    try:
        ev = json.loads((run_dir / name).read_text())
        steps = int(json.loads((run_dir / "summary.json").read_text()).get("steps") or 0)
    except (OSError, ValueError, TypeError, AttributeError):
        return False
    checkpoint = ev.get("checkpoint") if isinstance(ev, dict) else None
    # evaluations from before the checkpoint was recorded are taken as they are
    return (checkpoint is None or checkpoint == f"step-{steps:06d}") and \
        eval_sound(run_dir, name, limit)


def eval_sound(run_dir: Path, name: str, limit: int | None = None) -> bool:
    """Whether the evaluation ``name`` is of the grid's size and agrees with its samples: its
    ``limit`` is the grid's ``eval_limit`` (None: the run's own; an ``eval --limit 2`` by hand
    is not a cell of the grid) and its ``samples_sha256`` is its samples file's (a kill
    between writing the two leaves a pair that disagrees). Evaluations from before these were
    recorded are taken as they are."""
    try:
        ev = json.loads((run_dir / name).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(ev, dict):
        return False
    if "limit" in ev and ev["limit"] != _grid_limit(run_dir, limit):
        return False
    if "samples_sha256" in ev:
        samples = run_dir / dict((eval_files(True), eval_files(False)))[name]
        try:
            return hashlib.sha256(samples.read_bytes()).hexdigest() == ev["samples_sha256"]
        except OSError:
            return False
    return True


def _grid_limit(run_dir: Path, limit: int | None) -> int | None:
    """The evaluation size the grid asks of a run: its ``eval_limit``, else the run's own."""
    if limit is not None:
        return limit
    try:
        return (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("eval_limit")
    except (OSError, yaml.YAMLError, AttributeError):
        return None


def run_status(run_dir: Path, no_context: bool = False, limit: int | None = None) -> str:
    """``done`` (trained and evaluated at the grid's size ``limit``), ``trained`` (needs
    evaluation), ``failed``, ``missing``."""
    if is_finished(run_dir):
        evals = [eval_files(c)[0] for c in ((True, False) if no_context else (True,))]
        return "done" if all(of_final_checkpoint(run_dir, e, limit) for e in evals) \
            else "trained"
    if (run_dir / "error.txt").is_file():
        return "failed"
    return "missing"


def plain(obj: Any) -> Any:
    """``obj`` as YAML writes it: mappings, lists and strings (a Path as its text)."""
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj
