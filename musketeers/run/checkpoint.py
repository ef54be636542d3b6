"""Checkpoints of a run: everything needed to continue it bit for bit.

``runs/<name>/checkpoints/step-000050/`` holds

- ``lora/``                the policy's LoRA in PEFT's own format (``save_pretrained``)
- ``adapter.safetensors``  the adapter φ (absent for methods without one)
- ``state.json``, ``state.safetensors``  optimizer, scheduler, step and every RNG state
                           (python, numpy, torch, CUDA when initialised, the run's sampling
                           generator): JSON and tensors, never pickle (``state_file``)
- ``manifest.json``        sha256 of every other file, signed with the user's key
                           (``signing``: HMAC-SHA256), written last

A checkpoint is written into a temporary folder and renamed into place, and only folders named
``step-*`` count: a kill at any moment of a save leaves the previous checkpoint usable. A load
checks the manifest first, so a flipped, truncated or replaced file is found before anything is
applied; ``load_latest`` then falls back to the newest intact checkpoint and moves the damaged
ones aside. A checkpoint without a manifest, or signed with another key (another user's, another
machine's), loads only when asked (``--resume-unverified``); its files are still only tensors and
JSON, so reading them runs no code.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from musketeers.cache.errors import UserError
from musketeers.cache.experts import file_sha256
from musketeers.run import signing, state_file

KEEP = 2  # checkpoints kept; older ones are removed after a newer one is in place
PREFIX = "step-"
MANIFEST = "manifest.json"
PICKLED = "state.pt"  # the old format's state: a pickle, never loaded (it can run code)
UNVERIFIED = "--resume-unverified"
LORA_FILE = "lora/adapter_model.safetensors"
DAMAGED = "damaged-"  # a damaged checkpoint's new name prefix: kept for a look, never loaded

log = logging.getLogger("musketeers.train")


class DamagedCheckpoint(Exception):
    """A checkpoint whose files do not match its manifest, or cannot be read."""


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def capture_rng(generator: torch.Generator) -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "generator": generator.get_state(),
        # hard routing draws its Gumbel noise on the adapter's device; querying CUDA only once
        # it is initialised keeps a CPU run from initialising it
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
    }


def restore_rng(state: dict[str, Any], generator: torch.Generator) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    generator.set_state(state["generator"])
    cuda = state.get("cuda")  # absent in checkpoints from before it was saved
    if cuda is not None:
        if torch.cuda.is_available() and torch.cuda.device_count() >= len(cuda):
            torch.cuda.set_rng_state_all(cuda)
        else:  # resumed with --device cpu (allowed): the GPU's stream has no meaning here
            log.warning("checkpoint has CUDA RNG states but CUDA is unavailable; "
                        "the resumed run is not bit-identical to an uninterrupted one")


def _write_lora(model: torch.nn.Module, folder: Path) -> None:
    # PeftModel.save_pretrained writes only the adapter weights and its config.
    model.save_pretrained(str(folder))


def _write_state(state: dict[str, Any], folder: Path) -> None:
    state_file.write_state(state, folder)


def _files(folder: Path) -> list[Path]:
    return sorted(f for f in folder.rglob("*") if f.is_file() and f.name != MANIFEST
                  and not f.name.startswith(f".{MANIFEST}"))


def write_manifest(folder: Path) -> None:
    """sha256 of every file of the checkpoint, signed, written last and atomically."""
    sums = {f.relative_to(folder).as_posix(): file_sha256(f) for f in _files(folder)}
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps({"files": sums, "hmac": signing.sign(sums)}, indent=1,
                              sort_keys=True))
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, folder / MANIFEST)


def verify_checkpoint(folder: Path, unverified: bool = False, flag: str = UNVERIFIED
                      ) -> str | None:
    """What is wrong with the checkpoint's files (None when they match its signed manifest).

    ``unverified`` (the user's ``flag``: train's ``--resume-unverified``, eval's
    ``--unverified``) accepts a checkpoint whose manifest is missing or signed with another
    key, with a warning; its files are checked for what they are (tensors and JSON) when read.
    """
    path = Path(folder) / MANIFEST
    if (Path(folder) / PICKLED).exists():
        return (f"{PICKLED} is a pickle (the old format), which is never loaded: it can run "
                "code; move the folder away to restart the run from step 0")
    if not path.exists():
        if unverified:
            log.warning("checkpoint %s has no %s; loading it unverified (%s)", folder, MANIFEST,
                        flag)
            return None
        return f"it has no {MANIFEST}; if you wrote it yourself, pass {flag} to load it unverified"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return f"{MANIFEST} is unreadable"
    sums = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(sums, dict) or not all(isinstance(v, str) for v in sums.values()):
        return f"{MANIFEST} is not a signed mapping of sums"
    if not signing.signed(sums, manifest.get("hmac")):
        if not unverified:
            return (f"{MANIFEST} is not signed with your key ({signing.key_path()}); if you "
                    f"trust the checkpoint, pass {flag}")
        log.warning("checkpoint %s: %s is not signed with your key; loading it unverified (%s)",
                    folder, MANIFEST, flag)
    for rel, digest in sums.items():
        path = Path(folder) / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute() or not path.is_file():
            return f"{rel} is missing"
        if file_sha256(path) != digest:
            return f"{rel} does not match its checksum"
    extra = {f.relative_to(folder).as_posix() for f in _files(Path(folder))} - set(sums)
    if extra & {state_file.JSON, state_file.TENSORS, "adapter.safetensors", LORA_FILE}:
        return f"{sorted(extra)[0]} is not in the manifest"
    return None


def _fsync_tree(folder: Path) -> None:
    for f in folder.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())


def save_checkpoint(run_dir: Path, step: int, model: torch.nn.Module,
                    adapter: torch.nn.Module | None, optimizer: torch.optim.Optimizer,
                    scheduler: Any, generator: torch.Generator,
                    extra: dict[str, Any] | None = None) -> Path:
    """Write the checkpoint after ``step`` steps atomically; returns its folder. Weights that
    are not finite are never written as a good checkpoint: every resume would start from them."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if adapter is not None:
        trainable += [(f"adapter.{n}", p) for n, p in adapter.named_parameters()]
    bad = next((n for n, p in trainable if not torch.isfinite(p.detach()).all()), None)
    if bad is not None:
        raise UserError(f"step {step}: {bad} is not finite; the checkpoint is not written and "
                        f"the last good one in {checkpoint_dir(run_dir)} is kept")
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
    _write_state(state, tmp)
    _fsync_tree(tmp)
    write_manifest(tmp)
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
             and p.name[len(PREFIX):].isdigit()
             and ((p / state_file.JSON).is_file() or (p / PICKLED).is_file())]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def _read(rel: str, what: Any) -> Any:
    """``what()``, any failure of it a DamagedCheckpoint naming ``rel``."""
    try:
        return what()
    except Exception as exc:  # noqa: BLE001 - any unreadable file means "damaged"
        why = (str(exc).splitlines() or [""])[0][:160]
        raise DamagedCheckpoint(f"{rel} is unreadable ({type(exc).__name__}: {why})") from None


