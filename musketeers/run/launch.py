"""A run's start in this process, before any model loads: its threads, its world of ranks,
the run folder's lock and the start-or-resume decision; once the models are built, the step
the loop starts at.

Every rank enters ``launched`` with one config. Rank 0 alone locks the folder and checks the
store; the ranks of one job share its lock, and any other job's rank 0 is refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from musketeers.cache.errors import UserError
from musketeers.config import TrainConfig
from musketeers.method import methods
from musketeers.method.methods import Method
from musketeers.run import checkpoint as ckpt
from musketeers.run import runfolder
from musketeers.runtime.distributed import World


@dataclass(frozen=True)
class Launch:
    """What the run's start established, read by the rest of the run as values."""

    world: World
    lead: bool  # rank 0: the one rank that writes the run folder
    method: Method  # resolved once: every part of the run reads this one
    run: Path
    fingerprints: dict[str, Any]  # the store as the run reads it (``runfolder.begin`` records)


@contextlib.contextmanager
def torch_threads(n: int | None):
    """``torch.set_num_threads(n)`` for the block (no change when ``n`` is None)."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def launched(cfg: TrainConfig, resume: bool, stop_after: int | None) -> Iterator[Launch]:
    """The run started on this rank, its folder locked (on rank 0) until the block ends; a
    failure on any rank is reported on every rank in one line (``World.failures``)."""
    with torch_threads(cfg.threads), contextlib.ExitStack() as held:
        run = cfg.run_path()
        method = methods.get(cfg.method)
        again = runfolder.resume_command(run)
        world = World.from_env(cfg.device)
        held.enter_context(world.failures(again))
        check_world(cfg, world, resume, stop_after)
        fingerprints = world.on_rank0(partial(runfolder.open_run, cfg, run, resume, method, held))
        yield Launch(world, world.rank == 0, method, run, fingerprints)


def check_world(cfg: TrainConfig, world: World, resume: bool, stop_after: int | None) -> None:
    """Every rank has at least one prompt per update, and runs the same resolved config."""
    batch = cfg.prompts_per_micro * cfg.grad_accum
    if world.world > batch:
        raise UserError(f"{world.world} ranks for an update of {batch} prompts: every rank needs "
                        f"one; start at most {batch} ranks, or raise --grad-accum")
    world.check_same("config", {**dataclasses.asdict(cfg), "resume": resume,
                                "stop_after": stop_after})


def start_step(launch: Launch, resume: bool, policy, adapter, optimizer, scheduler,
               generator: torch.Generator, unverified: bool = False) -> int:
    """The step the loop starts at. Rank 0 picks the checkpoint (setting damaged ones aside)
    and trims metrics.jsonl; every other rank then loads the same checkpoint."""
    def pick() -> tuple[int, str | None]:
        start = runfolder.restore(launch.run, resume, policy.model, adapter, optimizer,
                                  scheduler, generator, unverified)
        last = ckpt.latest_checkpoint(launch.run) if start else None
        return start, None if last is None else str(last)

    start, folder = launch.world.on_rank0(pick)
    if not launch.lead and folder is not None:
        ckpt.load_checkpoint(Path(folder), policy.model, adapter, optimizer, scheduler,
                             generator, unverified)
    return start
