"""The ``single`` method vs TRL's ``GRPOTrainer`` at equal work, per regime.

Same policy (the converted copy in the models dir), same prompts (through the chat
template), same prompts × G per step, exactly ``max_new_tokens`` per completion on both sides
(eos suppressed until then), every batch back-propagated on both sides (ours does not skip a
batch without signal here), LoRA r = 8 / α = 16 on q_proj, v_proj, β = 0.04, lr 1e-4, the same
weight dtype on both sides. ``regime`` says what a step is.
TRL pitfalls handled (MODELS.md): dtype through ``model_init_kwargs``; gradient checkpointing
off (its default is on, which would only slow TRL down on this small model);
``per_device_train_batch_size`` counts completions (16 = 4 groups of 4).

TRL is installed only for this benchmark, into the running venv, with every already-installed
core package pinned so pip cannot move them; the row is skipped when pip cannot install it.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from musketeers.bench.machine import peak_rss_mib, set_threads
from musketeers.bench.rounds import Child, alternate

TRL_VERSION = "1.16.0"
PINNED = ("torch", "transformers", "peft", "accelerate", "datasets", "numpy", "safetensors")
SHARED = {"lora_r": 8, "beta": 0.04, "lr": 1e-4}
# What one step is, per regime (``--trl-regime``): ``smollm2`` is the first comparison's step
# (SmolLM2, gsm_symbolic with the DeepSeekZero prompt, 4 x 4 x 64 tokens, bf16); ``pocket`` is
# the pocket grid's step as the grid runs it (``regime``).
SMOLLM2 = {"policy": "smollm2", "task": "gsm_symbolic", "prompts": 4, "group_size": 4,
          "max_new_tokens": 64, "dtype": "bfloat16"}
REGIMES = ("pocket", "smollm2")


def regime(name: str, dtype: str | None = None) -> dict[str, Any]:
    """What one step is. ``pocket`` is read from the pocket grid's YAML (its policy, its
    arithmetic task, its dtype) and the pocket budget (prompts, G, new tokens), so the ratio
    is measured on the step the grid runs, not on a copy of it that can fall behind.
    ``dtype`` (``--dtype``) replaces the regime's on both sides, for a CPU that computes bf16
    natively."""
    if dtype is not None:
        return {**regime(name), "dtype": dtype}
    if name == "smollm2":
        return dict(SMOLLM2)
    from musketeers.budgets import BUDGETS
    from musketeers.design.gridspec import grid_file

    raw = yaml.safe_load(grid_file("pocket").read_text())
    size, defaults = BUDGETS["pocket"], raw.get("defaults") or {}
    return {"policy": defaults["policy"], "task": raw["tasks"]["arithmetic"],
            "prompts": size["prompts_per_micro"] * size["grad_accum"],
            "group_size": size["group_size"], "max_new_tokens": size["max_new_tokens"],
            "dtype": defaults.get("dtype", size["dtype"]),
            "loss_rows": defaults.get("loss_rows", size.get("loss_rows", 0))}


def ensure_trl(version: str = TRL_VERSION) -> str | None:
    """None when ``trl==version`` is importable (installing it if needed), else why not."""
    try:
        if importlib.metadata.version("trl") == version:
            return None
    except importlib.metadata.PackageNotFoundError:
        pass
    pins = []
    for pkg in PINNED:
        try:
            pins.append(f"{pkg}=={importlib.metadata.version(pkg)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(pins) + "\n")
    cmd = [sys.executable, "-m", "pip", "install", "-q", f"trl=={version}", "-c", f.name]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (subprocess.TimeoutExpired, OSError) as exc:
        return f"pip could not install trl=={version} ({exc})"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"pip could not install trl=={version}: {last[:200]}"
    return None


def run_single(params: dict[str, Any]) -> dict[str, Any]:
    """In a child: our ``single`` method, ``warmup + reps`` steps of ``train_step``, with the
    peak RSS of each phase (``bench.memory``) beside the process's."""
    from musketeers.bench.memory import PhasePeaks
    from musketeers.bench.train_bench import run_steps

    r = params["regime"]
    # skip_no_signal off: TRL back-propagates an all-zero-advantage batch too (equal work)
    overrides = {"method": "single", "policy": r["policy"], "budget": "pocket",
                 "prompts_per_micro": r["prompts"], "grad_accum": 1,
                 "group_size": r["group_size"], "max_new_tokens": r["max_new_tokens"],
                 "lora_r": SHARED["lora_r"], "beta": SHARED["beta"], "lr": SHARED["lr"],
                 "dtype": r["dtype"], "loss_rows": r.get("loss_rows", 0),
                 "skip_no_signal": False, **params.get("set", {})}
    with PhasePeaks() as peaks:
        out = run_steps({**params, "task": r["task"], "overrides": overrides})
    return {**out, "phase_peak_rss_mib": peaks.peaks}


