"""A resolved TrainConfig checked against the registries of the other modules, before any
model loads: every bad value is one UserError line naming what is valid."""

from __future__ import annotations

import math
import typing
from typing import TYPE_CHECKING

from musketeers.budgets import BUDGETS
from musketeers.cache.errors import UserError

if TYPE_CHECKING:
    from musketeers.config import TrainConfig

# The valid values of the options no registry declares. They live here, with the check that
# reads them, so that config imports its validator and the validator never imports config.
SCHEDULERS = ("constant", "linear", "cosine")
# "auto": bfloat16 where the device computes it natively (CUDA; a CPU with avx512_bf16 or
# AMX), float32 elsewhere, where bf16 is emulated and slower than float32
DTYPES = ("auto", "float32", "bfloat16", "float16")
CONTEXT_SCALES = ("init", "embedding")
# sizes past which a run cannot start on any machine here (tensors of terabytes, or an
# overflow): refused with a line instead of a traceback deep inside torch
SIZE_LIMITS = {"group_size": 1024, "latents": 4096, "d_model": 16384, "heads": 1024,
               "max_new_tokens": 131072, "prompts_per_micro": 4096, "grad_accum": 65536,
               "decode_prompts": 65536, "inner_iters": 1024, "lora_r": 4096, "steps": 10_000_000,
               "adapter_warmup": 10_000_000, "adapter_warmup_batch": 4096}


def _one_of(name: str, value: str, valid: typing.Iterable[str]) -> None:
    valid = tuple(valid)
    if value not in valid:
        raise UserError(f"unknown {name} '{value}'; valid: {', '.join(valid)}")


def validate(cfg: TrainConfig) -> None:
    """Names against the registries of the other modules; sizes positive. UserError if not."""
    from musketeers.cache.reader import POOLINGS
    from musketeers.cache.tokens import CHANNELS
    from musketeers.method.grpo_options import ADVANTAGES, LOSS_NORMS, REWARD_NORMS
    from musketeers.method.methods import names as method_names
    from musketeers.method.placement import CONTEXT_POSITIONS
    from musketeers.tasks import EXTRACTIONS, check_task

    check_task(cfg.task)
    _one_of("method", cfg.method, method_names())
    _check_warmup_only(cfg)
    _check_permute_share(cfg)
    if not (cfg.pooling in POOLINGS or (cfg.pooling.startswith("layer:")
                                        and cfg.pooling[6:].isdigit())):
        raise UserError(f"unknown pooling '{cfg.pooling}'; valid: {', '.join(POOLINGS)}, layer:K")
    _one_of("budget", cfg.budget, BUDGETS)
    _one_of("advantage", cfg.advantage, ADVANTAGES)
    _one_of("reward_norm", cfg.reward_norm, REWARD_NORMS)
    _one_of("loss_norm", cfg.loss_norm, LOSS_NORMS)
    _one_of("scheduler", cfg.scheduler, SCHEDULERS)
    _one_of("dtype", cfg.dtype, DTYPES)
    _one_of("context_position", cfg.context_position, CONTEXT_POSITIONS)
    _one_of("extraction", cfg.extraction, EXTRACTIONS)
    _one_of("channel", cfg.channel, CHANNELS)
    if cfg.channel != "pooled" and cfg.live_experts:
        raise UserError(f"live experts compute pooled vectors only, not channel "
                        f"'{cfg.channel}'; pass --channel pooled")
    _check_token_positions(cfg)
    for key in ("steps", "prompts_per_micro", "grad_accum", "group_size", "max_new_tokens",
                "latents", "d_model", "heads", "inner_iters", "lora_r", "save_every"):
        if getattr(cfg, key) < 1:
            raise UserError(f"config key '{key}' must be >= 1, got {getattr(cfg, key)}")
    if cfg.decode_prompts < 0:
        raise UserError(f"config key 'decode_prompts' must be >= 0, got {cfg.decode_prompts}")
    if not 0 <= cfg.seed < 2**32:  # numpy's seeding refuses anything else deep in the run
        raise UserError(f"config key 'seed' must be in [0, 2**32), got {cfg.seed}")
    for key, most in SIZE_LIMITS.items():
        if getattr(cfg, key) > most:
            raise UserError(f"config key '{key}' must be <= {most}, got {getattr(cfg, key)}; "
                            "no run of this project needs more")
    _check_device(cfg.device)
    if cfg.threads is not None and cfg.threads < 1:
        raise UserError(f"config key 'threads' must be >= 1, got {cfg.threads}")
    for key in ("no_context_every", "adapter_warmup", "adapter_warmup_batch", "loss_rows"):
        if getattr(cfg, key) < 0:
            raise UserError(f"config key '{key}' must be >= 0, got {getattr(cfg, key)}")
    if cfg.eval_limit is not None and cfg.eval_limit < 1:
        raise UserError(f"config key 'eval_limit' must be >= 1, got {cfg.eval_limit}")
    _one_of("context_scale", cfg.context_scale, CONTEXT_SCALES)
    for key in ("beta", "lr", "adapter_lr", "adapter_warmup_lr", "warmup_policy_lr",
                "weight_decay", "grad_clip", "clip_low", "clip_high", "adam_eps", "temperature"):
        # NaN compares false with everything: one update with lr nan makes every weight NaN
        if not math.isfinite(getattr(cfg, key)) or getattr(cfg, key) < 0:
            raise UserError(f"config key '{key}' must be a finite number >= 0, got "
                            f"{getattr(cfg, key)}")
    if not cfg.temperature > 0:  # sampling and log-probs divide the logits by it
        raise UserError(f"config key 'temperature' must be > 0, got {cfg.temperature}")
    if cfg.d_model % cfg.heads:
        raise UserError(f"config key 'd_model' ({cfg.d_model}) must be a multiple of 'heads' "
                        f"({cfg.heads})")



