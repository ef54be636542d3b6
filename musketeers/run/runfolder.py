"""A run folder's bookkeeping: its writer lock, the stores it started on, start or resume.

``runs/<name>/`` is written by one training at a time: ``train`` holds ``runs/<name>.lock`` (the
store's lock helper, so a killed run never leaves a stale lock) for the whole run. A fresh run
records the fingerprints of what it reads (the train split's items, each expert's, on a token
channel each expert's token unit's, and for hard routing the router's) in
``fingerprints.json``; ``--resume`` compares them with the store it is given and refuses
another, so ``--cache-dir`` may move a store but never swap it. It also
records the sha256 of its resolved config (``config_digest.json``, what is computed:
NOT_COMPUTED aside); ``--resume`` and ``eval`` refuse a ``config.yaml`` edited since, whose lr
or steps would disagree with ``metrics.jsonl``.

The start / resume decision, made before any model loads:

* no run in the folder: start; ``--resume`` is refused (nothing to resume);
* a run in the folder: ``--resume`` continues it from its newest intact checkpoint, or, when it
  was killed before its first checkpoint, restarts it in place from step 0 (and says so);
  without ``--resume`` it is refused, naming ``--resume``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
import zarr
from safetensors import SafetensorError

from musketeers.cache import layout, token_layout
from musketeers.cache.errors import UserError
from musketeers.cache.store import Lock, lock_path, store_path
from musketeers.config import (
    TrainConfig,
    config_digest,
    read_run_config,
    resume_command,
    save_config,
)
from musketeers.method import methods
from musketeers.method.methods import Method
from musketeers.run import checkpoint as ckpt
from musketeers.run.runlog import read_metrics, summarize, truncate_metrics
from musketeers.run.team import expert_names_for

if TYPE_CHECKING:  # types only: launch opens the run folder through this module
    import torch

    from musketeers.run.launch import Launch

log = logging.getLogger("musketeers.train")

FINGERPRINTS = "fingerprints.json"
CONFIG_DIGEST = "config_digest.json"
SPLIT = "train"  # what training reads; eval's val split is checked by its own reader


def check_run_dir(run: Path) -> None:
    """Refuse a run folder that cannot be one, before anything loads or is created."""
    try:
        is_file = run.exists() and not run.is_dir()
        existing = next(p for p in (run, *run.parents) if p.exists())
    except OSError as exc:  # a name past NAME_MAX, a path past PATH_MAX
        raise UserError(f"run dir {run} cannot be used ({exc.strerror}); pass a shorter "
                        "--run-dir") from None
    if is_file:
        raise UserError(f"run dir {run} is a file; pass a folder with --run-dir")
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"run dir {run} cannot be created under {existing} (not a writable "
                        "folder); pass another --run-dir")
    resolved = run.resolve()
    store = next((p for p in (resolved, *resolved.parents)
                  if p.suffix == ".zarr" or (p / "zarr.json").is_file()), None)
    if store is not None:  # a run's files inside a store would read as its damage
        raise UserError(f"run dir {run} is inside the store {store}; pass a --run-dir outside "
                        "the stores")
    if has_run(run):
        return
    if resolved == Path.cwd().resolve() or resolved in Path.cwd().resolve().parents:
        raise UserError(f"run dir {run} is the working folder (or holds it); pass a new folder "
                        "with --run-dir, e.g. runs/NAME")
    if run.is_dir() and any(run.iterdir()):  # another's files: a run would write over them
        raise UserError(f"run dir {run} holds files and no run; pass an empty or new "
                        "--run-dir")


@contextlib.contextmanager
def locked(run: Path) -> Iterator[None]:
    """Hold the run folder's writer lock; UserError naming the holder's PID if it is taken."""
    check_run_dir(run)
    busy = (f"run folder {run} is being trained by another process (PID {{pid}}); wait for it "
            "to finish or pass another --run-dir")
    with disk_errors(run):
        run.parent.mkdir(parents=True, exist_ok=True)
    # keyed by the folder's resolved path: a symlink to a run folder is that run folder
    with Lock(lock_path(run.resolve()), busy=busy):
        yield


@contextlib.contextmanager
def disk_errors(run: Path) -> Iterator[None]:
    """A failed write (torch.save reports a full disk as RuntimeError 'unexpected pos') becomes
    the one-line fix; the run's last checkpoint is intact, so --resume continues it."""
    try:
        yield
    except (OSError, RuntimeError, SafetensorError) as exc:  # safetensors' own error type
        why = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UserError(f"disk full or unwritable: writing {run} failed ({why}); free space and "
                        f"run again with --resume: {resume_command(run)}") from None


