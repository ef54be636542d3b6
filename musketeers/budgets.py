"""Budget presets: the size of a run (steps, batch, tokens, evaluation items), never its
method. A grid's ``budget`` and ``train --budget`` pick one; the YAML and options override it."""

from __future__ import annotations

from typing import Any

BUDGETS: dict[str, dict[str, Any]] = {
    # three tiny steps (the fewest with a defined Spearman ρ): the path end to end in seconds
    "smoke": dict(steps=3, prompts_per_micro=2, grad_accum=1, group_size=2, max_new_tokens=16,
                  save_every=1, eval_limit=8, dtype="float32"),
    # the pocket policy (Qwen2.5-Coder-0.5B) on a 2-core CPU, sized so a run gets a GRPO
    # signal and the main comparison fits one night (docs/benchmarks-history.md, "a regime
    # with a signal"); the adapter learns at a tenth of the paper's lr because a first Adam
    # step at 1e-4 moved C far enough to stop the policy (docs/benchmarks-history.md, "the
    # adapter's learning rate: 1e-5 for the pocket grid"); the loss runs two groups at a time,
    # which keeps the step under 6 GiB (5.3; 6.8 in one pass) for 3 % more loss-pass tokens
    # (BENCHMARKS.md, "memory of the pocket step")
    "pocket": dict(steps=20, prompts_per_micro=4, grad_accum=1, group_size=8,
                   max_new_tokens=32, save_every=10, eval_limit=400, adapter_lr=1e-5,
                   dtype="auto", loss_rows=16),
    # the paper: 500 steps, 4 x 8 = 32 prompts per update, G = 8, 128 new tokens; all 32
    # prompts sampled as one batch (4.0x the step on an H200), each decode step replayed as
    # a CUDA graph (1.4x more on an H100; BENCHMARKS.md, "the paper step on one GPU")
    "paper": dict(steps=500, prompts_per_micro=4, grad_accum=8, group_size=8, decode_prompts=32,
                  decode_graphs=True,
                  max_new_tokens=128, beta=0.04, lr=1e-4, adapter_lr=1e-4, weight_decay=0.01,
                  grad_clip=1.0, save_every=50, eval_limit=None, dtype="auto"),
}