def _check_token_positions(cfg: TrainConfig) -> None:
    """Positions order an expert's tokens for the Perceiver's attention: refused where a token
    channel's tokens are averaged and they would go unread. (On the pooled channel each expert
    has one token, at position 0, whose code is 0: the same computation, allowed.)"""
    from musketeers.method.methods import get

    method = get(cfg.method)
    if not cfg.token_positions or "token_positions" in method.ignores:
        return
    if cfg.channel != "pooled" and not method.attention:
        raise UserError(f"method {cfg.method} averages each expert's tokens, so positions "
                        "would go unread; drop --token-positions or use --method perceiver")


def _check_warmup_only(cfg: TrainConfig) -> None:
    """A method whose GRPO steps are at lr 0 but that trains (``warmup_only``) measures the
    warm-up alone: without one it would be the untrained policy under another name."""
    from musketeers.method.methods import get

    method = get(cfg.method)
    if method.trains and not method.rl and not (cfg.adapter_warmup > 0
                                                 and cfg.warmup_policy_lr > 0):
        raise UserError(f"method {cfg.method} measures the supervised warm-up alone; give it "
                        "one: --adapter-warmup N (> 0) and --warmup-policy-lr LR (> 0)")


def _check_permute_share(cfg: TrainConfig) -> None:
    """The warm-up's permuted share is a share of rows (read only by a warm-up, as the
    warm-up's other fields are)."""
    share = cfg.warmup_permute_share
    if not (math.isfinite(share) and 0.0 <= share <= 1.0):
        raise UserError(f"config key 'warmup_permute_share' is a share of rows; give one in "
                        f"[0, 1], not {share}")


def _check_device(device: str) -> None:
    """A device torch knows and this machine has (checked before any model loads)."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise UserError(f"unknown device '{device}'; pass --device cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"device '{device}' needs CUDA, which this machine lacks; "
                            "pass --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UserError(f"device '{device}': this machine has {torch.cuda.device_count()} "
                            "CUDA device(s); pass --device cuda:0 or cpu")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"device '{device}' is not available here; pass --device cpu")