def check_writable(run: Path, again: str) -> None:
    """Refuse a folder this process cannot write before work whose result would be lost (a
    real write: as root, permission bits say nothing)."""
    probe = run / f".write-probe-{os.getpid()}"
    try:
        probe.open("x").close()
        probe.unlink()
    except OSError as exc:
        raise UserError(f"run folder {run} is not writable ({exc.strerror}); make it writable "
                        f"(chmod u+w {shlex.quote(str(run))}) and run again: {again}") from None


@contextlib.contextmanager
def write_errors(run: Path, again: str) -> Iterator[None]:
    """A failed write (full disk, read-only folder) becomes one line naming the rerun."""
    try:
        yield
    except OSError as exc:
        raise UserError(f"disk full or unwritable: writing {run} failed ({exc.strerror or exc}); "
                        f"free space and run again: {again}") from None


def has_run(run: Path) -> bool:
    return ((run / "metrics.jsonl").exists() or (run / "config.yaml").exists()
            or bool(ckpt.list_checkpoints(run)))


def is_finished(run_dir: Path) -> bool:
    """summary.json says done (or, lacking a status, covers every configured step)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    if "status" in summary:
        return summary["status"] == "done"
    try:
        steps = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("steps")
    except (OSError, yaml.YAMLError):
        return False
    return steps is not None and int(summary.get("steps") or 0) >= int(steps)


def store_fingerprints(cfg: TrainConfig, method: Method) -> dict[str, Any]:
    """The fingerprints of what the run reads (its team's experts, none for a method that
    reads no expert), from the store attrs (None where absent)."""
    path = store_path(cfg.cache_dir, cfg.task)
    channel = methods.token_channel(method, cfg.channel)  # a token channel's states are read too
    experts = expert_names_for(cfg, method)
    found: dict[str, Any] = {"cache_dir": str(cfg.cache_dir), "items": None,
                             "experts": dict.fromkeys(experts)}
    if "router" in method.reads:  # the registry says, not a method's name
        found["router"] = None
    if channel is not None:  # the token states it reads, not only their expert's vectors
        found["tokens"] = dict.fromkeys(experts)
    try:
        root = zarr.open_group(path, mode="r")
    except Exception:  # noqa: BLE001 - absent or unreadable: the reader names the fix later
        return found
    found["items"] = layout.stored_items_fingerprint(layout.find_items(root, SPLIT))
    for name in experts:
        found["experts"][name] = layout.fingerprint(layout.find_expert(root, SPLIT, name))
    if "router" in found:
        found["router"] = layout.fingerprint(layout.find_router(root, SPLIT))
    for name in found.get("tokens", {}):
        u = token_layout.find_token_unit(layout.find_expert(root, SPLIT, name), channel,
                                         cfg.token_layer)
        found["tokens"][name] = u.attrs.get("fingerprint") if u is not None else None
    return found


def _differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    diffs = ["items"] if saved.get("items") != now["items"] else []
    names = dict.fromkeys([*saved.get("experts", {}), *now["experts"]])
    diffs += [f"expert {n}" for n in names
              if saved.get("experts", {}).get(n) != now["experts"].get(n)]
    if ("router" in saved or "router" in now) and saved.get("router") != now.get("router"):
        diffs.append("router")
    if isinstance(saved.get("tokens"), dict):  # a run recorded before them is not compared
        was, is_ = saved["tokens"], now.get("tokens") or {}
        diffs += [f"expert {n}'s token states" for n in dict.fromkeys([*was, *is_])
                  if was.get(n) != is_.get(n)]
    return diffs


def open_run(cfg: TrainConfig, run: Path, resume: bool, method: Method,
             held: contextlib.ExitStack) -> dict[str, Any]:
    """Lock the run folder until ``held`` closes, then ``prepare`` it: its fingerprints."""
    held.enter_context(locked(run))
    return prepare(cfg, run, resume, method)


def prepare(cfg: TrainConfig, run: Path, resume: bool, method: Method) -> dict[str, Any]:
    """The start / resume decision and the store check, before any model loads; returns the
    store fingerprints ``begin`` records."""
    if not resume and has_run(run):
        raise UserError(f"run folder {run} already has a run; pass --resume to continue it (from "
                        "step 0 if it has no checkpoint yet) or another --run-dir")
    if resume and not has_run(run):
        raise UserError(f"nothing to resume in {run} (no run there); start it without --resume")
    now = store_fingerprints(cfg, method)
    if not resume:
        return now
    if (run / "config.yaml").is_file():
        saved = read_run_config(run)
        if saved.steps != cfg.steps:  # the LR schedule and the summary are sized by it
            raise UserError(f"--resume keeps the run's {saved.steps} steps (asked {cfg.steps}); "
                            "keep its steps, or start a new --run-dir for another length")
        check_channel(saved, cfg, run, method)
    if not check_config(cfg, run):  # a run from before config digests were recorded
        log.warning("%s has no %s; recording the config it resumes with", run, CONFIG_DIGEST)
    if not check_store(cfg, run, now):  # a run from before fingerprints were recorded
        log.warning("%s has no %s; recording the store it resumes on", run, FINGERPRINTS)
    return now


def check_channel(saved: TrainConfig, cfg: TrainConfig, run: Path, method: Method) -> None:
    """Refuse to resume ``run`` on another channel or token layer than it recorded (a run
    from before channels read the pooled vectors): the adapter's weights fit what it read."""
    if "channel" in method.ignores:
        return
    was = (saved.channel, saved.token_layer if saved.channel != "pooled" else None)
    now = (cfg.channel, cfg.token_layer if cfg.channel != "pooled" else None)
    if was != now:
        where = "" if was[1] is None else f" --token-layer {was[1]}"
        raise UserError(f"{run} was trained on --channel {was[0]}{where}; --resume keeps it: "
                        f"pass --channel {was[0]}{where}, or start a new --run-dir for "
                        f"--channel {cfg.channel}")


