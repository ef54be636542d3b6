"""What a benchmark needs from its surroundings: machine facts, versions, timing, children.

Runs that need a clean peak RSS (training steps, TRL) happen in a child process
(``python -m musketeers.bench.worker``); the child reports its own ``ru_maxrss`` in a JSON line,
so one child's peak never hides another's.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from musketeers.runtime.machine import cpu_facts, physical_cores

log = logging.getLogger("musketeers.bench")

RESULT_TAG = "BENCH_RESULT "
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
PACKAGES = ("torch", "transformers", "peft", "trl", "zarr", "accelerate")


def set_threads() -> int:
    """torch threads = physical cores (hyper-threads only contend for the same FMA units)."""
    import torch

    n = physical_cores()
    torch.set_num_threads(n)
    return n


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in PACKAGES:
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def machine_info() -> dict[str, Any]:
    """A run's CPU facts (``runtime.machine.cpu_facts``), with what a benchmark adds: logical
    CPUs, memory and the GPU."""
    import torch

    return {**cpu_facts(), "logical_cpus": os.cpu_count(), "memory_gib": _mem_gib(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"}


def _mem_gib() -> float | None:
    try:
        import psutil

        return round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        return None


def peak_rss_mib() -> float:
    """This process's peak resident set size (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def repeat(fn: Callable[[], Any], reps: int, warmup: int = 0, label: str = "") -> list[float]:
    """Wall seconds of ``reps`` calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for r in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if label:
            log.info("%s: repetition %d/%d took %.2f s", label, r + 1, reps, times[-1])
    return times


def run_child(kind: str, params: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
    """Run ``musketeers.bench.worker`` in a fresh interpreter; its JSON result (or an error)."""
    cmd = [sys.executable, "-m", "musketeers.bench.worker", kind, json.dumps(params)]
    env = {**os.environ, **OFFLINE_ENV}
    log.info("child %s: %s", kind, json.dumps(params))
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{kind} child ran past {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"error": f"{kind} child exited {proc.returncode}: {tail[0][:300]}"}


def emit(result: dict[str, Any]) -> None:
    """A child's last word: its result as one tagged JSON line on stdout."""
    print(RESULT_TAG + json.dumps(result), flush=True)
