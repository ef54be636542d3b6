"""Training step, pocket budget, default team: experts read from the cache vs computed live.

Each side runs in its own child process (``worker``) so its peak RSS is its own. Step times
come from a third child that alternates cached and live steps (cached, live, cached, …) on
one policy: this machine's speed drifts by up to 1.5× within an hour, more than the experts'
share of a step, and adjacent steps see the same machine. The live
side loads every expert of the team and, for each micro-batch, runs the cache's own row
computation (``compute_rows``: backbone, Eq. 5 poolings) on the step's prompts, feeding the
trainer through its ``vector_source`` hook; everything else (policy, adapter, sampling,
GRPO update) is the same code. Both sides sample every completion to ``max_new_tokens``
(eos suppressed until then) so they do exactly the same work whatever the vectors are.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from musketeers.bench.machine import peak_rss_mib, set_threads
from musketeers.cache.devices import dtype_name
from musketeers.cache.items import Item

# reader pooling name -> compute_rows array (index -1 of layers_mean = the last layer's mean)
POOLED = {"last": "last", "first_token": "first", "random_token": "random"}


def force_full_length(policy) -> None:
    """Make every completion exactly ``max_new_tokens`` long (equal work across runs): with no
    eos ids, nothing ends a row early and nothing is cut from it."""
    policy.eos_ids = []


class LiveExperts:
    """The trainer's ``vector_source``: each step's pooled vectors computed by the experts."""

    def __init__(self, specs, pooling: str, device: str, dtype: torch.dtype, seed: int):
        from musketeers.cache.experts import load_expert
        from musketeers.cache.precompute import PrecomputeConfig

        if pooling not in POOLED and pooling != "mean":
            raise ValueError(f"live experts support poolings {[*POOLED, 'mean']}, not {pooling}")
        self.pooling = pooling
        self.cfg = PrecomputeConfig(device=device, dtype=dtype, seed=seed)
        self.experts = [load_expert(s, device, dtype) for s in specs]
        self.weights_bytes = sum(p.numel() * p.element_size() for m, _ in self.experts
                                 for p in m.parameters())
        self.seconds = 0.0
        self.tokens = [0] * len(self.experts)

    def __call__(self, items: list[Item], rows: torch.Tensor) -> list[torch.Tensor]:
        from musketeers.cache.precompute import compute_rows

        t0 = time.perf_counter()
        out = []
        for i, (model, tok) in enumerate(self.experts):
            arrays, n_tok = compute_rows(model, tok, items, rows.numpy(), self.cfg)
            self.tokens[i] += n_tok
            v = arrays["layers_mean"][:, -1] if self.pooling == "mean" else \
                arrays[POOLED[self.pooling]]
            out.append(torch.from_numpy(np.ascontiguousarray(v)))
        self.seconds += time.perf_counter() - t0
        return out


def train_config(params: dict[str, Any]):
    from musketeers.config import resolve_config

    overrides = {"budget": "pocket", "task": params["task"], "team": params.get("team", "default"),
                 "cache_dir": params["cache_dir"], "run_dir": params["run_dir"],
                 "method": params.get("method", "perceiver"), "device": params["device"],
                 "steps": (params["warmup"] + params["reps"]) * (2 if params.get("paired") else 1),
                 # every step runs its update: a step whose groups all scored alike would
                 # otherwise stop after sampling, and the rows would time the rewards' luck
                 "skip_no_signal": False}
    overrides.update(params.get("overrides", {}))
    return resolve_config(overrides=overrides)


def run_steps(params: dict[str, Any]) -> dict[str, Any]:
    """In a child: build the run, then time ``warmup + reps`` calls of ``train_step``.

    ``live``: the experts compute each step's vectors. ``paired``: the experts are loaded and
    steps alternate cached, live, cached, live, …; ``step_s`` is then the cached steps and
    ``live_step_s`` the live step right after each.
    """
    from musketeers.bench.roofline import model_shape
    from musketeers.cache.devices import resolve_dtype
    from musketeers.method import methods
    from musketeers.run.build import build_components, make_optimizer, team_specs
    from musketeers.run.trainer import train_step

    threads = set_threads()
    cfg = train_config(params)
    method = methods.get(cfg.method)
    data, policy, adapter = build_components(cfg, "train", method=method)
    force_full_length(policy)
    optimizer, scheduler = make_optimizer(cfg, policy, adapter, method)
    source = None
    paired = bool(params.get("paired"))
    if params.get("live") or paired:
        dtype = resolve_dtype(cfg.dtype, cfg.device)
        source = LiveExperts(team_specs(cfg), cfg.pooling, cfg.device, dtype, cfg.seed)
    times, lens, expert_s, profile = [], [], [], []
    for step in range(cfg.steps):
        live = source is not None and (not paired or step % 2 == 1)
        before = source.seconds if live else 0.0
        t0 = time.perf_counter()
        row = train_step(cfg, step, policy, adapter, data, optimizer, scheduler, method=method,
                         vector_source=source if live else None)
        times.append(time.perf_counter() - t0)
        lens.append(row["completion_len"])
        profile.append((row["phase_s"], row["work"]))
        expert_s.append(source.seconds - before if live else 0.0)
    ops = {}
    if params.get("profile"):  # one more step, untimed: the profiler slows what it watches
        from musketeers.bench.phase_ops import PhaseOps

        with PhaseOps() as profiled:
            train_step(cfg, cfg.steps, policy, adapter, data, optimizer, scheduler, method=method)
        ops = {"phase_ops": profiled.by_phase}
    w = params["warmup"]
    paired_rows, live_steps = {}, cfg.steps
    if paired:  # even steps cached, odd steps live
        paired_rows = {"live_step_s": times[2 * w + 1::2], "live_expert_s": expert_s[2 * w + 1::2]}
        times, expert_s, live_steps = times[::2], expert_s[::2], cfg.steps // 2
    prompt_len = float(np.mean([len(p) for p in policy.encode_prompts(data.items)]))
    return {
        "step_s": times[w:], "warmup_s": times[:w], "expert_s": expert_s[w:],
        "profile": profile[w:] if not paired else profile[2 * w::2],
        "shape": model_shape(policy.model),
        "resolved_dtype": dtype_name(policy.dtype),
        "completion_len": lens, "peak_rss_mib": peak_rss_mib(), "threads": threads,
        "policy_params": _frozen_params(policy.model), "prompt_len": prompt_len,
        "context_tokens": cfg.latents if adapter is not None else 0,
        "completions_per_step": cfg.prompts_per_micro * cfg.grad_accum * cfg.group_size,
        "prompts_per_step": cfg.prompts_per_micro * cfg.grad_accum,
        "expert_tokens_per_prompt": [t / max(1, live_steps * cfg.prompts_per_micro *
                                             cfg.grad_accum) for t in source.tokens]
        if source else [],
        "expert_params": [_frozen_params(m) for m, _ in source.experts] if source else [],
        "experts_weights_mib": source.weights_bytes / 2**20 if source else 0.0,
        "inner_iters": cfg.inner_iters, "beta": cfg.beta, "dtype": cfg.dtype,
        "policy": cfg.policy, "team": cfg.team, **paired_rows, **ops,
    }


def _frozen_params(model) -> int:
    from musketeers.bench.precompute_bench import non_embedding_params

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return non_embedding_params(base)


def expert_flop_share(r: dict[str, Any]) -> float:
    """Experts' share of a live step's FLOPs (2·N·tokens per forward, 4·N·tokens fwd+bwd).

    Policy per step, with T = prompts × (prompt + context) + completions × completion (every
    policy pass runs each group's prefix once: ``Policy``'s shared-prefix prefill and
    log-probs): sampling 2·N_p·T, the reference log-probs (β > 0) 2·N_p·T and μ inner
    iterations of forward+backward 4·N_p·T each. Experts: 2·N_i·(their prompt tokens) per
    prompt. An estimate: attention's T² terms and the adapter are left out.
    """
    comp = float(np.mean(r["completion_len"]))
    prefix = r["prompt_len"] + r["context_tokens"]
    t = r["prompts_per_step"] * prefix + r["completions_per_step"] * comp
    passes = 2 + (2 if r["beta"] > 0 else 0) + 4 * r["inner_iters"]
    policy = passes * r["policy_params"] * t
    experts = sum(2.0 * n * tok * r["prompts_per_step"]
                  for n, tok in zip(r["expert_params"], r["expert_tokens_per_prompt"],
                                    strict=True))
    return experts / (experts + policy)


def bench_train(cache_dir: Path, run_root: Path, task: str, device: str, reps: int, warmup: int,
                overrides: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    from musketeers.bench.machine import run_child

    out = {}
    for side in ("cached", "live", "paired"):
        params = {"task": task, "cache_dir": str(cache_dir), "run_dir": str(run_root / side),
                  "device": device, "reps": reps, "warmup": warmup, "live": side == "live",
                  "paired": side == "paired", "overrides": overrides or {}}
        if side != "paired":  # these two are for peak RSS: one step each is enough
            params.update(reps=1, warmup=0)
        out[side] = run_child("train", params)
    return out