def run_trl(params: dict[str, Any]) -> dict[str, Any]:
    """In a child: TRL's GRPOTrainer on the same policy, prompts and budget."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from musketeers.cache.devices import resolve_dtype
    from musketeers.cache.experts import resolve_local
    from musketeers.tasks import read_checked_items, score
    from musketeers.teams import policy_spec

    threads = set_threads()
    r = params["regime"]
    dtype = resolve_dtype(r["dtype"], "cpu")
    items = read_checked_items(params["cache_dir"], r["task"], "train")
    ds = Dataset.from_list([
        {"prompt": [{"role": "system", "content": it.system},
                    {"role": "user", "content": it.question}], "row": i}
        for i, it in enumerate(items)])

    def reward(completions, row, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(score(items[r], t)) for t, r in zip(texts, row, strict=True)]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.t0, self.times = 0.0, []

        def on_step_begin(self, *_, **__):
            self.t0 = time.perf_counter()

        def on_step_end(self, *_, **__):
            self.times.append(time.perf_counter() - self.t0)

    steps = params["warmup"] + params["reps"]
    n = r["max_new_tokens"]
    bf16 = dtype == torch.bfloat16
    args = GRPOConfig(
        output_dir=str(Path(params["run_dir"])), use_cpu=True, bf16=bf16,
        model_init_kwargs={"dtype": dtype}, gradient_checkpointing=False,
        per_device_train_batch_size=r["prompts"] * r["group_size"],
        num_generations=r["group_size"], max_completion_length=n,
        generation_kwargs={"min_new_tokens": n}, temperature=1.0,
        learning_rate=SHARED["lr"], beta=SHARED["beta"], max_steps=steps, logging_steps=1,
        report_to="none", save_strategy="no", seed=0, dataloader_num_workers=0)
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=resolve_local(policy_spec(r["policy"])), reward_funcs=reward, args=args,
        train_dataset=ds, callbacks=[timer],
        peft_config=LoraConfig(r=SHARED["lora_r"], lora_alpha=16,
                               target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    trainer.train()
    lens = [h["completions/mean_length"] for h in trainer.state.log_history
            if "completions/mean_length" in h]
    w = params["warmup"]
    return {"step_s": timer.times[w:], "warmup_s": timer.times[:w], "completion_len": lens,
            "peak_rss_mib": peak_rss_mib(), "threads": threads}


def write_items_store(cache_dir: Path, task: str, limit: int) -> None:
    """An items-only store of ``task``: all that ``single`` reads (no expert runs)."""
    from musketeers.cache.precompute import PrecomputeConfig, precompute_task
    from musketeers.tasks import build_items, task_spec

    items = build_items(task, "train", limit=limit)
    precompute_task(cache_dir, task, task_spec(task), {"train": items}, [],
                    PrecomputeConfig(router=False))


def bench_trl(cache_dir: Path, run_root: Path, regime_name: str, reps: int, warmup: int,
              rounds: int = 2, dtype: str | None = None) -> dict[str, dict[str, Any]]:
    """``single`` and TRL in ``rounds`` alternating rounds (single, TRL, single, TRL, …) of
    ``reps`` steps each (``rounds.alternate``), so load that comes and goes falls on both sides;
    then single with the stock decode, against single's prepacked weights."""
    from musketeers.bench.machine import run_child

    r = regime(regime_name, dtype)
    write_items_store(cache_dir, r["task"], 64)
    base = {"cache_dir": str(cache_dir), "regime": r, "policy": r["policy"], "device": "cpu",
            "reps": reps, "warmup": warmup}
    why = ensure_trl()

    def child(side: str) -> Child:
        return lambda k: {"error": why} if side == "trl" and why else run_child(
            side, {**base, "run_dir": str(run_root / f"{side}{k}")})

    out = alternate({side: child(side) for side in ("single", "trl")}, rounds)
    # the CPU decode's prepacked weights against the stock ``F.linear``, next to the last round
    out["single_stock"] = run_child("single", {**base, "set": {"prepack_decode": False},
                                               "run_dir": str(run_root / "single_stock")})
    return out
