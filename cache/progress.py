"""Progress for long loops: a Rich bar on a terminal, periodic log lines otherwise.

Without a terminal Rich prints its bar once, at the end, so CI logs and ``nohup`` runs would
show nothing for hours; there we log items/s, tokens/s and the ETA every ``every_s`` seconds.

    with progress("expert smollm2", total=n, unit="items") as bar:
        bar.advance(len(batch), tokens=n_tokens)
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("musketeers.progress")


class _Tracker:
    def __init__(self, desc: str, total: int, unit: str, every_s: float, rich_bar) -> None:
        self.desc, self.total, self.unit, self.every_s = desc, total, unit, every_s
        self.done = 0
        self.tokens = 0
        self.start = self.last_log = time.monotonic()
        self._bar, self._task = rich_bar if rich_bar else (None, None)

    def rates(self) -> tuple[float, float, float]:
        """(items/s, tokens/s, ETA seconds) since the start."""
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        return rate, self.tokens / elapsed, eta

    def advance(self, n: int = 1, tokens: int = 0) -> None:
        self.done += n
        self.tokens += tokens
        if self._bar is not None:
            self._bar.update(self._task, advance=n)
            return
        now = time.monotonic()
        if now - self.last_log >= self.every_s or self.done >= self.total:
            self.last_log = now
            self.log_line()

    def log_line(self) -> None:
        rate, tok_rate, eta = self.rates()
        tok = f", {tok_rate:.0f} tokens/s" if self.tokens else ""
        log.info(
            "%s: %d/%d %s (%.2f %s/s%s, ETA %s)", self.desc, self.done, self.total, self.unit,
            rate, self.unit, tok, _fmt(eta),
        )


def _fmt(seconds: float) -> str:
    if seconds == float("inf"):
        return "?"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


@contextmanager
def progress(desc: str, total: int, unit: str = "items", every_s: float = 10.0,
             tty: bool | None = None) -> Iterator[_Tracker]:
    """Track ``total`` units of work; ``tty`` overrides terminal detection (tests)."""
    tty = sys.stderr.isatty() if tty is None else tty
    if not tty:
        yield _Tracker(desc, total, unit, every_s, None)
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task(desc, total=total)
        yield _Tracker(desc, total, unit, every_s, (bar, task))


def console():
    """A Rich console that does not squeeze tables into 80 columns when output is a file/pipe."""
    import sys

    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=160)
