"""A grid's measured wall time, phase by phase, kept across interrupted invocations.

A pocket grid takes a night and may be stopped and resumed several times, so its wall time
is not one process's lifetime. Every precompute, training and evaluation call of the grid
appends one JSON line (phase, name, seconds, whether it finished) to
``<runs_dir>/ledger-<budget>.jsonl``; the report sums them. Time spent in a call that failed
or was interrupted counts too: it was spent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

PHASES = ("precompute", "train", "eval")


def ledger_path(runs_dir: Path, budget: str) -> Path:
    return Path(runs_dir) / f"ledger-{budget}.jsonl"


@contextmanager
def timed(path: Path | None, phase: str, name: str) -> Iterator[None]:
    """Append the wall time of the block to the ledger at ``path`` (None: record nothing).
    An exception (or Ctrl-C) is recorded as ``ok: false`` and raised again."""
    if path is None:
        yield
        return
    start, ok = time.monotonic(), False
    try:
        yield
        ok = True
    finally:
        row = {"phase": phase, "name": name, "seconds": round(time.monotonic() - start, 3),
               "ok": ok, "ended": datetime.now().isoformat(timespec="seconds")}
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")


def totals(path: Path) -> dict[str, float]:
    """Seconds per phase and ``total`` over every line of the ledger, and ``finished``: the
    total of the calls that completed, i.e. what one uninterrupted invocation would have
    taken (less any part of an interrupted precompute its resumption did not redo). {} without
    a ledger; a torn last line (the process killed mid-write) is skipped."""
    if not path.is_file():
        return {}
    out = dict.fromkeys(PHASES, 0.0)
    finished = 0.0
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        out[row["phase"]] = out.get(row["phase"], 0.0) + float(row["seconds"])
        finished += float(row["seconds"]) if row.get("ok") else 0.0
    out["total"] = sum(out.values())
    out["finished"] = finished
    return out
