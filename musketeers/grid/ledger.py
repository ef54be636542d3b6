"""A grid's measured wall time, phase by phase, kept across interrupted invocations.

A pocket grid takes a night and may be stopped and resumed several times, so its wall time
is not one process's lifetime. Every precompute, training and evaluation call of the grid
appends one JSON line (phase, name, seconds, whether it finished) to
``<runs_dir>/ledger-<budget>.jsonl``; the report sums them. Time spent in a call that failed
or was interrupted counts too: it was spent. Time spent on a run that was later set aside
as stale (its settings changed) does not: the grid as it stands did not need it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

PHASES = ("precompute", "train", "eval")


def ledger_path(runs_dir: Path, grid_name: str) -> Path:
    """A grid's ledger, by the grid's name (its budget unless the YAML names it)."""
    return Path(runs_dir) / f"ledger-{grid_name}.jsonl"


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
        _append(path, phase, name, time.monotonic() - start, ok)


def discard(path: Path | None, run: str) -> None:
    """Mark every call recorded so far for ``run`` as discarded: the grid set the run aside
    as stale and runs it again, so its old calls are not part of the grid's wall time."""
    if path is not None:
        _append(path, "stale", run, 0.0, True)


def _append(path: Path, phase: str, name: str, seconds: float, ok: bool) -> None:
    row = {"phase": phase, "name": name, "seconds": round(seconds, 3), "ok": ok,
           "ended": datetime.now().isoformat(timespec="seconds")}
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


def totals(path: Path) -> dict[str, float]:
    """Seconds per phase and ``total`` over the ledger's calls, and ``finished``: the total of
    the calls that completed, i.e. what one uninterrupted invocation would have taken (less
    any part of an interrupted precompute its resumption did not redo). Calls of a run later
    set aside as stale (``discard``), and a store's precompute done again later (a new
    machine), count in ``discarded`` only. {} without a ledger; a torn
    last line (the process killed mid-write) is skipped."""
    if not path.is_file():
        return {}
    out = dict.fromkeys(PHASES, 0.0)
    finished = discarded = 0.0
    for row, _, stale in _calls(path):
        seconds = float(row["seconds"])
        if stale:
            discarded += seconds
            continue
        out[row["phase"]] = out.get(row["phase"], 0.0) + seconds
        finished += seconds if row.get("ok") else 0.0
    out["total"] = sum(out.values())
    out["finished"] = finished
    out["discarded"] = discarded
    return out


def run_seconds(path: Path) -> dict[str, float]:
    """Per grid run, the seconds of its training and evaluation calls that finished (what
    the run costs uninterrupted, loading included); runs set aside as stale are left out."""
    out: dict[str, float] = {}
    if not path.is_file():
        return out
    for row, run, stale in _calls(path):
        if not stale and row.get("ok") and row["phase"] in ("train", "eval"):
            out[run] = out.get(run, 0.0) + float(row["seconds"])
    return out


def precompute_name(task: str, experts: list[str], hints: bool) -> str:
    """A precompute call's name in the ledger: "<task>: <e1, e2>[ + hints]", or the router's
    ("<task>: router"); ``precompute_calls`` reads it back."""
    return f"{task}: {', '.join(experts) or 'router'}{' + hints' if hints else ''}"


def precompute_calls(path: Path) -> list[tuple[str, list[str], float]]:
    """(task, experts, seconds) of every precompute call, finished or not (an interrupted one
    keeps the experts it completed; its resumption computes the rest), a store's last
    computation only (a grid resumed on a machine without the stores computes them again)."""
    out = []
    if not path.is_file():
        return out
    for row, name, stale in _calls(path):
        if row["phase"] == "precompute" and not stale:
            task, _, what = name.partition(": ")  # precompute_name's
            experts = what.removesuffix(" + hints")
            out.append((task, [] if experts == "router" else experts.split(", "),
                        float(row["seconds"])))
    return out


def _calls(path: Path) -> Iterator[tuple[dict, str, bool]]:
    """Every call of the ledger, its run, and whether a later ``discard`` of that run made
    it stale. A torn line (the process killed mid-write) is skipped."""
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    last_discard = {row["name"]: i for i, row in enumerate(rows) if row["phase"] == "stale"}
    # Stores do not outlive a machine's lease everywhere, so a grid resumed elsewhere computes
    # the same store again: one uninterrupted invocation computes it once, the last time.
    last_store = {row["name"]: i for i, row in enumerate(rows)
                  if row["phase"] == "precompute" and row.get("ok")}
    for i, row in enumerate(rows):
        if row["phase"] == "precompute":
            yield row, row["name"], bool(row.get("ok")) and last_store.get(row["name"], -1) > i
        elif row["phase"] != "stale":
            run = row["name"].split("/")[0]  # eval calls are named run/file
            yield row, run, last_discard.get(run, -1) > i
