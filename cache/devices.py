"""Which device and dtype a precompute runs on: checked before anything is created."""

from __future__ import annotations

from pathlib import Path

import torch

from musketeers.cache.errors import UserError


def cpu_has_bf16() -> bool:
    """bf16 pays off on CPUs with native bf16 dot products (avx512_bf16 or AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but no CUDA device is available; use --device cpu")
    if device not in ("cpu", "cuda"):
        raise UserError(f"unknown device {device!r}; use auto, cpu or cuda")
    return device


# torch's names, as `train --dtype` takes them (musketeers.config_checks.DTYPES), so one grid
# file can name one dtype for both halves; the short names are kept for scripts written before.
DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
               "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def dtype_name(dtype: torch.dtype) -> str:
    """The name ``resolve_dtype`` takes for ``dtype`` (torch.float32 -> "float32")."""
    return str(dtype).removeprefix("torch.")


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":  # bf16 only where it is native: CUDA, or a CPU with bf16 dot products
        fast = device.startswith("cuda") or cpu_has_bf16()
        return torch.bfloat16 if fast else torch.float32
    if dtype not in DTYPE_NAMES:
        raise UserError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16")
    return DTYPE_NAMES[dtype]
