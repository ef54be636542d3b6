"""What a run is built from: its policy, expert team, data, adapter and optimizer.

Every entry point that trains or evaluates (``train``, ``eval``, the benchmarks) builds a run
through these functions, so a seed gives the same LoRA and adapter initialisation everywhere.
"""

from __future__ import annotations

import copy
import importlib
import logging
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from musketeers.cache.devices import dtype_name, resolve_dtype
from musketeers.cache.errors import UserError
from musketeers.cache.experts import load_expert, resolve_local
from musketeers.config import TrainConfig
from musketeers.method.methods import Method, build_adapter
from musketeers.method.policy import Policy
from musketeers.run.data import load_split
from musketeers.run.team import expert_names_for, team_specs  # noqa: F401  (team_specs: API)
from musketeers.teams import policy_spec

PolicyFactory = Callable[[TrainConfig], Any]
log = logging.getLogger(__name__)


def build_policy(cfg: TrainConfig):
    """The LoRA policy named by ``cfg.policy``, loaded offline: a registry name, a local folder
    or a hub id (musketeers.teams.policy_spec), or a ``package.module:function`` factory."""
    if ":" in cfg.policy and not Path(cfg.policy).exists():
        return _policy_plugin(cfg.policy)(cfg)
    model, tokenizer = _load_base(policy_spec(cfg.policy), cfg.device, cfg.dtype)
    return Policy(model, tokenizer, lora_r=cfg.lora_r, context_position=cfg.context_position)


def fetch_policy(cfg: TrainConfig) -> None:
    """Convert or build the local copy ``build_policy`` loads, without loading it: under
    torchrun rank 0 does this once, before the ranks load it side by side."""
    if ":" in cfg.policy and not Path(cfg.policy).exists():
        return  # a plugin builds its own policy
    resolve_local(policy_spec(cfg.policy))


def _policy_plugin(ref: str) -> PolicyFactory:
    module, _, attr = ref.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"policy {ref!r}: cannot import {attr!r} from {module!r} ({exc}); "
                        "pass --policy a registry name, folder, hub id or module:function"
                        ) from None


# The frozen base weights of the last policy loaded: an ablation grid trains dozens of runs of
# one policy in one process, and LoRA wraps (mutates) the model, so each run gets a deep copy
# of its modules. The copy shares the parameters: LoRA freezes them and nothing writes them,
# and a second fp32 copy of a 0.5B policy was 2.4 GiB of the pocket step's peak.
_BASE: dict[tuple, tuple[Any, Any]] = {}


def _load_base(spec, device: str, dtype: str):
    """The policy's base model and tokenizer in ``dtype`` (a name, or ``auto``: the device's
    native choice, resolved here on the machine that runs it)."""
    resolved = resolve_dtype(dtype, device)
    if dtype == "auto":
        log.info("dtype auto → %s on this %s", dtype_name(resolved), device)
    key = (spec, device, resolved)
    if key not in _BASE:
        state = torch.get_rng_state()  # loading must not shift the seeded LoRA/adapter init
        _BASE.clear()  # one policy at a time: a grid uses one, and weights can be large
        _BASE[key] = load_expert(spec, device, resolved)
        torch.set_rng_state(state)
    model, tokenizer = _BASE[key]
    return copy.deepcopy(model, {id(p): p for p in model.parameters()}), tokenizer


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_components(cfg: TrainConfig, split: str, *, method: Method, limit: int | None = None,
                     policy_factory: PolicyFactory | None = None):
    """(data, policy, adapter) of a run, deterministic in ``cfg.seed``. ``method``: the run's,
    resolved once by its entry."""
    data = load_split(cfg, split, expert_names_for(cfg, method), limit=limit, method=method)
    dims = data.expert_dims  # the adapter's input sizes, one per expert
    router_dim = int(data.router.shape[1]) if data.router is not None else 384
    seed_everything(cfg.seed)
    policy = (policy_factory or build_policy)(cfg)
    policy.decode_graphs = cfg.decode_graphs
    policy.prepack_decode = cfg.prepack_decode
    target = policy.embedding_rms if cfg.context_scale == "embedding" else None
    try:
        adapter = build_adapter(method, dims, policy.embed_dim,
                                latents=cfg.latents, d_model=cfg.d_model, heads=cfg.heads,
                                router_dim=router_dim, target_rms=target,
                                standardize=cfg.standardize_experts,
                                positions=cfg.token_positions)
    except (MemoryError, RuntimeError) as exc:
        if not isinstance(exc, MemoryError) and "allocate" not in str(exc):
            raise
        raise UserError(f"the adapter (--d-model {cfg.d_model}, --latents {cfg.latents}) does "
                        "not fit in memory; pass a smaller --d-model or --latents") from None
    if cfg.standardize_experts and split == "train" and hasattr(adapter, "align"):
        # a checkpoint's own buffers win on load; a token channel fits on a bounded sample
        adapter.align.fit_standardizer(data.standardizer_sample(cfg.seed))
    if adapter is not None:
        adapter.to(cfg.device)
    return data, policy, adapter


def make_optimizer(cfg: TrainConfig, policy, adapter, method: Method):
    """AdamW with separate learning rates for LoRA (θ) and the adapter (φ); a LambdaLR.

    A method whose GRPO steps do not train (``untrained``; ``warmup_only``, after its
    warm-up) gets learning rate 0 for both: with lr 0 AdamW's step and its decoupled weight
    decay (a factor 1 - lr·λ) leave every weight as is, and the run still samples, logs and
    checkpoints like any other."""
    trains = method.rl_updates
    groups = [{"params": [p for p in policy.model.parameters() if p.requires_grad],
               "lr": cfg.lr if trains else 0.0}]
    adapter_params = list(adapter.parameters()) if adapter is not None else []
    if adapter_params:  # zero_context's adapter has nothing to train
        groups.append({"params": adapter_params, "lr": cfg.adapter_lr if trains else 0.0})
    optimizer = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay, eps=cfg.adam_eps)

    def factor(step: int) -> float:
        warm = min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0
        frac = min(step / max(cfg.steps, 1), 1.0)
        if cfg.scheduler == "linear":
            return warm * (1.0 - frac)
        if cfg.scheduler == "cosine":
            return warm * 0.5 * (1.0 + math.cos(math.pi * frac))
        return warm

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