def check_store(cfg: TrainConfig, run: Path, now: dict[str, Any]) -> bool:
    """Refuse a store that is not the one ``run`` trained on (resume and eval alike); False
    when the run recorded no fingerprints to compare with. ``now``: the store's fingerprints
    as the run reads them today (``store_fingerprints``)."""
    saved_path = run / FINGERPRINTS
    if not saved_path.is_file():
        return False
    try:
        saved = json.loads(saved_path.read_text("utf-8"))
        if not isinstance(saved, dict) or not isinstance(saved.get("experts", {}), dict):
            raise ValueError("not a mapping of the store's fingerprints")
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{saved_path} is unreadable ({exc}); restore it from the published "
                        f"copy of the run, or start a new --run-dir") from None
    diffs = _differences(saved, now)
    if diffs:
        where = store_path(cfg.cache_dir, cfg.task)
        raise UserError(
            f"store {where} is not the one {run} trained on ({', '.join(diffs)} differ); "
            f"pass --cache-dir {shlex.quote(str(saved.get('cache_dir')))}, the store it trained "
            "on, or start "
            "a new --run-dir")
    return True


def check_config(cfg: TrainConfig, run: Path) -> bool:
    """Refuse a config that is not the one ``run`` started with (a hand-edited config.yaml);
    False when the run recorded no digest (a run from before they were)."""
    path = run / CONFIG_DIGEST
    if not path.is_file():
        return False
    try:
        saved = json.loads(path.read_text("utf-8"))
        if not isinstance(saved, dict) or not isinstance(saved.get("fields"), list):
            raise ValueError("not a config digest")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is unreadable ({exc}); restore the run folder from its "
                        "published copy, or start a new --run-dir") from None
    if saved.get("sha256") != config_digest(cfg, [str(k) for k in saved["fields"]])["sha256"]:
        raise UserError(f"{run / 'config.yaml'} differs from the config the run started with "
                        f"({CONFIG_DIGEST}); restore config.yaml as it was, or start a new "
                        "--run-dir for other settings")
    return True


