"""The training step on a CUDA device, each phase against the device's measured roofline.

No checkpoint can reach a lent GPU, so the policy is built from a config with seeded random
weights: right for throughput and memory, meaningless for accuracy. Its rewards are all 0,
so the update runs with ``skip_no_signal`` off (every group enters the loss, as in TRL) and
every completion runs to ``max_new_tokens`` (``force_full_length``): the step does the most
work its budget allows. The store holds the ``tiny`` roster's vectors (carried with the
call); the experts' width only sizes the adapter's first projection, a rounding error
beside the policy.

    python -m musketeers.bench.gpu_step --store STORE --model-dir DIR --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch

from musketeers.bench.gpu import PAPER_SHAPES
from musketeers.bench.machine import median

# the policy the ``random_policy`` plugin builds: a folder with config.json and a tokenizer,
# and optionally a PAPER_SHAPES key whose sizes replace the folder's
MODEL_DIR_ENV, SHAPE_ENV = "MUSKETEERS_RANDOM_POLICY_DIR", "MUSKETEERS_RANDOM_POLICY_SHAPE"


def random_policy(cfg):
    """A ``--policy module:function`` factory: the LoRA policy on random weights of the
    shape named by the environment (``MODEL_DIR_ENV``, ``SHAPE_ENV``)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from musketeers.cache.devices import resolve_dtype
    from musketeers.cache.experts import load_tokenizer
    from musketeers.config import torch_dtype_name
    from musketeers.method.policy import Policy
    from musketeers.teams import expert_spec

    folder = os.environ[MODEL_DIR_ENV]
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    shape = PAPER_SHAPES.get(os.environ.get(SHAPE_ENV, ""))
    if shape:  # rebuilt, not patched: per-layer fields (layer_types) follow the new depth
        config = type(config)(**{**config.to_dict(), **shape, "layer_types": None})
    dtype = resolve_dtype(torch_dtype_name(cfg.dtype, cfg.device), cfg.device)
    state = torch.get_rng_state()  # as build_policy: loading must not shift the LoRA init
    torch.manual_seed(0)
    with torch.device(cfg.device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    torch.set_rng_state(state)
    tokenizer = load_tokenizer(expert_spec(folder))  # as every expert's and policy's
    return Policy(model, tokenizer, lora_r=cfg.lora_r, context_position=cfg.context_position)


def device_roofline(device: str) -> dict[str, float]:
    """The device's bf16 matmul ceiling (8192³) and copy bandwidth (read + write), measured."""
    from musketeers.bench.matmul import matmul_flops
    from musketeers.bench.roofline import copy_bandwidth

    return {"bf16_flops": median(matmul_flops(8192, torch.bfloat16, device, 3, 0.3)),
            "bytes_per_s": median(copy_bandwidth(2048, 3, 0.3, device=device))}


def measure(store: Path, run_root: Path, task: str, budget: str, shape: str, reps: int,
            warmup: int, device: str = "cuda", decode_prompts: int | None = None,
            decode_graphs: bool | None = None, extra: dict[str, int] | None = None
            ) -> dict[str, Any]:
    """``warmup + reps`` steps of ``budget`` on the random ``shape``; phases vs the roofline.
    ``decode_prompts`` and ``decode_graphs`` left None keep the budget's own values."""
    from musketeers.bench.train_bench import run_steps

    os.environ[SHAPE_ENV] = shape
    params = {"task": task, "cache_dir": str(store), "run_dir": str(run_root / budget),
              "device": device, "reps": reps, "warmup": warmup,
              "overrides": {"budget": budget, "roster": "tiny", "dtype": "bfloat16",
                            "policy": f"{__name__}:random_policy", "skip_no_signal": False,
                            **{k: v for k, v in (("decode_prompts", decode_prompts),
                                                 ("decode_graphs", decode_graphs))
                               if v is not None},
                            **(extra or {})}}
    result = run_steps(params)
    result["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else 0
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    return result


def decode_check(shape: str, rows: int, prompt_len: int, new_tokens: int) -> dict[str, Any]:
    """Greedy decoding of the same random prompts, eager (``sampling.decode``) and replayed
    as CUDA graphs (``fast.decode_graph.decode_fixed``): seconds per decode step, and the share of
    tokens the two agree on (random weights give near-ties, where bf16's batch-shape noise
    may pick another token and every later one in its row differs)."""
    import time

    from musketeers.config import TrainConfig

    os.environ[SHAPE_ENV] = shape
    policy = random_policy(TrainConfig(device="cuda", dtype="bfloat16", policy="plugin"))
    policy.eos_ids = []  # every row runs to new_tokens: equal work
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(100, 30000, (rows, prompt_len), generator=g).tolist()
    out: dict[str, Any] = {"shape": shape, "rows": rows, "prompt_len": prompt_len,
                           "new_tokens": new_tokens}
    for graphs in (False, True, False, True):  # twice each: the first of each warms up
        policy.decode_graphs = graphs
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tokens = policy.generate(prompts, None, group_size=1, max_new_tokens=new_tokens,
                                 greedy=True)
        torch.cuda.synchronize()
        out["graphs_s" if graphs else "eager_s"] = time.perf_counter() - t0
        out["graphs" if graphs else "eager"] = tokens
    same = [a == b for x, y in zip(out.pop("eager"), out.pop("graphs"), strict=True)
            for a, b in zip(x, y, strict=True)]
    out["agree"] = sum(same) / len(same)
    print(f"decode {shape}, {rows} rows × {new_tokens} tokens: eager {out['eager_s']:.2f} s, "
          f"graphs {out['graphs_s']:.2f} s ({out['eager_s'] / out['graphs_s']:.1f}×); "
          f"greedy tokens agree {out['agree']:.1%}")
    del policy
    torch.cuda.empty_cache()
    return out


def report(name: str, r: dict[str, Any], roof: dict[str, float]) -> dict[str, Any]:
    from musketeers.bench.roofline import ideal_seconds, phase_shares

    rows = [(p, w) for p, w in r["profile"]]
    shares = phase_shares(r["shape"], rows, roof["bf16_flops"], roof["bytes_per_s"])
    ideal = sum(s for s, _ in ideal_seconds(r["shape"], rows[0][1], roof["bf16_flops"],
                                            roof["bytes_per_s"]).values())
    step = median(r["step_s"])
    print(f"{name}: {step:.2f} s/step (median of {len(r['step_s'])}), roofline {ideal:.2f} s "
          f"({ideal / step:.0%}); peak GPU memory {r['peak_gpu_mib'] / 1024:.1f} GiB")
    for phase, s in shares.items():
        share = "n/a" if s["share"] is None else f"{s['share']:.1%}"
        print(f"  {phase:<10} {s['measured_s']:7.3f} s  ideal {s['ideal_s']:7.3f} s  "
              f"{share:>6}  ({s['bound']})")
    opt = median([p["optimizer"] for p, _ in rows])
    print(f"  {'optimizer':<10} {opt:7.3f} s")
    return {"step_s": step, "roofline_s": ideal, "phases": shares}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", type=Path, required=True, help="a tiny-roster store of --task")
    p.add_argument("--model-dir", type=Path, required=True,
                   help="a folder with the policy's config.json and tokenizer (no weights)")
    p.add_argument("--task", default="arithmetic")
    p.add_argument("--runs", type=Path, default=Path("/tmp/gpu-step-runs"))
    p.add_argument("--case", action="append", default=None,
                   help="BUDGET=SHAPE (SHAPE a bench.gpu.PAPER_SHAPES key, or 'as-is' for the "
                        "folder's own config); default: pocket=as-is and paper=qwen2.5-3b")
    p.add_argument("--decode-prompts", type=int, default=None,
                   help="prompts sampled as one batch (the config field; 0: a micro-batch); "
                        "default: the budget's")
    p.add_argument("--decode-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="replay each decode step as a CUDA graph (the config field); "
                        "default: the budget's")
    p.add_argument("--check-decode", type=int, default=0, metavar="ROWS",
                   help="first compare eager and graphed greedy decoding on ROWS rows")
    p.add_argument("--set", action="append", default=[], metavar="KEY=N",
                   help="an integer config field over the budget's (e.g. prompts_per_micro=32)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark measures a GPU "
                         "(the CPU's step is `python -m musketeers.bench --only roofline`)")
    os.environ[MODEL_DIR_ENV] = str(args.model_dir)
    roof = device_roofline("cuda")
    print(f"{torch.cuda.get_device_name()}: bf16 matmul {roof['bf16_flops'] / 1e12:.0f} TFLOP/s, "
          f"copy {roof['bytes_per_s'] / 1e12:.2f} TB/s (measured); random weights throughout")
    cases = args.case or ["pocket=as-is", "paper=qwen2.5-3b (random weights)"]
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(), "roofline": roof,
                           "decode_prompts": args.decode_prompts,
                           "decode_graphs": args.decode_graphs, "set": args.set,
                           "torch": torch.__version__, "cases": {}, "decode_check": []}
    for case in cases if args.check_decode else []:
        out["decode_check"].append(decode_check(case.partition("=")[2], args.check_decode,
                                                248, 128))
    for case in cases:
        budget, _, shape = case.partition("=")
        r = measure(args.store, args.runs, args.task, budget, shape, args.reps, args.warmup,
                    decode_prompts=args.decode_prompts, decode_graphs=args.decode_graphs,
                    extra={k: int(v) for k, _, v in (kv.partition("=") for kv in args.set)})
        out["cases"][case] = {**report(case, r, roof), "raw": r}
        if args.out:  # after each case: a later one that fails keeps the earlier figures
            args.out.write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
