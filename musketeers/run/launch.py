"""A run's start in this process, before any model loads: its threads, its world of ranks,
the run folder's lock and the start-or-resume decision (the step the loop starts at, once the
models are built, is ``runfolder.start_step``'s).

Every rank enters ``launched`` with one config. Rank 0 alone locks the folder and checks the
store; the ranks of one job share its lock, and any other job's rank 0 is refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from musketeers.config import TrainConfig, resume_command
from musketeers.method import methods
from musketeers.method.methods import Method
from musketeers.run import runfolder
from musketeers.runtime.distributed import World, check_world


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
        again = resume_command(run)
        method = methods.get(cfg.method)
        world = World.from_env(cfg.device)
        held.enter_context(world.failures(again))
        check_world(cfg, world, resume, stop_after)
        fingerprints = world.on_rank0(partial(runfolder.open_run, cfg, run, resume, method, held))
        yield Launch(world, world.rank == 0, method, run, fingerprints)
