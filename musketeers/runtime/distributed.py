"""Data-parallel training and evaluation under ``torchrun``: one process per rank, each with
the whole policy and adapter.

An update's prompts are split across the ranks. Every rank gathers the whole update's rewards
(advantages and per-task standardisation see every prompt), its completion lengths (the loss
normaliser is the update's) and its metrics; each rank's loss is its share of the update's loss
over that global normaliser, so the ranks' gradients are summed, not averaged, into the
gradient one process would compute. Every rank then takes the same optimizer step.

gloo on CPU, NCCL on GPU (``cache.dist`` initialises the group). Without ``WORLD_SIZE`` > 1
every method is a no-op on one rank, and the single-process path runs unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as tdist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from musketeers.cache.dist import Dist
from musketeers.cache.errors import UserError

if TYPE_CHECKING:  # a type only: config imports the method, which imports this module
    from musketeers.config import TrainConfig

TIMEOUT_ENV = "MUSKETEERS_DIST_TIMEOUT_S"
# how long a rank waits in a collective for the others: rank 0 alone writes checkpoints and
# plots between steps, so minutes are normal; a dead rank on gloo fails at once regardless
DEFAULT_TIMEOUT_S = 1800
_FAILED_KEY = "musketeers/failed"
_PID_KEY = "musketeers/pid/"
# what a collective raises when a peer process is gone (gloo) or silent (NCCL's watchdog)
_PEER_LOST = ("connection closed", "connection reset", "broken pipe", "timed out", "nccl")


def lead() -> bool:
    """Whether this process reports (rank 0, or no torchrun): the other ranks stay quiet."""
    return int(os.environ.get("RANK", "0")) == 0


def rank_prefix() -> str:
    """``rank N: `` under torchrun with several ranks, so that each rank's line says whose."""
    return f"rank {os.environ.get('RANK', '0')}: " if int(os.environ.get("WORLD_SIZE", "1")) > 1 \
        else ""


def timeout_s() -> float:
    raw = os.environ.get(TIMEOUT_ENV, str(DEFAULT_TIMEOUT_S))
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise UserError(f"{TIMEOUT_ENV}={raw!r} is not a positive number of seconds")
    return value


