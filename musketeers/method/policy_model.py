"""What the policy does to the causal LM it wraps: which modules get LoRA, a contiguous input
for the LM head, and plain attention for the teacher-forced log-prob passes on a CPU."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


def target_modules(model: torch.nn.Module, wanted: tuple[str, ...]) -> list[str] | None:
    """The requested LoRA targets when the architecture has them, else None: peft then picks
    its own per-architecture default (e.g. gpt2 → c_attn)."""
    leaves = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    return list(wanted) if all(t in leaves for t in wanted) else None


def contiguous_input(_module, args):
    """Hand the LM head a contiguous input.

    ``logits_to_keep`` slices the hidden states ([N, T, d] → [N, k, d], a strided view), and
    torch's matmul then runs the head as a bmm against the weight expanded and *copied* N
    times: [N, d, V] bf16, 2.6 s per call for SmolLM2 at N = 16 on a 2-core CPU, more than
    the whole prompt prefill. A contiguous copy of the small slice costs microseconds.
    """
    return (args[0].contiguous(), *args[1:])


@contextmanager
def teacher_forced_attention(model: Any, device: torch.device) -> Iterator[None]:
    """Plain ("eager") attention for the log-prob passes on a CPU, the model's own elsewhere.

    torch's fused CPU attention is slow to differentiate with a padding mask: on a 2-core
    CPU (SmolLM2, 16 × 64 completions after ~250-token prompts) its backward took 1.9 s of
    a 9.4 s reference + training pass, and the eager matmul-softmax-matmul saved ~1.7 s of
    it. Both stay as close to an fp32 forward (mean |Δ log p| 0.033 vs 0.036 in bf16).
    Sampling keeps the fused kernel, which is faster there (one query per row).
    """
    base = model.get_base_model()
    before = getattr(base.config, "_attn_implementation", None)
    if device.type != "cpu" or before in (None, "eager"):
        yield
        return
    base.set_attn_implementation("eager")
    try:
        yield
    finally:
        base.set_attn_implementation(before)
