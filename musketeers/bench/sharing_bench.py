"""What ``Policy``'s sharing saves (``Policy._shared_prefill``, ``teacher_forced``): the same
passes with it off (``Policy.share = False``: every prompt's tokens, completions padded to the
batch's longest) and on, alternating in one process on one policy.

Rows: the log-prob passes of one pocket GRPO step (reference forward, then policy forward and
backward, over 4 prompts × G sampled completions), and a greedy evaluation batch of 64 val
prompts. Each pair also says whether the two agree: the largest |Δ log p| and whether the
greedy completions are identical, so a speed-up that changed what is computed shows.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from musketeers.bench.machine import set_threads

log = logging.getLogger("musketeers.bench")

# the pocket regime's step (musketeers.budgets.BUDGETS["pocket"]) and evaluation batch
PROMPTS, GROUP, NEW_TOKENS, EVAL_BATCH = 4, 8, 32, 64


def _passes(policy, prompts, context, completions) -> tuple[float, float, torch.Tensor]:
    t0 = time.perf_counter()
    policy.completion_logprobs(prompts, context, completions, reference=True)
    t1 = time.perf_counter()
    leaf = context.detach().requires_grad_(True)
    logp, mask = policy.completion_logprobs(prompts, leaf, completions)
    (logp.sum() / mask.sum()).backward()
    t2 = time.perf_counter()
    policy.model.zero_grad(set_to_none=True)
    return t1 - t0, t2 - t1, logp.detach()


def bench_sharing(policy_name: str, task: str, reps: int, warmup: int, *, prompts: int = PROMPTS,
                  group: int = GROUP, new_tokens: int = NEW_TOKENS,
                  eval_batch: int = EVAL_BATCH) -> dict[str, Any]:
    """Alternating off/on pairs (the order flips each rep): seconds per mode, agreement."""
    from musketeers.config import resolve_config
    from musketeers.run.build import build_policy
    from musketeers.tasks import build_items

    threads = set_threads()
    cfg = resolve_config(overrides={"budget": "pocket", "policy": policy_name, "task": task,
                                    "method": "single", "device": "cpu"})
    policy = build_policy(cfg)
    steps = warmup + reps
    train = policy.encode_prompts(build_items(task, "train", limit=prompts * steps))
    val = sorted(policy.encode_prompts(build_items(task, "val", limit=eval_batch)), key=len)
    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {"ref_s": {}, "policy_s": {}, "eval_s": {}, "max_dlogp": [],
                           "eval_identical": [], "completion_len": [], "threads": threads,
                           "policy": cfg.policy, "dtype": str(policy.dtype)}
    for k in ("ref_s", "policy_s", "eval_s"):
        out[k] = {"off": [], "on": []}
    for step in range(steps):
        batch = train[prompts * step: prompts * (step + 1)]
        # C as a fresh adapter gives it: small vectors in m = cfg.latents positions
        context = 0.02 * torch.randn(prompts, cfg.latents, policy.embed_dim, generator=gen)
        completions = policy.generate(batch, context, group_size=group,
                                      max_new_tokens=new_tokens, generator=gen)
        logps, evals, secs = {}, {}, {}
        for mode in ("off", "on") if step % 2 == 0 else ("on", "off"):
            policy.share = mode == "on"
            ref_s, pol_s, logps[mode] = _passes(policy, batch, context, completions)
            t0 = time.perf_counter()
            evals[mode] = policy.generate(val, None, group_size=1, max_new_tokens=new_tokens,
                                          greedy=True)
            eval_s = time.perf_counter() - t0
            secs[mode] = ref_s + pol_s + eval_s
            if step >= warmup:
                out["ref_s"][mode].append(ref_s)
                out["policy_s"][mode].append(pol_s)
                out["eval_s"][mode].append(eval_s)
        policy.share = True
        # a rep is minutes on a 2-core CPU: say where the section is
        log.info("sharing: %s %d/%d took %.1f s off, %.1f s on",
                 "warm-up" if step < warmup else "repetition",
                 step + 1 if step < warmup else step - warmup + 1,
                 warmup if step < warmup else reps, secs["off"], secs["on"])
        if step >= warmup:
            out["max_dlogp"].append(float((logps["on"] - logps["off"]).abs().max()))
            out["eval_identical"].append(sum(a == b for a, b in
                                             zip(evals["on"], evals["off"], strict=True)))
            out["completion_len"].append(sum(map(len, completions)) / len(completions))
    return out
