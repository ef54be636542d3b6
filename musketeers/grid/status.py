"""A grid run's state on disk: finished, evaluated at its last step, failed, or stale (made
with other settings than the grid's), and what is done with a stale one."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from musketeers.grid.ledger import discard
from musketeers.method.methods import ignored
from musketeers.run.runfolder import is_finished
from musketeers.run.runlog import eval_files

log = logging.getLogger(__name__)

# TrainConfig fields a finished run may differ in from the grid and still be its run: where
# files live and how the hardware ran it (each prompt samples alike in any decode batch), not
# what was computed.
NOT_STALE = ("run_dir", "cache_dir", "device", "threads", "decode_prompts", "decode_graphs",
             "prepack_decode")


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


def plain(obj: Any) -> Any:
    """``obj`` as YAML writes it: mappings, lists and strings (a Path as its text)."""
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj
