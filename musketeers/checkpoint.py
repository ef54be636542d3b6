"""Checkpoints of a run: everything needed to continue it bit for bit.

``runs/<name>/checkpoints/step-000050/`` holds

- ``lora/``                the policy's LoRA in PEFT's own format (``save_pretrained``)
- ``adapter.safetensors``  the adapter φ (absent for methods without one)
- ``state.pt``             optimizer, scheduler, step and every RNG state (python, numpy,
                           torch, the run's sampling generator)

A checkpoint is written into a temporary folder and renamed into place, and only folders named
``step-*`` count: a kill at any moment of a save leaves the previous checkpoint usable.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

KEEP = 2  # checkpoints kept; older ones are removed after a newer one is in place
PREFIX = "step-"


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def capture_rng(generator: torch.Generator) -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "generator": generator.get_state(),
    }


def restore_rng(state: dict[str, Any], generator: torch.Generator) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    generator.set_state(state["generator"])


def _write_lora(model: torch.nn.Module, folder: Path) -> None:
    # PeftModel.save_pretrained writes only the adapter weights and its config.
    model.save_pretrained(str(folder))


def _write_state(state: dict[str, Any], path: Path) -> None:
    torch.save(state, path)


def _fsync_tree(folder: Path) -> None:
    for f in folder.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())


def save_checkpoint(run_dir: Path, step: int, model: torch.nn.Module,
                    adapter: torch.nn.Module | None, optimizer: torch.optim.Optimizer,
                    scheduler: Any, generator: torch.Generator,
                    extra: dict[str, Any] | None = None) -> Path:
    """Write the checkpoint after ``step`` steps atomically; returns its folder."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:06d}"
    tmp = root / f".tmp-{PREFIX}{step:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    _write_lora(model, tmp / "lora")
    if adapter is not None:
        save_file({k: v.detach().contiguous() for k, v in adapter.state_dict().items()},
                  str(tmp / "adapter.safetensors"))
    state = {
        "step": step,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": capture_rng(generator),
        "extra": extra or {},
    }
    _write_state(state, tmp / "state.pt")
    _fsync_tree(tmp)
    if final.exists():  # re-saving a step after a resume: the older copy is equivalent
        shutil.rmtree(final)
    os.replace(tmp, final)
    _prune(root)
    return final


def _prune(root: Path) -> None:
    done = list_checkpoints(root.parent)
    for old in done[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    for tmp in root.glob(f".tmp-{PREFIX}*"):  # leftovers of killed saves
        shutil.rmtree(tmp, ignore_errors=True)


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)
             and p.name[len(PREFIX):].isdigit() and (p / "state.pt").is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def load_weights(folder: Path, model: torch.nn.Module, adapter: torch.nn.Module | None) -> None:
    """LoRA (PEFT format) and adapter φ from a checkpoint into live modules."""
    from peft import set_peft_model_state_dict

    lora = load_file(str(Path(folder) / "lora" / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(model, lora)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise RuntimeError(f"checkpoint {folder} has LoRA keys the policy lacks: {unexpected[:3]}")
    if adapter is not None:
        adapter.load_state_dict(load_file(str(Path(folder) / "adapter.safetensors")))


def load_checkpoint(folder: Path, model: torch.nn.Module, adapter: torch.nn.Module | None,
                    optimizer: torch.optim.Optimizer, scheduler: Any,
                    generator: torch.Generator) -> dict[str, Any]:
    """Restore everything ``save_checkpoint`` wrote; returns the state dict (``step``...)."""
    load_weights(folder, model, adapter)
    state = torch.load(Path(folder) / "state.pt", weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    restore_rng(state["rng"], generator)
    return state
