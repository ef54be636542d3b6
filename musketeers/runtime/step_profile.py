"""Where a training step's time goes, and how much work each phase did.

Every metrics row carries ``phase_s`` (seconds of this rank's step spent sampling, in the
reference pass, in the loss forward, in backward and in the optimizer) and ``work`` (the token
counts those phases processed). ``musketeers.bench.roofline`` turns the two into each phase's
share of what the machine can do; the counts are exact, so the share is only as rough as the
roofline's model of the hardware.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager

PHASES = ("sample", "reference", "forward", "backward", "optimizer")
Observer = Callable[[str], AbstractContextManager[object]]
_observers: list[Observer] = []


@contextmanager
def observing(observer: Observer) -> Iterator[None]:
    """Within the block, every phase of every ``PhaseClock`` also runs inside
    ``observer(phase)``, outside its timing: how the bench marks profiler ranges
    (``bench.phase_ops``) and samples memory per phase (``bench.memory``)."""
    _observers.append(observer)
    try:
        yield
    finally:
        _observers.remove(observer)


class PhaseClock:
    """Seconds per phase, summed over a step's micro-batches and inner iterations.

    ``sync`` (``torch.cuda.synchronize`` on a GPU) runs at each phase's edges: kernels are
    queued asynchronously, and without it a phase's work is billed to the next one that
    waits for a result."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.sync = sync or (lambda: None)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        with ExitStack() as observed:
            for observer in list(_observers):
                observed.enter_context(observer(name))
            self.sync()
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self.sync()
                self.seconds[name] += time.perf_counter() - t0


def decode_batches(prompts: list[int], limit: int) -> list[list[int]]:
    """Consecutive micro-batches (of ``prompts[i]`` prompts each) sampled as one batch: as
    many as fit ``limit`` prompts (0: one each); a micro-batch is never split."""
    batches: list[list[int]] = []
    for i, n in enumerate(prompts):
        if batches and sum(prompts[j] for j in batches[-1]) + n <= max(limit, 1):
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def step_work(rollouts, n_context: int, passes: dict[str, int],
              decode_prompts: int = 0) -> dict[str, int]:
    """Token counts of one step's rollouts, as each phase processes them.

    Sampling runs each group's prefix [x ‖ C] once (``prefill_tokens``), then decodes the B·G
    rows of each decode batch (``decode_batches``: a micro-batch, or ``decode_prompts``
    prompts' worth) together until its longest completion ends (``decode_steps`` steps over
    ``decode_rows`` rows, ``decode_tokens`` rows × steps); ``decode_context``
    sums, over those steps and rows, the positions each decoded token attends to (what its
    KV-cache read scales with). A log-prob
    pass (reference, loss forward, backward) runs each kept group's prefix once and its G
    completions against the prefix's KV: ``logprob_tokens`` tokens (``logprob_completion_tokens``
    of them through the LM head) and ``logprob_attention`` the attended pairs in units of n²
    (a prefix of p: p², a completion of c after it: 2cp + c²; ``prefill_attention`` Σ p²; the
    head all prompts share, run once too, is not subtracted), counted once
    per pass of each kind in ``passes`` ({"reference": k, "forward": k}).
    """
    w = dict.fromkeys(("prefill_tokens", "prefill_attention", "decode_steps", "decode_rows",
                       "decode_tokens", "decode_context", "logprob_tokens",
                       "logprob_completion_tokens", "logprob_attention"), 0)
    groups = [len(r.completions) // max(1, len(r.prompt_ids)) for r in rollouts]
    prefixes = [[len(p) + n_context for p in r.prompt_ids] for r in rollouts]
    for batch in decode_batches([len(r.prompt_ids) for r in rollouts], decode_prompts):
        steps = max((len(c) for i in batch for c in rollouts[i].completions), default=0)
        for i in batch:
            w["decode_rows"] += len(rollouts[i].completions)
            w["decode_tokens"] += steps * len(rollouts[i].completions)
            w["decode_context"] += sum(groups[i] * (steps * n + steps * (steps - 1) // 2)
                                       for n in prefixes[i])
        w["decode_steps"] += steps
    for r, g, prefix in zip(rollouts, groups, prefixes, strict=True):
        w["prefill_tokens"] += sum(prefix)
        w["prefill_attention"] += sum(n * n for n in prefix)
        keep = r.keep.tolist() if r.keep.numel() else []
        for b, k in enumerate(keep):
            if k:  # the prefix once per group (its KV shared by the G rows), then each row
                p = prefix[b]
                w["logprob_tokens"] += p
                w["logprob_attention"] += p * p
                for c in map(len, r.completions[b * g:(b + 1) * g]):
                    w["logprob_tokens"] += c
                    w["logprob_completion_tokens"] += c
                    w["logprob_attention"] += 2 * c * p + c * c
    w.update({f"{k}_passes": v for k, v in passes.items()})
    return w