class World(Dist):
    """This process's rank among ``world`` ranks, and the collectives training needs."""

    @classmethod
    def from_env(cls, device: str = "cpu", timeout: timedelta | None = None) -> World:
        kind = torch.device(device).type
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and device not in ("cpu", "cuda"):
            raise UserError(f"--device {device} under torchrun would put every rank on one "
                            "device; pass --device cuda (each rank takes its LOCAL_RANK GPU)")
        base = Dist.from_env(kind, timeout or timedelta(seconds=timeout_s()))
        world = cls(base.rank, base.world)
        world._register()
        return world

    # ---- collectives ----------------------------------------------------------------------

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (picklable objects; tensors come back on CPU)."""
        if self.world <= 1:
            return [obj]
        out: list[Any] = [None] * self.world
        tdist.all_gather_object(out, obj)
        return out

    def total(self, value: float) -> float:
        """The sum over ranks, added in rank order (so one rank's sum is the same float)."""
        return float(sum(self.all_gather(float(value)), 0.0))

    def shard(self, n: int) -> slice:
        """This rank's contiguous block of ``n`` positions (the first ranks get one more)."""
        bounds = np.cumsum([0] + [len(a) for a in np.array_split(np.arange(n), self.world)])
        return slice(int(bounds[self.rank]), int(bounds[self.rank + 1]))

    def sum_grads(self, params: list[torch.nn.Parameter]) -> None:
        """All-reduce (sum) the gradients of ``params`` in place, one flat buffer per device and
        dtype. A rank with no sample in the loss has no gradient: it contributes zeros."""
        if self.world <= 1:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        buckets: dict[tuple, list[torch.Tensor]] = {}
        for p in params:
            buckets.setdefault((p.grad.device, p.grad.dtype), []).append(p.grad)
        for grads in buckets.values():
            flat = _flatten_dense_tensors(grads)
            tdist.all_reduce(flat)
            for g, summed in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
                g.copy_(summed)

    def check_same(self, what: str, values: dict[str, Any]) -> None:
        """Refuse ranks started with different ``values`` (their resolved config), naming the
        first rank and the keys that differ from rank 0's."""
        if self.world <= 1:
            return
        for rank, other in enumerate(self.all_gather(values)):
            keys = sorted(k for k in values.keys() | other.keys()
                          if values.get(k) != other.get(k))
            if keys:
                raise UserError(f"rank {rank} was started with another {what} than rank "
                                f"{self.rank} ({', '.join(keys)} differ); start every rank "
                                "with the same command")

    # ---- failures -------------------------------------------------------------------------

    @contextlib.contextmanager
    def failures(self, again: str) -> Iterator[None]:
        """One line when a rank stops: the rank that failed says why (and tells the others
        through the rendezvous store); the others name it instead of printing a backend's
        trace, whether their collective failed or torchrun's agent stopped them (SIGTERM)."""
        if self.world <= 1:
            yield
            return
        stopped = (f"; the run stopped, continue it from its last checkpoint with any number "
                   f"of ranks: {again}")
        try:
            yield
        except SystemExit as exc:
            who = self._who_failed(0.0) if exc.code == 128 + signal.SIGTERM else None
            if who:  # torchrun stops every rank when one fails
                raise UserError(who + stopped) from None
            raise
        except Exception as exc:
            if not isinstance(exc, UserError) and _peer_lost(exc):
                raise UserError((self._who_failed() or "another rank stopped answering")
                                + stopped) from None
            first = (str(exc).splitlines() or [""])[0]
            self._publish(first if isinstance(exc, UserError)
                          else f"{type(exc).__name__}: {first}")
            raise

    def _store(self):
        try:
            return tdist.distributed_c10d._get_default_store()
        except Exception:  # noqa: BLE001 - no store: failures are reported without a name
            return None

    def _register(self) -> None:
        store = self._store() if self.world > 1 else None
        if store is not None:
            store.set(f"{_PID_KEY}{self.rank}", f"{socket.gethostname()} {os.getpid()}")

    def _publish(self, message: str) -> None:
        store = self._store()
        with contextlib.suppress(Exception):  # best effort: the rank is failing anyway
            if store is not None:
                store.set(_FAILED_KEY, f"rank {self.rank}: {message}")

    def _who_failed(self, wait_s: float = 3.0) -> str | None:
        """The failing rank's own message, else the ranks on this host whose process is gone
        (a killed rank says nothing); None when neither shows within ``wait_s``."""
        store = self._store()
        if store is None:
            return None
        deadline = time.monotonic() + wait_s
        while True:
            found = _published(store) or self._dead_here(store)
            if found or time.monotonic() >= deadline:
                return found
            time.sleep(0.2)

    def _dead_here(self, store) -> str | None:
        dead = []
        for rank in range(self.world):
            with contextlib.suppress(Exception):
                host, pid = store.get(f"{_PID_KEY}{rank}").decode().split()
                if host == socket.gethostname() and not _alive(int(pid)):
                    dead.append(f"rank {rank} (PID {pid}) died")
        return "; ".join(dead) or None


def check_world(cfg: TrainConfig, world: World, resume: bool, stop_after: int | None) -> None:
    """Every rank has at least one prompt per update, and runs the same resolved config."""
    batch = cfg.prompts_per_micro * cfg.grad_accum
    if world.world > batch:
        raise UserError(f"{world.world} ranks for an update of {batch} prompts: every rank needs "
                        f"one; start at most {batch} ranks, or raise --grad-accum")
    world.check_same("config", {**dataclasses.asdict(cfg), "resume": resume,
                                "stop_after": stop_after})


def _published(store) -> str | None:
    with contextlib.suppress(Exception):
        if store.check([_FAILED_KEY]):
            return store.get(_FAILED_KEY).decode()
    return None


def _peer_lost(exc: BaseException) -> bool:
    if isinstance(exc, tdist.DistError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("gloo" in text or any(s in text for s in _PEER_LOST))


def _alive(pid: int) -> bool:
    """False for a process that is gone or a zombie (killed, not yet reaped by torchrun)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
