"""The method registry: every method and control, declared once.

A ``Method`` says everything the rest of the project needs to know about one way of giving
the policy its context: the adapter it trains (if any), what it reads from the feature store,
whether it yields the attention matrix A of Eq. 15, which config fields do not change what it
computes, its label in tables, whether the paper's routing claims (§4.3) are stated for it,
and — for the controls — which signal it breaks. Data loading, run naming, the grids'
precompute needs, tables, claims and the fake-run generator read this table; adding a
method is one ``register(Method(...))`` call.

The controls are the evidence behind every claim:

- ``shuffled_experts``: Ours, but each item reads another item's expert vectors (a seeded
  derangement, fixed for the run): only the experts' static signatures remain, not what they
  say about this prompt. Accuracy claims for Ours are stated against it.
- ``shuffled_reward``: Ours, but each update's rewards are permuted across its completions
  before advantages: the update has the same amount of "signal" with none of its meaning.
  Routing claims (H falls, u concentrates, ρ < 0) are stated against it.
- ``zero_context``: C = 0 at every step and nothing in the adapter trains: Single with m extra
  positions, the layout π_ref already sees. Separates "C carries information" from "the
  prompt got m positions longer".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from musketeers.cache.errors import UserError
from musketeers.cache.tokens import POOLED
from musketeers.method.adapter import (
    AdapterOutput,
    ExpertInput,
    HardRoutingAdapter,
    NoCrossAttnAdapter,
    PerceiverAdapter,
)
from musketeers.method.expert_tokens import rows_in

# (expert_dims, d_policy, options) -> adapter; options: latents, d_model, heads, router_dim,
# out_init_std
AdapterFactory = Callable[[list[int], int, dict[str, Any]], nn.Module]
READS = ("vectors", "router", "hints")


@dataclass(frozen=True)
class Method:
    """One way of conditioning the policy on the experts (or a control of one)."""

    name: str
    label: str  # row label in tables ("Ours" rows add their team)
    adapter: AdapterFactory | None  # None: no context tokens C and no trainable φ
    reads: frozenset[str] = frozenset()  # what the store must hold for it (READS)
    attention: bool = False  # yields A [B, m, n] (Eq. 15's observable)
    routed: bool = False  # the paper's routing claims (§4.3) are stated for it
    ignores: tuple[str, ...] = ()  # config fields that change nothing it computes
    control_of: str | None = None  # the method whose signal this one breaks
    shuffle_vectors: bool = False  # each item reads another item's expert vectors
    shuffle_rewards: bool = False  # rewards permuted within each update before advantages
    trains: bool = True  # False: every learning rate is 0, so the run scores its start
    rl: bool = True  # False: GRPO's learning rates are 0, so only the warm-up trains
    # a fixed number of steps whatever the budget: a run that learns nothing needs one
    steps: int | None = None
    summary: str = ""
    # facts that follow from the fields above, settled once when the method is declared
    uses_experts: bool = field(init=False)  # it reads something of the experts' from the store
    rl_updates: bool = field(init=False)  # its GRPO steps move some weight

    def __post_init__(self) -> None:
        object.__setattr__(self, "uses_experts", bool(self.reads))
        object.__setattr__(self, "rl_updates", self.trains and self.rl)


REGISTRY: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add ``method`` to the registry (a name may be declared once)."""
    if method.name in REGISTRY:
        raise ValueError(f"method {method.name!r} is already registered")
    bad = set(method.reads) - set(READS)
    if bad:
        raise ValueError(f"method {method.name!r} reads unknown store parts {sorted(bad)}")
    REGISTRY[method.name] = method
    return method


def unregister(name: str) -> Method:
    """Remove ``name`` from the registry (a throwaway method in a test, a plug-in unloaded)."""
    return REGISTRY.pop(name)


@contextmanager
def registered(method: Method) -> Iterator[Method]:
    """``method`` in the registry for the block's duration only, so tests don't leak it."""
    register(method)
    try:
        yield method
    finally:
        unregister(method.name)


