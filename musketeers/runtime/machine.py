"""The machine a process runs on, in the facts that change its numbers or its speed: the CPU
model, whether it computes bf16 natively (avx512_bf16, AMX), its cores and torch's threads.

A grid's runs are trained on whatever machine a night lends, so each run records these facts
beside its artefacts (``inputs.json``) and the benchmarks print them with every figure.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def physical_cores() -> int:
    try:
        import psutil

        return psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:
        return os.cpu_count() or 1


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_facts() -> dict[str, Any]:
    """What a run records of its CPU: model, native bf16 (avx512_bf16, amx_bf16), physical
    cores and the torch threads it computes with."""
    import torch

    flags = cpu_flags()
    return {"cpu": cpu_model(), "avx512_bf16": "avx512_bf16" in flags,
            "amx_bf16": "amx_bf16" in flags, "physical_cores": physical_cores(),
            "threads": torch.get_num_threads()}