def _read_weights(folder: Path, with_adapter: bool
                  ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
    lora_file, adapter_file = Path(folder) / LORA_FILE, Path(folder) / "adapter.safetensors"
    lora = _read(LORA_FILE, lambda: load_file(str(lora_file)))
    adapter = (_read(adapter_file.name, lambda: load_file(str(adapter_file)))
               if with_adapter else None)
    return lora, adapter


def _shape_damage(name: str, saved: dict[str, torch.Tensor],
                  live: dict[str, torch.Tensor]) -> str | None:
    """What keeps ``saved`` from loading into modules whose state is ``live``."""
    if set(saved) != set(live):
        odd = sorted(set(saved) ^ set(live))
        return f"{name} holds other tensors than the run's ({odd[0]})"
    bad = next((k for k in live if saved[k].shape != live[k].shape), None)
    if bad is not None:
        return (f"{name}: {bad} has shape {tuple(saved[bad].shape)}, the run's is "
                f"{tuple(live[bad].shape)}")
    return None


def _check_weights(model: torch.nn.Module, adapter: torch.nn.Module | None,
                   lora: dict[str, torch.Tensor],
                   adapter_state: dict[str, torch.Tensor] | None) -> None:
    """DamagedCheckpoint, before anything is applied, when the weights do not fit the run."""
    from peft import get_peft_model_state_dict

    damage = _shape_damage(LORA_FILE, lora,
                           get_peft_model_state_dict(model))
    if damage is None and adapter is not None and adapter_state is not None:
        damage = _shape_damage("adapter.safetensors", adapter_state, adapter.state_dict())
    if damage is not None:
        raise DamagedCheckpoint(damage)


def _apply_weights(model: torch.nn.Module, adapter: torch.nn.Module | None,
                   lora: dict[str, torch.Tensor],
                   adapter_state: dict[str, torch.Tensor] | None) -> None:
    from peft import set_peft_model_state_dict

    _check_weights(model, adapter, lora, adapter_state)
    set_peft_model_state_dict(model, lora)
    if adapter is not None and adapter_state is not None:
        adapter.load_state_dict(adapter_state)


def load_weights(folder: Path, model: torch.nn.Module, adapter: torch.nn.Module | None) -> None:
    """LoRA (PEFT format) and adapter φ from a checkpoint into live modules; DamagedCheckpoint
    when a file is unreadable or does not fit the modules (nothing applied then)."""
    lora, adapter_state = _read_weights(folder, adapter is not None)
    _apply_weights(model, adapter, lora, adapter_state)


def load_checkpoint(folder: Path, model: torch.nn.Module, adapter: torch.nn.Module | None,
                    optimizer: torch.optim.Optimizer, scheduler: Any,
                    generator: torch.Generator, unverified: bool = False) -> dict[str, Any]:
    """Restore everything ``save_checkpoint`` wrote; returns the state dict (``step``...).

    DamagedCheckpoint when the manifest disagrees or a file is unreadable or does not fit the
    run: every file is checked, read and its weights' shapes compared before any module is
    touched (a state that fails to apply after that is reported as damaged too).
    """
    problem = verify_checkpoint(folder, unverified)
    if problem is not None:
        raise DamagedCheckpoint(problem)
    lora, adapter_state = _read_weights(folder, adapter is not None)
    state = _read(state_file.JSON, lambda: state_file.read_state(folder))
    _apply_weights(model, adapter, lora, adapter_state)

    def apply() -> None:
        optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None and state["scheduler"] is not None:
            scheduler.load_state_dict(state["scheduler"])
        restore_rng(state["rng"], generator)
        if not isinstance(state["step"], int):
            raise TypeError("step is not an integer")

    _read(f"{state_file.JSON} (its contents)", apply)
    return state


def _aside_name(folder: Path) -> Path:
    """``damaged-<name>``, numbered when that step was damaged and moved aside before."""
    dest, n = folder.with_name(DAMAGED + folder.name), 1
    while dest.exists():
        n += 1
        dest = folder.with_name(f"{DAMAGED}{folder.name}.{n}")
    return dest


def load_latest(run_dir: Path, model: torch.nn.Module, adapter: torch.nn.Module | None,
                optimizer: torch.optim.Optimizer, scheduler: Any,
                generator: torch.Generator, unverified: bool = False) -> dict[str, Any] | None:
    """Load the newest intact checkpoint, moving damaged newer ones aside (and saying so);
    None when the run has no checkpoint. UserError when none of them is intact."""
    from musketeers.cache.errors import UserError

    found = list_checkpoints(run_dir)
    damaged = []
    for folder in reversed(found):
        try:
            state = load_checkpoint(folder, model, adapter, optimizer, scheduler, generator,
                                    unverified)
        except DamagedCheckpoint as exc:
            damaged.append(f"{folder.name}: {exc}")
            log.warning("checkpoint %s is damaged (%s); trying the previous one", folder, exc)
            continue
        for bad in found[found.index(folder) + 1:]:
            # renamed, not deleted: the next save must not prune the intact one in their favour
            bad.rename(_aside_name(bad))
        if damaged:
            log.warning("resuming from %s, the newest intact checkpoint; damaged ones renamed "
                        "%s*", folder, DAMAGED)
        return state
    if damaged:
        raise UserError(f"no intact checkpoint in {checkpoint_dir(run_dir)} ("
                        + "; ".join(damaged) + "); move that folder away to restart the run "
                        "from step 0, or pass another --run-dir")
    return None