def get(name: str) -> Method:
    """The registered method ``name``; a UserError listing the valid names otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise UserError(f"unknown method '{name}'; valid: {', '.join(REGISTRY)}") from None


def ignored(method: Any) -> tuple[str, ...]:
    """Config fields that change nothing ``method`` computes (the registry's ``ignores``):
    dropped from its run name, its table group and its staleness check. Empty for a name the
    registry does not know (an old run folder's), so such a run still reads, ungrouped."""
    spec = REGISTRY.get(str(method))
    return spec.ignores if spec else ()


def token_channel(method: Method, channel: str) -> str | None:
    """The token channel (``tokens``, ``answer``) whose states ``method`` reads on ``channel``;
    None where it reads pooled vectors, no vectors or no expert, or computes the same on every
    channel (``zero_context``: its registry's ``ignores``). A run passes its resolved method."""
    if "vectors" not in method.reads or not method.uses_experts or "channel" in method.ignores:
        return None
    return None if channel == POOLED else channel


def fixed_steps(method: Any) -> int | None:
    """The steps ``method`` always runs (the registry's ``steps``), None where the budget or
    the options decide, or for a name the registry does not know."""
    spec = REGISTRY.get(str(method))
    return spec.steps if spec else None


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def build_adapter(method: str | Method, expert_dims: list[int], d_policy: int, *, latents: int = 8,
                  d_model: int = 512, heads: int = 8, router_dim: int = 384,
                  out_init_std: float = 1e-8, target_rms: float | None = None,
                  standardize: bool = False, positions: bool = False) -> nn.Module | None:
    """The adapter g_φ of ``method``; None for the methods without context tokens.
    ``target_rms``: each context token's rms (``context_scale: embedding``), else Eq. 11's."""
    factory = (method if isinstance(method, Method) else get(method)).adapter
    if factory is None:
        return None
    return factory(expert_dims, d_policy, dict(latents=latents, d_model=d_model, heads=heads,
                                               router_dim=router_dim, out_init_std=out_init_std,
                                               target_rms=target_rms,
                                               standardize=standardize, positions=positions))


class ZeroContext(nn.Module):
    """C = 0 (m tokens) whatever the experts say, and nothing to train: the ``zero_context``
    control. It reads the batch size off the expert vectors, so it runs on the same rows."""

    def __init__(self, latents: int, d_policy: int):
        super().__init__()
        self.n_context = latents
        self.d_policy = d_policy

    def forward(self, vectors: list[ExpertInput], router_emb: torch.Tensor | None = None
                ) -> AdapterOutput:
        first = vectors[0]
        like = first.states if not isinstance(first, torch.Tensor) else first
        return AdapterOutput(context=like.new_zeros(rows_in(first), self.n_context,
                                                    self.d_policy), attention=None)


def _perceiver(dims: list[int], d_policy: int, o: dict[str, Any]) -> nn.Module:
    return PerceiverAdapter(dims, d_policy, latents=o["latents"], d_model=o["d_model"],
                            heads=o["heads"], out_init_std=o["out_init_std"],
                            target_rms=o["target_rms"], standardize=o["standardize"],
                            positions=o["positions"])


def _no_cross_attn(dims: list[int], d_policy: int, o: dict[str, Any]) -> nn.Module:
    return NoCrossAttnAdapter(dims, d_policy, d_model=o["d_model"],
                              out_init_std=o["out_init_std"], target_rms=o["target_rms"],
                              standardize=o["standardize"])


def _hard_routing(dims: list[int], d_policy: int, o: dict[str, Any]) -> nn.Module:
    return HardRoutingAdapter(dims, d_policy, d_model=o["d_model"], router_dim=o["router_dim"],
                              out_init_std=o["out_init_std"], target_rms=o["target_rms"],
                              standardize=o["standardize"])


def _zero_context(dims: list[int], d_policy: int, o: dict[str, Any]) -> nn.Module:
    return ZeroContext(o["latents"], d_policy)


# what only φ reads; the warm-up's steps and batch are not among them, since they also train
# the LoRA of a method without φ when warmup_policy_lr > 0 (warmup.warms_up). The channel is
# read by every adapter that reads the experts: the Perceiver attends over every token (Eq. 10
# with a key mask), no_cross_attn and hard_routing read each expert's masked token mean; C = 0
# (zero_context) and the methods without φ compute the same on any channel.
_NO_C = ("pooling", "channel", "token_layer", "token_positions", "latents", "context_position",
         "d_model", "heads", "adapter_lr", "context_scale", "standardize_experts",
         "adapter_warmup_lr")
_NO_WARMUP = ("adapter_warmup", "adapter_warmup_batch", "warmup_policy_lr",
              "warmup_permute_share")
_VECTORS = frozenset({"vectors"})

register(Method("perceiver", "Ours", _perceiver, _VECTORS, attention=True, routed=True,
                summary="m latent queries cross-attend over the aligned experts (Eq. 8-11)"))
register(Method("no_cross_attn", "Ours w/o Cross-Attn", _no_cross_attn, _VECTORS,
                ignores=("latents", "heads"),
                summary="token-wise FFN over the aligned experts, one token each (Eq. 14)"))
register(Method("hard_routing", "Hard Routing", _hard_routing, frozenset({"vectors", "router"}),
                attention=True, ignores=("latents", "heads"),
                summary="a MiniLM router picks one expert -> one memory token (Eq. 13)"))
register(Method("output_collab", "Output Collaboration", None, frozenset({"hints"}),
                ignores=_NO_C, summary="the experts' answers as text in the prompt (Eq. 12)"))
register(Method("single", "Single", None, ignores=("team", *_NO_C),
                summary="the policy alone, no experts"))
register(Method("shuffled_experts", "Ours, shuffled experts (control)", _perceiver, _VECTORS,
                attention=True, routed=True, control_of="perceiver", shuffle_vectors=True,
                summary="Ours on another item's expert vectors: static signatures only"))
register(Method("shuffled_reward", "Ours, shuffled reward (control)", _perceiver, _VECTORS,
                attention=True, routed=True, control_of="perceiver", shuffle_rewards=True,
                summary="Ours with rewards permuted within each update: signal without meaning"))
register(Method("zero_context", "Zero context (control)", _zero_context, _VECTORS,
                control_of="perceiver",
                ignores=tuple(f for f in _NO_C if f != "latents"),  # its m positions stay
                summary="C = 0 at every step, nothing in φ trains: Single with m more positions"))
register(Method("untrained", "Single, untrained (baseline)", None,
                ignores=("team", *_NO_C, *_NO_WARMUP),
                control_of="single", trains=False, steps=1,
                summary="the policy before any update (learning rates 0): what training adds to"))
register(Method("warmup_only", "Single, warm-up only (no RL)", None,
                ignores=("team", *_NO_C), control_of="single", rl=False, steps=1,
                summary="Single's supervised warm-up, then one GRPO step at learning rate 0: "
                        "what RL adds to the warm-up"))


def derangement(n: int, seed: int) -> torch.Tensor:
    """A seeded permutation with no fixed point (n ≥ 2): row i reads row ``perm[i]`` ≠ i.

    A random cyclic shift of a random order: item order[k] takes order[k+1]'s vectors."""
    if n < 2:
        return torch.arange(n)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=g)
    perm = torch.empty(n, dtype=torch.long)
    perm[order] = order.roll(-1)
    return perm
