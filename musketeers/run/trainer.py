"""The GRPO loop (paper Eq. 4): cached expert vectors → adapter → C → LoRA policy → rewards.

One step, as in the paper's appendix 7:
  1. take the step's ``prompts_per_micro × grad_accum`` prompts from the epoch sampler (every
     train item once per pass) and, per micro-batch, compute C with the adapter and sample G
     completions per prompt in one ``generate`` call; score each with the task's own scorer;
  2. turn the whole update's rewards into advantages (group / leave-one-out, reward
     normalisation, optional dynamic sampling); see ``musketeers.method.advantages``;
  3. old and reference log-probs without grad; μ inner iterations of the clipped GRPO loss,
     accumulated over the micro-batches, then one AdamW update each (grad clip, scheduler);
  4. one ``metrics.jsonl`` row: reward, exact, KL, loss, grad norm, lengths, truncated and
     answered shares, the batch-mean A with its entropy H and per-expert utilisation u_i
     (Eq. 15), wall time.

No expert model is loaded: the pooled vectors of the whole split are read from the cache once.

Under ``torchrun`` each rank samples its share of the step's prompts and the ranks exchange
rewards, lengths, gradients and metrics (``musketeers.runtime.distributed``): N ranks make the same
run as one. Rank 0 alone holds the run folder's lock and writes metrics, logs and checkpoints,
which carry nothing of a rank, so a run resumes with any number of ranks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import warnings
from functools import partial
from typing import Any

import numpy as np
import torch

from musketeers.cache.devices import dtype_name
from musketeers.cache.errors import UserError
from musketeers.cache.progress import progress
from musketeers.config import TrainConfig
from musketeers.method.advantages import assign_advantages
from musketeers.method.context import adapter_context
from musketeers.method.loss_rows import micro_batch_backward
from musketeers.method.methods import Method
from musketeers.method.rollout import (  # noqa: F401  (NonFiniteError: part of this API)
    FaultHook,
    NonFiniteError,
    VectorSource,
    check_finite,
    no_context_scores,
    reference_passes,
    sample,
)
from musketeers.method.warmup import warm_up_adapter, warms_up
from musketeers.run import checkpoint as ckpt
from musketeers.run import runfolder
from musketeers.run.build import PolicyFactory, build_components, fetch_policy, make_optimizer
from musketeers.run.data import SplitData, epoch_rows
from musketeers.run.launch import launched, torch_threads  # noqa: F401  (torch_threads: API)
from musketeers.run.runlog import log_tb, tensorboard
from musketeers.run.step_metrics import merge_parts, metrics_row, step_parts
from musketeers.runtime.distributed import World, check_world  # noqa: F401  (check_world: API)
from musketeers.runtime.machine import cpu_facts
from musketeers.runtime.step_profile import PhaseClock, decode_batches, step_work

log = logging.getLogger("musketeers.train")

def _first_bad_grad(policy, adapter) -> str:
    named = list(policy.model.named_parameters())
    if adapter is not None:
        named += [(f"adapter.{n}", p) for n, p in adapter.named_parameters()]
    for name, p in named:
        if p.grad is not None and not torch.isfinite(p.grad).all():
            return f"gradient of {name}"
    return "gradient norm"


def train_step(cfg: TrainConfig, step: int, policy, adapter, data: SplitData, optimizer,
               scheduler, *, method: Method, fault: FaultHook | None = None,
               vector_source: VectorSource | None = None,
               world: World | None = None) -> dict[str, Any]:
    """One GRPO update (μ inner iterations over ``grad_accum`` micro-batches); its metrics.

    An update in which no group carries a non-zero advantage is skipped (``skip_no_signal``,
    on by default): its only gradient would be the KL term's, ~1e-6 at C ≈ 0, which AdamW
    rescales into lr-sized steps, and weight decay would shrink φ and θ as well. Both move
    the adapter and its routing with no reward at all, which is drift, not learning.

    ``world``: this rank samples its contiguous share of the update's prompts, in
    micro-batches of ``prompts_per_micro``; the ranks' gradients are summed before the step.
    ``method``: the run's, resolved once by its entry.
    """
    world = world or World()
    t0 = time.perf_counter()
    b = cfg.prompts_per_micro
    # the step's plan, once: its rows, this rank's share in micro-batches (rows, positions in
    # the update), and which micro-batches decode together
    rows = epoch_rows(len(data), cfg.seed, step, b * cfg.grad_accum)
    mine = world.shard(len(rows))
    micro = [(rows[i:min(i + b, mine.stop)], list(range(i, min(i + b, mine.stop))))
             for i in range(mine.start, mine.stop, b)]
    together = decode_batches([len(r) for r, _ in micro], cfg.decode_prompts)
    if adapter is not None:
        adapter.train()
    clock = PhaseClock(torch.cuda.synchronize if policy.device.type == "cuda" else None)
    with clock.phase("sample"):
        rollouts = sample(cfg, step, policy, adapter, data, micro, together, fault,
                          vector_source)
    any_kept, signal, denominator = assign_advantages(cfg, step, rollouts, method, world)
    # before the update, so it compares with this step's reward_mean (same weights, prompts)
    without_c = None
    if adapter is not None and cfg.no_context_every and step % cfg.no_context_every == 0:
        scores = world.all_gather(no_context_scores(cfg, step, policy, data, rows[mine],
                                                    list(range(mine.start, mine.stop))))
        without_c = float(np.mean([s for part in scores for s in part]))
    skipped = cfg.skip_no_signal and not signal
    with clock.phase("reference"):
        for r in [] if skipped else rollouts:
            reference_passes(cfg, policy, r)  # none where no group of r enters the loss
    active = [] if skipped else [r for r in rollouts if r.keep.any()]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    losses, kls, norms = [], [], []
    for _ in range(cfg.inner_iters if any_kept and not skipped else 0):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for r in active:
            with clock.phase("forward"):
                context, _ = adapter_context(adapter, r.vectors, r.router, cfg.device,
                                             r.adapter_rng)
            part, kl = micro_batch_backward(cfg, step, policy, r, context, denominator,
                                            fault=fault, phase=clock.phase)
            total += part
            kls.append(kl)
        with clock.phase("backward"):
            world.sum_grads(params)  # each rank's loss is its share of the update's: a sum
        losses.append(world.total(total))
        clip = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        with clock.phase("optimizer"):
            norm = torch.nn.utils.clip_grad_norm_(params, clip)
            if fault is not None:
                norm = fault(step, "grad_norm", norm)
            if not torch.isfinite(norm):
                check_finite(step, _first_bad_grad(policy, adapter), norm)
            norms.append(float(norm))
            optimizer.step()
    with warnings.catch_warnings():  # a skipped update still advances the lr schedule
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
        scheduler.step()
    parts = merge_parts(world.all_gather(step_parts(rollouts, active, kls)))
    row = metrics_row(cfg, step, parts, data.expert_names, losses, norms, optimizer,
                      time.perf_counter() - t0, policy.embedding_rms)
    row["update_skipped"] = skipped
    iters = len(norms)
    row["phase_s"] = clock.seconds
    row["work"] = step_work(rollouts, cfg.latents if adapter is not None else 0, {
        "reference": (int(cfg.beta > 0) + int(cfg.inner_iters > 1)) * bool(active),
        "forward": iters * bool(active)}, cfg.decode_prompts)
    row["loss_zero_var_frac"] = float(np.mean(parts["zero_adv"])) if parts["zero_adv"] else None
    if without_c is not None:
        row["reward_no_context"] = without_c
    return row


# ---------------------------------------------------------------------------------------------
# The run


def train(cfg: TrainConfig, *, resume: bool = False, policy_factory: PolicyFactory | None = None,
          fault: FaultHook | None = None, vector_source: VectorSource | None = None,
          stop_after: int | None = None, plot: bool = True, unverified: bool = False
          ) -> dict[str, Any]:
    """Run (or resume) the training described by ``cfg``; returns the summary.

    ``stop_after`` ends the loop after that many steps in total without finishing the run
    (tests use it to simulate a kill; ``--resume --steps N`` to stop one invocation early);
    ``unverified``, ``--resume-unverified``. ``vector_source`` replaces the cached vectors (the
    ``--live-experts`` benchmark path); ``cfg.live_experts`` without one is refused. The run
    folder is locked throughout (musketeers.run.launch): a second training is refused.
    Under ``torchrun`` every rank calls this with one config (else refused); rank 0 locks.
    """
    if cfg.live_experts and vector_source is None:
        raise UserError("--live-experts is a benchmark-only path; run it through musketeers.bench")
    with launched(cfg, resume, stop_after) as launch:
        world, lead, method, run = launch.world, launch.lead, launch.method, launch.run
        if world.world > 1 and policy_factory is None:
            world.on_rank0(partial(fetch_policy, cfg))  # converted once, before every rank loads it
        data, policy, adapter = build_components(cfg, "train", policy_factory=policy_factory,
                                                 method=method)
        optimizer, scheduler = make_optimizer(cfg, policy, adapter, method)
        # samples come from per-prompt streams (musketeers.method.rollout); the checkpoint format
        # still carries this run-level generator, so checkpoints old and new load alike
        generator = torch.Generator().manual_seed(cfg.seed)
        start = runfolder.start_step(launch, resume, policy, adapter, optimizer, scheduler,
                                     generator, unverified)
        if lead:
            runfolder.begin(cfg, run, launch.fingerprints)
        if start == 0 and warms_up(cfg, adapter, method):  # a resumed run's φ is its checkpoint's
            warm = warm_up_adapter(cfg, policy, adapter, data)  # every rank: the same φ
            if lead:
                with runfolder.disk_errors(run):
                    (run / "warmup.jsonl").write_text("".join(json.dumps(r) + "\n" for r in warm))
        if lead:
            with runfolder.disk_errors(run):  # a full disk is the one-line error, as elsewhere
                # the dtype and device as resolved here (config.yaml keeps `auto`, which means
                # bf16 on one CPU and fp32 on another), and the machine: a grid spans several
                (run / "inputs.json").write_text(json.dumps(
                    {"rows": len(data), "constant_experts": data.constant_experts(),
                     "dtype": dtype_name(policy.dtype), "device": str(policy.device),
                     "ranks": world.world, "machine": cpu_facts()}))
        writer = tensorboard(run) if lead else None
        end = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
        bar_cm = (progress(f"train {run.name}", total=max(end - start, 0), unit="steps") if lead
                  else contextlib.nullcontext(_Quiet()))
        with bar_cm as bar, runfolder.metrics_file(run, lead) as out:
            for step in range(start, end):
                row = train_step(cfg, step, policy, adapter, data, optimizer, scheduler,
                                 method=method, fault=fault, vector_source=vector_source,
                                 world=world)
                if lead:
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
        return world.on_rank0(partial(runfolder.finish, run, cfg.steps, writer,
                                      plot and end == cfg.steps))


class _Quiet:
    """The progress bar of a rank that does not report."""

    def advance(self, n: int) -> None:
        pass