def restore(run: Path, resume: bool, model, adapter, optimizer, scheduler, generator,
            unverified: bool = False) -> int:
    """The step the loop starts at: the newest intact checkpoint's, or 0 (said plainly when a
    resumed run had none); metrics.jsonl keeps only the rows before it. ``unverified`` (the
    user's ``--resume-unverified``) loads checkpoints that carry no manifest of this user's."""
    if not resume:
        return 0
    state = ckpt.load_latest(run, model, adapter, optimizer, scheduler, generator, unverified)
    start = state["step"] if state is not None else 0
    if state is None:
        log.warning("%s has no checkpoint yet (killed before its first save): restarting it "
                    "from step 0 in place", run)
    else:
        log.info("resuming %s from step %d", run, start)
    with disk_errors(run):
        truncate_metrics(run / "metrics.jsonl", start)
    return start


def start_step(launch: Launch, resume: bool, policy, adapter, optimizer, scheduler,
               generator: torch.Generator, unverified: bool = False) -> int:
    """The step the loop starts at. Rank 0 picks the checkpoint (setting damaged ones aside)
    and trims metrics.jsonl; every other rank then loads the same checkpoint."""
    def pick() -> tuple[int, str | None]:
        start = restore(launch.run, resume, policy.model, adapter, optimizer, scheduler,
                        generator, unverified)
        last = ckpt.latest_checkpoint(launch.run) if start else None
        return start, None if last is None else str(last)

    start, folder = launch.world.on_rank0(pick)
    if not launch.lead and folder is not None:
        ckpt.load_checkpoint(Path(folder), policy.model, adapter, optimizer, scheduler,
                             generator, unverified)
    return start


def begin(cfg: TrainConfig, run: Path, fingerprints: dict[str, Any]) -> None:
    """Create the folder and write config.yaml, its digest and fingerprints.json (each
    atomically); a resumed run's digest was checked in ``prepare`` and is the same."""
    with disk_errors(run):
        run.mkdir(parents=True, exist_ok=True)
        tmp = run / "config.yaml.tmp"
        save_config(cfg, tmp)
        os.replace(tmp, run / "config.yaml")
        tmp = run / f"{CONFIG_DIGEST}.tmp"  # after config.yaml: a kill between is a warning
        tmp.write_text(json.dumps(config_digest(cfg), indent=1) + "\n")
        os.replace(tmp, run / CONFIG_DIGEST)
        tmp = run / f"{FINGERPRINTS}.tmp"
        tmp.write_text(json.dumps(fingerprints, indent=1, sort_keys=True))
        os.replace(tmp, run / FINGERPRINTS)


@contextlib.contextmanager
def metrics_file(run: Path, lead: bool) -> Iterator[Any]:
    """metrics.jsonl opened for appending on rank 0; None on the others."""
    if not lead:
        yield None
        return
    with disk_errors(run):
        out = open(run / "metrics.jsonl", "a")  # noqa: SIM115 - closed below
    try:
        yield out
    finally:
        out.close()


def finish(run: Path, steps: int, writer, plot: bool) -> dict[str, Any]:
    """Close the run's logs: tensorboard, summary.json and (``plot``) routing.png."""
    if writer is not None:
        writer.close()
    with disk_errors(run):
        summary = summarize(run, steps)
        if plot:
            from musketeers.run.plots import plot_run  # matplotlib: only a finished run draws

            plot_run(read_metrics(run / "metrics.jsonl"), run / "routing.png", title=run.name)
    return summary

