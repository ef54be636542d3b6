"""Each phase of a training step against what the machine can do (its roofline).

A phase's *ideal* time is what its work would take at the machine's measured limits: FLOPs at
the matmul ceiling of the dtype in use (``bench.matmul``), bytes at the measured copy
bandwidth (``copy_bandwidth``), whichever is slower. Its *share* of the roofline is ideal ÷
measured: 100 % means the phase runs as fast as the hardware allows.

The work comes from the step's own counts (``musketeers.runtime.step_profile.step_work``) and the
policy's shape (``model_shape``):

- sampling: the shared prefix [x ‖ C] once per group (compute: 2·P FLOPs per token plus
  attention), then decoding, where each step reads every weight once for all B·G rows plus
  each row's KV cache (memory), and does 2·P FLOPs per row (compute);
- a log-prob pass (reference, loss forward): each group's prefix once, its G completions
  against the prefix's KV (``method.teacher_forced``): 2·P FLOPs per token, the LM
  head only on the completions' tokens, causal attention 2·L·d per unit of n² (``step_work``);
- backward: the base weights are frozen (LoRA), so only input gradients flow: one forward's
  FLOPs, plus one more forward where gradient checkpointing recomputes activations.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from musketeers.bench.machine import median


def copy_bandwidth(mib: int = 256, reps: int = 3, min_seconds: float = 0.5,
                   device: str = "cpu") -> list[float]:
    """Bytes/s of ``dst.copy_(src)`` over ``mib`` MiB (read + write counted), per repetition:
    the memory roofline's slope."""
    n = mib * 2**20 // 4
    src, dst = torch.rand(n, device=device), torch.empty(n, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    dst.copy_(src)
    sync()
    rates = []
    for _ in range(reps):
        k, t0 = 0, time.perf_counter()
        while k == 0 or (elapsed := time.perf_counter() - t0) < min_seconds:
            dst.copy_(src)
            sync()
            k += 1
        rates.append(2 * src.numel() * src.element_size() * k / elapsed)
    return rates


@dataclass(frozen=True)
class ModelShape:
    """What the roofline needs of a causal LM."""

    linear: int  # parameters of the decoder's matmuls (not embeddings, not the LM head)
    head: int  # the LM head's parameters (vocab × d), read even when tied to the embeddings
    layers: int
    hidden: int
    kv_dim: int  # key/value heads × head dim
    element_bytes: int
    checkpointing: bool


def model_shape(model: Any) -> dict[str, Any]:
    """The shape of ``model`` (a transformers model, PEFT-wrapped or not), as a dict."""
    cfg = model.config
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    head = out.weight if out is not None else emb
    tied = head.data_ptr() == emb.data_ptr()
    total = sum(p.numel() for p in model.parameters())
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    return asdict(ModelShape(
        linear=total - emb.numel() - (0 if tied else head.numel()), head=head.numel(),
        layers=cfg.num_hidden_layers, hidden=heads * head_dim, kv_dim=kv_heads * head_dim,
        element_bytes=emb.element_size(),
        checkpointing=bool(getattr(model, "is_activation_checkpointing", None)
                           if hasattr(model, "is_activation_checkpointing")
                           else getattr(model, "is_gradient_checkpointing", False))))


def _pass_flops(s: ModelShape, w: dict[str, int]) -> float:
    """FLOPs of one log-prob pass over the step's kept sequences."""
    return (2 * s.linear * w["logprob_tokens"] + 2 * s.head * w["logprob_completion_tokens"]
            + 2 * s.layers * s.hidden * w["logprob_attention"])


def ideal_seconds(shape: dict[str, Any], work: dict[str, int], flops_per_s: float,
                  bytes_per_s: float) -> dict[str, tuple[float, str]]:
    """{phase: (ideal seconds, what bounds it)} for one step's ``work``."""
    s = ModelShape(**shape)
    prefill = (2 * s.linear * work["prefill_tokens"]
               + 2 * s.layers * s.hidden * work["prefill_attention"])
    decode_flops = (2 * (s.linear + s.head) * work["decode_tokens"]
                    + 4 * s.layers * s.hidden * work["decode_context"])
    decode_bytes = s.element_bytes * ((s.linear + s.head) * work["decode_steps"]
                                      + 2 * s.layers * s.kv_dim * work["decode_context"])
    memory, compute = decode_bytes / bytes_per_s, decode_flops / flops_per_s
    one = _pass_flops(s, work) / flops_per_s
    return {
        "sample": (prefill / flops_per_s + max(memory, compute),
                   "decode memory" if memory > compute else "decode compute"),
        "reference": (work.get("reference_passes", 0) * one, "compute"),
        "forward": (work.get("forward_passes", 0) * one, "compute"),
        "backward": (work.get("forward_passes", 0) * one * (1 + s.checkpointing), "compute"),
    }


def phase_shares(shape: dict[str, Any], rows: list[tuple[dict[str, float], dict[str, int]]],
                 flops_per_s: float, bytes_per_s: float) -> dict[str, dict[str, Any]]:
    """Per phase over the timed steps ``rows`` ((phase_s, work) each): the median measured
    and ideal seconds, the share ideal ÷ measured (of the summed steps) and the bound."""
    out: dict[str, dict[str, Any]] = {}
    for phase in ("sample", "reference", "forward", "backward"):
        measured = [p[phase] for p, _ in rows]
        ideal = [ideal_seconds(shape, w, flops_per_s, bytes_per_s)[phase] for _, w in rows]
        total = sum(measured)
        out[phase] = {"measured_s": median(measured), "ideal_s": median([i for i, _ in ideal]),
                      "share": sum(i for i, _ in ideal) / total if total > 0 else None,
                      "bound": ideal[0][1] if ideal else ""}
    return out


# Datasheet peaks (dense, no sparsity) for the paper-scale estimate: no GPU was measured
# here, so the first GPU run is judged against these; ``make bench`` measures its own.
GPUS = {"h100": {"name": "H100 SXM", "bf16_flops": 989e12, "bytes_per_s": 3.35e12},
        "h200": {"name": "H200 SXM", "bf16_flops": 989e12, "bytes_per_s": 4.8e12}}


def shape_of_config(shape: dict[str, Any], element_bytes: int = 2) -> dict[str, Any]:
    """``model_shape`` of a Qwen2 config (``bench.gpu.PAPER_SHAPES``), built on the meta
    device: no weights are allocated."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("qwen2", tie_word_embeddings=True, **shape)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {**model_shape(model), "element_bytes": element_bytes}


def budget_work(budget: dict[str, Any], prompt_len: int, completion_len: int,
                latents: int) -> dict[str, int]:
    """One update's ``step_work`` for a budget, every completion ``completion_len`` tokens:
    counted by ``step_work`` itself, on rollouts of that shape."""
    from types import SimpleNamespace

    from musketeers.runtime.step_profile import step_work

    micro, g = budget["prompts_per_micro"], budget["group_size"]
    rollout = SimpleNamespace(prompt_ids=[[0] * prompt_len] * micro,
                              completions=[[0] * completion_len] * (micro * g),
                              keep=torch.ones(micro, dtype=torch.bool))
    return step_work([rollout] * budget["grad_accum"], latents, {"reference": 1, "forward": 1},
                     budget.get("decode_prompts", 0))


def main(argv: list[str] | None = None) -> None:
    import argparse

    from musketeers.bench.gpu import PAPER_SHAPES
    from musketeers.budgets import BUDGETS

    p = argparse.ArgumentParser(description="What one paper-budget step should cost on a GPU, "
                                "by the roofline (datasheet peaks; no GPU needed).")
    p.add_argument("--gpu", choices=sorted(GPUS), default="h100")
    p.add_argument("--policy", default="qwen2.5-3b (random weights)", choices=sorted(PAPER_SHAPES))
    p.add_argument("--prompt-len", type=int, default=240, help="mean prompt tokens (the "
                   "paper's arithmetic prompts under DeepSeekZero measure 200-280)")
    p.add_argument("--completion-len", type=int, default=None,
                   help="tokens per completion (default: the budget's max_new_tokens)")
    p.add_argument("--latents", type=int, default=8)
    args = p.parse_args(argv)
    gpu, budget = GPUS[args.gpu], BUDGETS["paper"]
    shape = shape_of_config(PAPER_SHAPES[args.policy])
    work = budget_work(budget, args.prompt_len, args.completion_len or budget["max_new_tokens"],
                       args.latents)
    ideal = ideal_seconds(shape, work, gpu["bf16_flops"], gpu["bytes_per_s"])
    print(f"paper budget on one {gpu['name']} (bf16, {gpu['bf16_flops'] / 1e12:.0f} TFLOP/s, "
          f"{gpu['bytes_per_s'] / 1e12:.2f} TB/s), policy {args.policy}: "
          f"{work['decode_rows']} completions of {work['decode_tokens'] // work['decode_rows']} "
          f"tokens, prompts of {args.prompt_len} + {args.latents} context tokens")
    for phase, (seconds, bound) in ideal.items():
        print(f"  {phase:<10} {seconds:8.3f} s  ({bound})")
    total = sum(s for s, _ in ideal.values())
    print(f"  {'step':<10} {total:8.3f} s at the roofline; {budget['steps']} steps: "
          f"{total * budget['steps'] / 60:.1f} min")


if __name__ == "__main__":
    main()
