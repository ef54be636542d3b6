"""Where a step's peak memory comes from: the resident set sampled while each phase runs.

``ru_maxrss`` gives one number for a whole process. ``PhasePeaks`` samples ``/proc/self/statm``
on a thread every few milliseconds and keeps the largest value seen inside each phase of
``runtime.step_profile.PhaseClock`` (sample, reference, forward, backward, optimizer), and
before the first one (the model's load). Torch's CPU allocator hands large blocks straight to
the OS, so a phase's peak RSS is what its tensors held, give or take glibc's caching.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_mib() -> float:
    """This process's resident set now (Linux), in MiB; 0 where /proc is absent."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * PAGE / 2**20
    except OSError:
        return 0.0


class PhasePeaks:
    """The largest RSS seen during each phase (``load`` until the first phase starts)."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.label = "load"
        self.peaks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.note()
            self._stop.wait(self.interval_s)

    def note(self) -> None:
        now = rss_mib()
        if now > self.peaks.get(self.label, 0.0):
            self.peaks[self.label] = now

    def __enter__(self) -> PhasePeaks:
        from musketeers.runtime import step_profile

        original = step_profile.PhaseClock.phase
        peaks = self

        @contextmanager
        def phase(clock: Any, name: str) -> Iterator[None]:
            peaks.note()
            peaks.label = name
            try:
                with original(clock, name):
                    yield
            finally:
                peaks.note()
                peaks.label = "between"

        self._original = original
        step_profile.PhaseClock.phase = phase  # type: ignore[method-assign]
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        from musketeers.runtime import step_profile

        self._stop.set()
        self._thread.join()
        step_profile.PhaseClock.phase = self._original  # type: ignore[method-assign]
