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
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.note()
            self._stop.wait(self.interval_s)

    def note(self) -> None:
        # the label is read before the RSS: read after, a phase that ended meanwhile would hand
        # its peak to the next one (the sampler and the phases run on two threads)
        label = self.label
        now = rss_mib()
        with self._lock:
            if now > self.peaks.get(label, 0.0):
                self.peaks[label] = now

    @contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        self.note()
        self.label = name
        try:
            yield
        finally:
            self.note()
            self.label = "between"

    def __enter__(self) -> PhasePeaks:
        from musketeers.runtime.step_profile import observing

        self._observing = observing(self._phase)
        self._observing.__enter__()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._observing.__exit__(None, None, None)


def main(argv: list[str] | None = None) -> None:
    """``python -m musketeers.bench.memory [--set key=value …]``: one pocket ``single`` step
    (the TRL row's, ``trl_bench.run_single``) in this process on an items-only store, then its
    peak RSS by phase and the process's. A fresh process per figure: RSS only grows."""
    import argparse
    import json
    import resource
    import tempfile
    from pathlib import Path

    import yaml

    from musketeers.bench.trl_bench import regime, run_single, write_items_store

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a TrainConfig field for the step (e.g. loss_rows=0: one loss pass)")
    args = p.parse_args(argv)
    sets = {k: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in args.set)}
    r = regime("pocket")
    with tempfile.TemporaryDirectory() as tmp:
        write_items_store(Path(tmp) / "stores", r["task"], 64)
        out = run_single({"cache_dir": str(Path(tmp) / "stores"), "regime": r, "device": "cpu",
                          "policy": r["policy"], "reps": 1, "warmup": 0,
                          "run_dir": str(Path(tmp) / "run"), "set": sets})
    peaks = {k: round(v) for k, v in out["phase_peak_rss_mib"].items()}
    print(json.dumps({"set": sets, "loss_rows": sets.get("loss_rows", r.get("loss_rows", 0)),
                      "phase_peak_rss_mib": peaks,
                      "ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}))


if __name__ == "__main__":
    main()
