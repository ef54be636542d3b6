"""This machine's matmul ceiling: the FLOP/s every other figure is a fraction of."""

from __future__ import annotations

import time

import torch

from musketeers.bench.machine import median


def matmul_flops(n: int, dtype: torch.dtype, device: str = "cpu", reps: int = 3,
                 min_seconds: float = 0.5) -> list[float]:
    """FLOP/s of ``n × n @ n × n`` (2·n³ FLOP each), one figure per repetition.

    Each repetition loops until ``min_seconds`` have passed so a fast device is not timed on
    a single call; the first call (allocation, kernel choice) is untimed.
    """
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.matmul(a, b, out=out)
    sync()
    rates = []
    for _ in range(reps):
        k, t0 = 0, time.perf_counter()
        while True:
            torch.matmul(a, b, out=out)
            k += 1
            sync()
            elapsed = time.perf_counter() - t0
            if elapsed >= min_seconds:
                break
        rates.append(2 * n**3 * k / elapsed)
    return rates


def ceilings(device: str = "cpu", n: int = 2048, reps: int = 3) -> dict[str, list[float]]:
    """{"bf16": [FLOP/s per rep], "fp32": [...]} on ``device``."""
    min_s = 0.5 if device == "cpu" else 0.2
    return {name: matmul_flops(n, dt, device, reps, min_s)
            for name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32))}


if __name__ == "__main__":
    from musketeers.bench.machine import set_threads

    set_threads()
    for k, v in ceilings().items():
        print(k, f"{median(v) / 1e9:.0f} GFLOP/s", [f"{x / 1e9:.0f}" for x in v])
