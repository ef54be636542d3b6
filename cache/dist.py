"""Sharded precompute under ``torchrun``: ranks take disjoint, chunk-aligned row ranges.

Rank 0 alone creates groups, writes items and metadata and marks completion, each after a
barrier; every rank writes only its own chunks, so no two processes touch one chunk file.
gloo on CPU, NCCL on GPU. Without ``WORLD_SIZE`` > 1 every method is a no-op.

The store's lock file is held by rank 0 alone for the whole run (``precompute_task``): the
ranks of one job share it, and any other precompute on the same store is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch.distributed as tdist

from musketeers.cache.errors import UserError


@dataclass
class Dist:
    rank: int = 0
    world: int = 1

    @classmethod
    def from_env(cls, device: str = "cpu", timeout: timedelta = timedelta(hours=6)) -> Dist:
        """This process's rank, the process group initialised once (``timeout`` bounds every
        collective: how long a rank waits for the others)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        if device == "cuda":
            # one GPU per rank: without this every rank would load its expert onto cuda:0
            import torch

            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if not tdist.is_initialized():
            # Precompute's ranks wait at barriers while rank 0 converts a model or a slower
            # rank finishes its chunks: the default allows hours, not torch's 10-30 minutes.
            tdist.init_process_group("nccl" if device == "cuda" else "gloo", timeout=timeout)
        return cls(tdist.get_rank(), tdist.get_world_size())

    def close(self) -> None:
        if self.world > 1 and tdist.is_initialized():
            tdist.destroy_process_group()

    def barrier(self) -> None:
        if self.world > 1:
            tdist.barrier()

    def broadcast(self, obj: Any) -> Any:
        if self.world <= 1:
            return obj
        box = [obj]
        tdist.broadcast_object_list(box, src=0)
        return box[0]

    def on_rank0(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on rank 0 and share its result.

        Any exception of ``fn`` reaches every rank: rank 0 re-raises its own, the others a
        UserError (or RuntimeError) with its message. Otherwise rank 0 would leave and the
        others wait in the broadcast until the 6-hour timeout.
        """
        result, error = None, None
        if self.rank == 0:
            try:
                result = fn()
            except Exception as exc:
                user = isinstance(exc, UserError)
                self.broadcast((None, (user, str(exc) if user
                                       else f"{type(exc).__name__}: {exc}")))
                raise
        result, error = self.broadcast((result, error))
        if error is not None:
            user, message = error
            if user:
                raise UserError(message)
            raise RuntimeError(f"rank 0 failed: {message}")
        return result

    def my_chunks(self, n_chunks: int) -> list[int]:
        """This rank's contiguous block of chunk indices."""
        return [int(c) for c in np.array_split(np.arange(n_chunks), self.world)[self.rank]]
