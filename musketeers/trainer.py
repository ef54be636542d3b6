"""The GRPO loop (paper Eq. 4): cached expert vectors → adapter → C → LoRA policy → rewards.

One step, as in the paper's appendix 7:
  1. sample ``prompts_per_micro × grad_accum`` prompts (seeded) and, per micro-batch, compute C
     with the adapter and sample G completions per prompt in one ``generate`` call;
  2. score each completion with the task's own scorer, turn rewards into advantages
     (group / leave-one-out, reward normalisation, optional dynamic sampling);
  3. old and reference log-probs without grad; μ inner iterations of the clipped GRPO loss,
     accumulated over the micro-batches, then one AdamW update each (grad clip, scheduler);
  4. one ``metrics.jsonl`` row: reward, accuracy, KL, loss, grad norm, lengths, the batch-mean
     A with its entropy H and per-expert utilisation u_i (Eq. 15), wall time.

No expert model is loaded: the pooled vectors of the whole split are read from the cache once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from musketeers import checkpoint as ckpt
from musketeers import runfolder
from musketeers.build import PolicyFactory, build_components, make_optimizer
from musketeers.cache.errors import UserError
from musketeers.cache.items import Item
from musketeers.cache.progress import progress
from musketeers.config import TrainConfig
from musketeers.data import SplitData
from musketeers.grpo import (
    compute_advantages,
    grpo_loss,
    loss_denominator,
    zero_variance_groups,
)
from musketeers.routing import batch_routing_stats
from musketeers.runlog import (
    log_tb,
    mean_or_none,
    read_metrics,
    summarize,
    tensorboard,
)

log = logging.getLogger("musketeers.train")

# (step, tensor name, tensor) -> tensor: lets tests inject faults (NaN) at named points.
FaultHook = Callable[[int, str, torch.Tensor], torch.Tensor]
# (items, rows) -> pooled vectors: the benchmark's --live-experts path computes them live.
VectorSource = Callable[[list[Item], torch.Tensor], list[torch.Tensor]]
# (CPU generator state, CUDA generator state or None): what the adapter's random draws use
RngState = tuple[torch.Tensor, torch.Tensor | None]


class NonFiniteError(UserError):
    """A NaN/inf in the loss, rewards or gradients: the run stops, last checkpoint kept."""


@dataclass
class Rollout:
    """One micro-batch of sampled groups, everything the inner iterations need."""

    items: list[Item]
    vectors: list[torch.Tensor]
    router: torch.Tensor | None
    prompt_ids: Any
    completions: list[list[int]]  # B·G, group-major (row b·G + g)
    rewards: torch.Tensor  # [B, G]
    adv: torch.Tensor  # [B, G]
    keep: torch.Tensor  # [B] bool: groups that enter the loss
    old_logp: torch.Tensor | None  # [B'·G, T] for kept groups (None when μ = 1)
    ref_logp: torch.Tensor | None
    attention: torch.Tensor | None  # [B, m, n]
    adapter_rng: RngState | None = None  # RNG states before the rollout's adapter call


def _check_finite(step: int, name: str, t: torch.Tensor) -> None:
    if not torch.isfinite(t).all():
        raise NonFiniteError(f"step {step}: {name} is not finite ({t.flatten()[:4].tolist()}); "
                             "run stopped, the last good checkpoint is kept")


def _sample_rows(n: int, total: int, generator: torch.Generator) -> torch.Tensor:
    """``total`` distinct rows when the split allows (fresh permutations otherwise)."""
    perms = [torch.randperm(n, generator=generator) for _ in range(-(-total // n))]
    return torch.cat(perms)[:total]


def rng_snapshot(device: str) -> RngState:
    """The generator states the adapter's random draws (hard routing's Gumbel noise) come
    from: the CPU's, and the GPU's when the adapter runs there."""
    dev = torch.device(device)
    return torch.get_rng_state(), torch.cuda.get_rng_state(dev) if dev.type == "cuda" else None


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


def _kept(rollout: Rollout, context: torch.Tensor | None):
    """Prompt ids, context and completions of the groups in the loss."""
    keep = rollout.keep.tolist()
    if all(keep):
        return rollout.prompt_ids, context, rollout.completions
    g = len(rollout.completions) // len(keep)
    rows = [b for b, k in enumerate(keep) if k]
    prompts = [rollout.prompt_ids[b] for b in rows]
    ctx = context[rows] if context is not None else None
    comps = [rollout.completions[b * g + j] for b in rows for j in range(g)]
    return prompts, ctx, comps


def rollout(cfg: TrainConfig, step: int, policy, adapter, data: SplitData, rows: torch.Tensor,
            generator: torch.Generator, fault: FaultHook | None,
            vector_source: VectorSource | None) -> Rollout:
    """Sample G completions for each prompt of ``rows``, score them, and fix the advantages."""
    items, vectors, router = data.batch(rows)
    if vector_source is not None:
        vectors = vector_source(items, rows)
    prompt_ids = policy.encode_prompts(items)
    adapter_rng = rng_snapshot(cfg.device)
    with torch.no_grad():
        context, attention = adapter_context(adapter, vectors, router, cfg.device)
        completions = policy.generate(
            prompt_ids, context, group_size=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature, greedy=False, generator=generator)
        texts = [policy.decode(c) for c in completions]
        g = cfg.group_size
        rewards = torch.tensor([[policy_score(items[b], texts[b * g + j]) for j in range(g)]
                                for b in range(len(items))], dtype=torch.float32)
        if fault is not None:
            rewards = fault(step, "rewards", rewards)
        _check_finite(step, "rewards", rewards)
        adv = compute_advantages(rewards, advantage=cfg.advantage, reward_norm=cfg.reward_norm,
                                 sources=[it.source for it in items])
        keep = torch.ones(len(items), dtype=torch.bool)
        if cfg.dynamic_sampling:
            keep = ~zero_variance_groups(rewards)
        r = Rollout(items, vectors, router, prompt_ids, completions, rewards, adv, keep,
                    None, None, attention, adapter_rng)
        if keep.any():
            prompts, ctx, comps = _kept(r, context)
            if cfg.inner_iters > 1:
                r.old_logp, _ = policy.completion_logprobs(prompts, ctx, comps,
                                                           temperature=cfg.temperature)
            if cfg.beta > 0:
                r.ref_logp, _ = policy.completion_logprobs(prompts, ctx, comps, reference=True,
                                                           temperature=cfg.temperature)
    return r


def no_context_reward(cfg: TrainConfig, step: int, policy, data: SplitData,
                      rows: torch.Tensor) -> float:
    """Mean reward of π_θ(y | x) — the policy alone, no context positions — on the step's own
    prompts (the paper's Figure 5 against π_θ(y | [x ‖ C])).

    Sampled from a generator seeded by (seed, step), never from the training streams, so a
    run that logs it trains exactly like one that does not, and resume stays exact.
    """
    items, _, _ = data.batch(rows)
    generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step + 1)
    with torch.no_grad():
        completions = policy.generate(
            policy.encode_prompts(items), None, group_size=cfg.group_size,
            max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, greedy=False,
            generator=generator)
    g = cfg.group_size
    scores = [policy_score(items[i // g], policy.decode(c)) for i, c in enumerate(completions)]
    return float(np.mean(scores))


def policy_score(item: Item, text: str) -> float:
    from musketeers.tasks import score

    return float(score(item, text))


def _first_bad_grad(policy, adapter) -> str:
    named = list(policy.model.named_parameters())
    if adapter is not None:
        named += [(f"adapter.{n}", p) for n, p in adapter.named_parameters()]
    for name, p in named:
        if p.grad is not None and not torch.isfinite(p.grad).all():
            return f"gradient of {name}"
    return "gradient norm"


def train_step(cfg: TrainConfig, step: int, policy, adapter, data: SplitData, optimizer,
               scheduler, generator: torch.Generator, fault: FaultHook | None = None,
               vector_source: VectorSource | None = None) -> dict[str, Any]:
    """One GRPO update (μ inner iterations over ``grad_accum`` micro-batches); its metrics."""
    t0 = time.perf_counter()
    b = cfg.prompts_per_micro
    rows = _sample_rows(len(data), b * cfg.grad_accum, generator)
    if adapter is not None:
        adapter.train()
    rollouts = [rollout(cfg, step, policy, adapter, data, rows[i * b:(i + 1) * b], generator,
                        fault, vector_source) for i in range(cfg.grad_accum)]
    # before the update, so it compares with this step's reward_mean (same weights, prompts)
    without_c = None
    if adapter is not None and cfg.no_context_every and step % cfg.no_context_every == 0:
        without_c = no_context_reward(cfg, step, policy, data, rows)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    active = [r for r in rollouts if r.keep.any()]
    losses, kls, norms = [], [], []
    # one normaliser for the whole update, so that its micro-batches' losses sum to the loss
    # of the batch they split (not a mean of per-micro-batch token means)
    denominator = loss_denominator([len(c) for r in active for c in _kept(r, None)[2]],
                                   cfg.loss_norm, cfg.max_new_tokens)
    for _ in range(cfg.inner_iters if active else 0):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for r in active:
            context, _ = adapter_context(adapter, r.vectors, r.router, cfg.device, r.adapter_rng)
            prompts, ctx, comps = _kept(r, context)
            logp, mask = policy.completion_logprobs(prompts, ctx, comps,
                                                     temperature=cfg.temperature)
            old = r.old_logp if r.old_logp is not None else logp.detach()
            adv = r.adv[r.keep].reshape(-1).to(logp.device)
            loss, stats = grpo_loss(
                logp.float(), old.float(), None if r.ref_logp is None else r.ref_logp.float(),
                adv, mask, beta=cfg.beta, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                loss_norm=cfg.loss_norm, max_len=cfg.max_new_tokens, denominator=denominator)
            if fault is not None:
                loss = fault(step, "loss", loss)
            _check_finite(step, "loss", loss.detach())
            loss.backward()
            total += float(loss.detach())
            kls.append(stats["kl"])
        losses.append(total)
        clip = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, clip)
        if fault is not None:
            norm = fault(step, "grad_norm", norm)
        if not torch.isfinite(norm):
            _check_finite(step, _first_bad_grad(policy, adapter), norm)
        norms.append(float(norm))
        optimizer.step()
    scheduler.step()
    row = _metrics(cfg, step, rollouts, data.expert_names, losses, kls, norms, optimizer,
                   time.perf_counter() - t0)
    if without_c is not None:
        row["reward_no_context"] = without_c
    return row


def _metrics(cfg, step, rollouts, names, losses, kls, norms, optimizer, wall) -> dict[str, Any]:
    rewards = torch.cat([r.rewards.flatten() for r in rollouts])
    lengths = [len(c) for r in rollouts for c in r.completions]
    zero_var = torch.cat([zero_variance_groups(r.rewards) for r in rollouts]).float()
    row: dict[str, Any] = {
        "step": step + 1,
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std(correction=0)),
        # accuracy: the fraction of completions scoring 1.0 (reward_mean is the mean score)
        "accuracy": float((rewards >= 1.0).float().mean()),
        "kl": mean_or_none(kls),
        "loss": mean_or_none(losses),
        "grad_norm": mean_or_none(norms),
        "completion_len": float(np.mean(lengths)),
        "zero_var_frac": float(zero_var.mean()),
        "lr": optimizer.param_groups[0]["lr"],
        "time_s": wall,
    }
    attention = [r.attention for r in rollouts if r.attention is not None]
    if attention:
        row.update(batch_routing_stats(torch.cat(attention), names))
    return row


# ---------------------------------------------------------------------------------------------
# The run


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


def train(cfg: TrainConfig, *, resume: bool = False, policy_factory: PolicyFactory | None = None,
          fault: FaultHook | None = None, vector_source: VectorSource | None = None,
          stop_after: int | None = None, plot: bool = True) -> dict[str, Any]:
    """Run (or resume) the training described by ``cfg``; returns the summary.

    ``stop_after`` ends the loop after that many steps in total without finishing the run
    (tests use it to simulate a kill; ``--resume --steps N`` to stop one invocation early).
    ``vector_source`` replaces the cached vectors (the ``--live-experts`` benchmark path);
    ``cfg.live_experts`` without one is refused. The run folder is locked throughout
    (musketeers.runfolder), so a second training of it is refused.
    """
    if cfg.live_experts and vector_source is None:
        raise UserError("--live-experts is a benchmark-only path; run it through musketeers.bench")
    with torch_threads(cfg.threads), runfolder.locked(cfg.run_path()):
        return _train(cfg, resume, policy_factory, fault, vector_source, stop_after, plot)


def _train(cfg: TrainConfig, resume: bool, policy_factory: PolicyFactory | None,
           fault: FaultHook | None, vector_source: VectorSource | None,
           stop_after: int | None, plot: bool) -> dict[str, Any]:
    run = cfg.run_path()
    metrics_path = run / "metrics.jsonl"
    fingerprints = runfolder.prepare(cfg, run, resume)
    data, policy, adapter = build_components(cfg, "train", policy_factory=policy_factory)
    optimizer, scheduler = make_optimizer(cfg, policy, adapter)
    generator = torch.Generator().manual_seed(cfg.seed)
    start = runfolder.restore(run, resume, policy.model, adapter, optimizer, scheduler, generator)
    runfolder.begin(cfg, run, fingerprints)
    writer = tensorboard(run)
    end = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    with runfolder.disk_errors(run):
        out = open(metrics_path, "a")  # noqa: SIM115 - closed by the with below
    with progress(f"train {run.name}", total=max(end - start, 0), unit="steps") as bar, out:
        for step in range(start, end):
            try:
                row = train_step(cfg, step, policy, adapter, data, optimizer, scheduler,
                                 generator, fault=fault, vector_source=vector_source)
            except NonFiniteError as exc:
                # train_step counts steps from 0, metrics.jsonl from 1: name the step the log
                # would have given the failed row
                head, sep, rest = str(exc).partition(": ")
                if sep and head == f"step {step}":
                    raise NonFiniteError(f"step {step + 1}: {rest}") from None
                raise
            with runfolder.disk_errors(run):
                out.write(json.dumps(row) + "\n")
                out.flush()
                if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
                    ckpt.save_checkpoint(run, step + 1, policy.model, adapter, optimizer,
                                         scheduler, generator)
            if writer is not None:
                log_tb(writer, row)
            log.debug("step %d reward %.3f kl %s", row["step"], row["reward_mean"], row["kl"])
            bar.advance(1)
    if writer is not None:
        writer.close()
    with runfolder.disk_errors(run):
        summary = summarize(run, cfg.steps)
        if plot and end == cfg.steps:
            from musketeers.plots import plot_run

            plot_run(read_metrics(metrics_path), run / "routing.png", title=run.name)
    return summary
