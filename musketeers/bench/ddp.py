"""Data-parallel training on one CPU: N ranks × 1 thread against 1 rank × N threads.

``python -m musketeers.bench.ddp [--policy P] [--reps R] [--rounds K]`` times the pocket step
(``budget: pocket``: 4 prompts × G 8 × 32 new tokens, every completion run to its full length)
both ways, in alternating rounds (this machine's speed drifts within minutes: each round
compares runs minutes apart), and prints seconds per step and their ratio. Each side is a
child process (``torchrun`` for the ranks), so each loads the policy on its own; the first
step of each child is a warm-up and is not timed.

The store is synthetic (``--task``'s train items, random vectors for a two-expert team of
``random`` experts): a step's cost is the policy's, and the adapter reads 2 × 64 floats per
prompt, so what the vectors hold changes no timing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np

EXPERTS = ("noise-a", "noise-b")
DIM = 64
TEAM_FILE = "ddp.team.yaml"


def write_store(cache_dir: Path, task: str, n: int = 64) -> Path:
    """``task``'s first ``n`` train items and random vectors for the two-expert team file."""
    import yaml

    from musketeers.cache import from_memory, layout
    from musketeers.cache import store as st
    from musketeers.cache.items import items_fingerprint
    from musketeers.tasks import build_items, task_spec

    cache_dir = st.check_cache_dir(cache_dir)
    root = st.open_root(st.store_path(cache_dir, task), task, task_spec(task), force=True)
    items = build_items(task, "train", limit=n)
    sg = root.require_group("train")
    layout.write_items(sg, items, items_fingerprint(items), layout.CHUNK_ROWS)
    rng = np.random.default_rng(0)
    for name in EXPERTS:
        vec = rng.standard_normal((len(items), DIM)).astype(np.float32)
        layers = np.stack([np.zeros_like(vec), vec], axis=1)
        arrays = {"last": vec, "first": vec, "random": vec, "layers_last": layers,
                  "layers_mean": layers}
        from_memory.write_expert(sg, name, arrays, fingerprint={"bench": name}, n_layers=1,
                                 d=DIM, dtype="float32")
    entries = [{"name": name, "kind": "random", "ref": f"bench:{name}"} for name in EXPERTS]
    (cache_dir / TEAM_FILE).write_text(yaml.safe_dump({"experts": entries}, sort_keys=False))
    return cache_dir


def child(params: dict[str, Any]) -> None:
    """One side (every rank of it): build the run, time ``1 + reps`` steps; rank 0 writes."""
    import torch

    from musketeers.bench.train_bench import force_full_length
    from musketeers.config import resolve_config
    from musketeers.method import methods
    from musketeers.run.build import build_components, make_optimizer
    from musketeers.run.trainer import train_step
    from musketeers.runtime.distributed import World

    torch.set_num_threads(params["threads"])
    cfg = resolve_config(overrides={
        "budget": "pocket", "task": params["task"], "team": None,
        "team_file": str(Path(params["cache_dir"]) / TEAM_FILE), "method": "perceiver",
        "policy": params["policy"], "cache_dir": params["cache_dir"], "device": "cpu",
        "run_dir": params["run_dir"], "steps": 1 + params["reps"], "dtype": params["dtype"]})
    world = World.from_env(cfg.device)
    method = methods.get(cfg.method)
    data, policy, adapter = build_components(cfg, "train", method=method)
    force_full_length(policy)
    optimizer, scheduler = make_optimizer(cfg, policy, adapter, method)
    times = []
    for step in range(cfg.steps):
        world.barrier()  # every rank starts the step together: the slowest rank is the time
        t0 = time.perf_counter()
        train_step(cfg, step, policy, adapter, data, optimizer, scheduler, method=method,
                   world=world)
        times.append(time.perf_counter() - t0)
    if world.rank == 0:
        Path(params["out"]).write_text(json.dumps(
            {"step_s": times[1:], "warmup_s": times[0], "ranks": world.world,
             "threads": torch.get_num_threads(), "prompts": cfg.prompts_per_micro,
             "group_size": cfg.group_size, "max_new_tokens": cfg.max_new_tokens}))
    world.close()


def run_side(ranks: int, threads: int, params: dict[str, Any], out: Path) -> dict[str, Any]:
    """One child process (``ranks`` = 1) or a ``torchrun`` job, ``threads`` torch threads each."""
    spec = json.dumps({**params, "threads": threads, "out": str(out)})
    module = [sys.executable, "-m", "musketeers.bench.ddp", "--child", spec]
    cmd = module if ranks == 1 else [sys.executable, "-m", "torch.distributed.run",
                                     "--standalone", f"--nproc_per_node={ranks}", *module[1:]]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not out.exists():
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"{ranks} rank(s) × {threads} thread(s) failed: {tail}")
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--task", default="arithmetic:easy@direct")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--ranks", type=int, default=2, help="ranks × 1 thread vs 1 rank × this")
    ap.add_argument("--reps", type=int, default=2, help="timed steps per side and round")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the two sides")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    with tempfile.TemporaryDirectory(prefix="ddp-bench-") as tmp:
        work = Path(tmp)
        cache_dir = write_store(work / "stores", args.task)
        params = {"policy": args.policy, "task": args.task, "dtype": args.dtype,
                  "reps": args.reps, "cache_dir": str(cache_dir)}
        sides = {"1x": (1, args.ranks), "Nx": (args.ranks, 1)}
        got: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
        for r in range(args.rounds):
            for key, (ranks, threads) in sides.items():
                run = {**params, "run_dir": str(work / f"run-{key}-{r}")}
                got[key].append(run_side(ranks, threads, run, work / f"{key}-{r}.json"))
                print(f"round {r + 1}: {ranks} rank(s) × {threads} thread(s): "
                      f"{got[key][-1]['step_s']} s/step", flush=True)
    one = [s for g in got["1x"] for s in g["step_s"]]
    many = [s for g in got["Nx"] for s in g["step_s"]]
    per_round = [median(a["step_s"]) / median(b["step_s"])
                 for a, b in zip(got["1x"], got["Nx"], strict=True)]
    first = got["1x"][0]
    print(f"pocket step, {args.policy}, {args.task}: {first['prompts']} prompts × G "
          f"{first['group_size']} × {first['max_new_tokens']} tokens")
    print(f"1 rank × {args.ranks} threads: median {median(one):.2f} s/step ({one})")
    print(f"{args.ranks} ranks × 1 thread: median {median(many):.2f} s/step ({many})")
    print(f"speed-up of {args.ranks} ranks (1-rank s/step ÷ N-rank s/step): "
          f"{median(one) / median(many):.2f}× (per round: "
          f"{', '.join(f'{x:.2f}×' for x in per_round)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
