"""The GPU check: one prepared run, the first time a GPU is lent, of what the CPU cannot show.

    python -m musketeers.bench.gpu_check OUT --model-dir DIR
    make gpu-check GPU_OUT=OUT MODEL_DIR=DIR

On one CUDA device, with random weights of the paper's shapes (``bench.gpu.PAPER_SHAPES``):

1. the device's roofline (bf16 matmul, copy bandwidth), measured;
2. the paper-budget step and each of its phases against it (``bench.gpu_step``), with the
   peak GPU memory (``torch.cuda.max_memory_allocated``);
3. the agreement of the device's log-probs with the CPU's, on a small random model of the
   same architecture (float32 and bfloat16 on the device against float32 on the CPU).

Each part's result is written to ``OUT/gpu_check.json`` and ``OUT/gpu_check.md`` as soon as
it ends, so a part that fails, or a lease that ends, keeps the earlier ones. ``--device cpu``
runs the same parts on tiny shapes, for the tests. The store is the tiny roster's fixture
store (tracked, so it travels with the working tree); ``DIR`` holds the policy's config.json
and tokenizer, no weights.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
PAPER_SHAPE = "qwen2.5-3b (random weights)"
# the agreement's small model: the policy's architecture, a few layers, its own vocabulary
SMALL = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)


def roofline(device: str) -> dict[str, float]:
    """The device's matmul ceiling and copy bandwidth; tiny sizes on a CPU (the test's run)."""
    if device == "cuda":
        from musketeers.bench.gpu_step import device_roofline

        return device_roofline("cuda")
    from musketeers.bench.machine import median
    from musketeers.bench.matmul import matmul_flops
    from musketeers.bench.roofline import copy_bandwidth

    return {"bf16_flops": median(matmul_flops(256, torch.float32, "cpu", 1, 0.0)),
            "bytes_per_s": median(copy_bandwidth(16, 1, 0.0, device="cpu"))}


def paper_step(args: argparse.Namespace, roof: dict[str, float]) -> dict[str, Any]:
    """The budget's step on the random shape, its phases against ``roof``, peak GPU memory."""
    from musketeers.bench.gpu_step import MODEL_DIR_ENV, measure, report

    os.environ[MODEL_DIR_ENV] = str(args.model_dir)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    r = measure(args.store, args.out / "runs", args.task, args.budget, args.shape, args.reps,
                args.warmup, device=args.device,  # the budget's own decode settings
                decode_graphs=None if args.device == "cuda" else False)
    summary = report(f"{args.budget}={args.shape}", r, roof)
    return {"budget": args.budget, "shape": args.shape, **summary,
            "peak_gpu_mib": r["peak_gpu_mib"], "completion_len": r["completion_len"],
            "step_s_each": r["step_s"]}


