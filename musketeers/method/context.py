"""C for a batch: the adapter run on its experts' vectors, its random draws replayable.

Hard routing draws Gumbel noise, so the C a rollout sampled with is a draw. The loss must
condition on that same C, not a fresh one: a rollout keeps the generator states its adapter
call started from (``seeded_rng``, ``rng_snapshot``) and ``adapter_context`` replays them.
"""

from __future__ import annotations

import torch

# (CPU generator state, CUDA generator state or None): what the adapter's random draws use
RngState = tuple[torch.Tensor, torch.Tensor | None]


def rng_snapshot(device: str) -> RngState:
    """The generator states the adapter's random draws (hard routing's Gumbel noise) come
    from: the CPU's, and the GPU's when the adapter runs there."""
    dev = torch.device(device)
    return torch.get_rng_state(), torch.cuda.get_rng_state(dev) if dev.type == "cuda" else None


def seeded_rng(device: str, seed: int) -> RngState:
    """The generator states ``adapter_context`` replays, seeded: the adapter's draws for a
    micro-batch then follow from its first prompt's position, not from what ran before."""
    dev = torch.device(device)
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.set_rng_state(torch.Generator().manual_seed(seed).get_state())
        if dev.type == "cuda":
            with torch.cuda.device(dev):
                torch.cuda.manual_seed(seed)
        return rng_snapshot(device)


def adapter_context(adapter, vectors, router, device, rng_state: RngState | None = None):
    """C and A for a batch. ``rng_state`` (``rng_snapshot``) replays the random draws of an
    earlier call, so the loss conditions on the C the completions were sampled with, not on a
    fresh draw."""
    if adapter is None:
        return None, None
    dev = torch.device(device)
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else [],
                               enabled=rng_state is not None):
        if rng_state is not None:
            torch.set_rng_state(rng_state[0])
            if rng_state[1] is not None:
                torch.cuda.set_rng_state(rng_state[1], dev)
        out = adapter([v.to(device) for v in vectors],
                      router.to(device) if router is not None else None)
    return out.context, out.attention