def small_policy(model_dir: Path, device: str, dtype: torch.dtype, seed: int = 0):
    """A small random model of ``model_dir``'s architecture, the same weights for every
    device and dtype (built on the CPU in float32 from one seed, then moved)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from musketeers.cache.experts import load_tokenizer
    from musketeers.method.policy import Policy
    from musketeers.teams import expert_spec

    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    config = type(config)(**{**config.to_dict(), **SMALL, "layer_types": None})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(expert_spec(str(model_dir)))
    policy = Policy(model.to(device=device, dtype=dtype), tokenizer)
    with torch.no_grad():  # LoRA's B is zero at init: perturbed so the policy's own path runs
        torch.manual_seed(seed + 1)
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape) * 0.02)
    return policy


def logprob_agreement(args: argparse.Namespace) -> dict[str, Any]:
    """Log-probs of the same random completions after the same random prompts (8 prompts ×
    G 4 × 64 tokens, 8 context tokens), on the device against the CPU in float32."""
    g = torch.Generator().manual_seed(0)
    vocab = 1000  # token ids every tokenizer of the roster has
    prompts = [torch.randint(10, vocab, (int(n),), generator=g).tolist()
               for n in torch.randint(20, 60, (8,), generator=g)]
    comps = [torch.randint(10, vocab, (int(n),), generator=g).tolist()
             for n in torch.randint(1, 65, (32,), generator=g)]
    cpu = small_policy(args.model_dir, "cpu", torch.float32)
    context = torch.randn(8, 8, cpu.embed_dim, generator=g) * cpu.embedding_rms
    want, mask = cpu.completion_logprobs(prompts, context, comps)
    out: dict[str, Any] = {"prompts": 8, "completions": len(comps), "tokens": int(mask.sum())}
    for dtype in (torch.float32, torch.bfloat16):
        got, _ = small_policy(args.model_dir, args.device, dtype).completion_logprobs(
            prompts, context.to(args.device), comps)
        diff = (got.detach().cpu() - want.detach()).abs()[mask.bool()]
        out[str(dtype).removeprefix("torch.")] = {"max_abs": float(diff.max()),
                                                  "mean_abs": float(diff.mean())}
    return out


def markdown(result: dict[str, Any]) -> str:
    """The results as BENCHMARKS.md-ready lines."""
    lines = [f"# GPU check: {result['device_name']}", "",
             f"- command: `{result['command']}`", f"- date: {result['date']}",
             f"- torch {result['torch']}; random weights throughout", ""]
    roof = result.get("roofline")
    if roof:
        lines.append(f"- roofline: matmul {roof['bf16_flops'] / 1e12:.3g} TFLOP/s, copy "
                     f"{roof['bytes_per_s'] / 1e12:.3g} TB/s (measured)")
    step = result.get("step")
    if step and "error" not in step:
        lines += [f"- {step['budget']} step, {step['shape']}: {step['step_s']:.2f} s/step against "
                  f"a roofline of {step['roofline_s']:.2f} s "
                  f"({step['roofline_s'] / step['step_s']:.0%}); peak GPU memory "
                  f"{step['peak_gpu_mib'] / 1024:.1f} GiB", "",
                  "| phase | measured (s) | ideal (s) | share | bound |",
                  "|---|---:|---:|---:|---|"]
        for phase, s in step["phases"].items():
            share = "n/a" if s["share"] is None else f"{s['share']:.1%}"
            lines.append(f"| {phase} | {s['measured_s']:.3f} | {s['ideal_s']:.3f} | {share} | "
                         f"{s['bound']} |")
        lines.append("")
    agree = result.get("logprobs")
    if agree and "error" not in agree:
        lines.append(f"- log-probs, {agree['tokens']} tokens of a small random model, "
                     f"{result['device']} against the CPU (float32): " + "; ".join(
                         f"{k} max |Δ| {v['max_abs']:.2e}, mean {v['mean_abs']:.2e}"
                         for k, v in agree.items() if isinstance(v, dict)))
    for part in ("roofline", "step", "logprobs"):
        if isinstance(result.get(part), dict) and "error" in result[part]:
            lines.append(f"- {part}: FAILED: {result[part]['error']}")
    return "\n".join(lines) + "\n"


def write(out: Path, result: dict[str, Any]) -> None:
    (out / "gpu_check.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "gpu_check.md").write_text(markdown(result))


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="folder for gpu_check.json and gpu_check.md")
    p.add_argument("--model-dir", type=Path, required=True,
                   help="the policy's config.json and tokenizer (no weights needed)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: the same parts on tiny shapes (what the tests run)")
    p.add_argument("--store", type=Path, default=FIXTURES,
                   help="a tiny-roster store of --task (default: the tests' fixtures)")
    p.add_argument("--task", default="arithmetic")
    p.add_argument("--budget", default=None, help="default: paper on cuda, smoke on cpu")
    p.add_argument("--shape", default=None,
                   help=f"a bench.gpu.PAPER_SHAPES key or 'as-is' (default: {PAPER_SHAPE!r} "
                        "on cuda, as-is on cpu)")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    args.budget = args.budget or ("paper" if cuda else "smoke")
    args.shape = args.shape or (PAPER_SHAPE if cuda else "as-is")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a GPU, or with `--device cpu` for "
              "the tiny-shape check", file=sys.stderr)
        return 2
    if not (args.model_dir / "config.json").is_file():
        print(f"gpu_check: {args.model_dir} has no config.json; pass --model-dir the policy's "
              "folder under ~/.cache/musketeers/models (config.json and tokenizer suffice)",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "command": " ".join(["python -m musketeers.bench.gpu_check", *(argv or sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "device": args.device, "torch":
        torch.__version__, "device_name": torch.cuda.get_device_name() if args.device == "cuda"
        else "cpu"}
    failed = False
    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("roofline", lambda: roofline(args.device)),
        ("step", lambda: paper_step(args, result["roofline"])),
        ("logprobs", lambda: logprob_agreement(args))]
    for name, fn in steps:
        t0 = time.perf_counter()
        try:
            result[name] = fn()
        except Exception as exc:  # noqa: BLE001 - a part's failure is recorded, the rest run
            traceback.print_exc()
            result[name] = {"error": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"}
            failed = True
        result.setdefault("seconds", {})[name] = time.perf_counter() - t0
        write(args.out, result)
    print(markdown(result))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
