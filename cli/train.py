"""``musketeers train`` and ``musketeers eval``: thin wiring of musketeers.trainer/evaluate.

Every option is also a key of the YAML file given with ``--config``; an option given on the
command line wins over the YAML, which wins over the ``--budget`` preset.

``--resume --steps N`` stops that invocation after step N; the run keeps its configured length
(config.yaml, the LR schedule), so a later ``--resume`` finishes it. N beyond the run's steps is
refused: a longer run is a new ``--run-dir``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from musketeers.cache.errors import UserError
from musketeers.methods import names as method_names

Opt = typer.Option
# what a resumed run may change: where its parts live, not what it is (--steps only stops
# the invocation early: see the module docstring)
RESUME_MAY_CHANGE = ("device", "cache_dir", "run_dir")


METHOD_NAMES = method_names()


def train(
    task: Annotated[str | None, Opt(help="arithmetic, algorithmic, logic, gsm8k, ...")] = None,
    team: Annotated[str | None, Opt(help="named team (default, generalist, naive, llm)")] = None,
    roster: Annotated[str | None, Opt(help="pocket, paper or tiny")] = None,
    experts: Annotated[str | None, Opt(help="comma-separated expert names")] = None,
    team_file: Annotated[Path | None, Opt(help="YAML team file")] = None,
    method: Annotated[str | None, Opt(help=", ".join(METHOD_NAMES))] = None,
    pooling: Annotated[str | None, Opt(help="last, first_token, random_token, first_layer, "
                                            "random_layer, mean, layer:K")] = None,
    latents: Annotated[int | None, Opt(help="m, the number of context tokens")] = None,
    policy: Annotated[str | None, Opt(help="qwen2.5-coder-0.5b-instruct, smollm2, ...")] = None,
    budget: Annotated[str | None, Opt(help="smoke, pocket or paper")] = None,
    seed: Annotated[int | None, Opt()] = None,
    steps: Annotated[int | None, Opt(help="steps of the run; with --resume, stop this "
                                           "invocation after step N (the run keeps its own)")
                     ] = None,
    group_size: Annotated[int | None, Opt(help="G, completions per prompt")] = None,
    max_new_tokens: Annotated[int | None, Opt()] = None,
    beta: Annotated[float | None, Opt(help="KL coefficient")] = None,
    lr: Annotated[float | None, Opt(help="LoRA learning rate")] = None,
    adapter_lr: Annotated[float | None, Opt(help="adapter learning rate")] = None,
    advantage: Annotated[str | None, Opt(help="group or loo")] = None,
    reward_norm: Annotated[str | None, Opt(help="group, task or none")] = None,
    dynamic_sampling: Annotated[bool | None, Opt("--dynamic-sampling/--no-dynamic-sampling",
                                                 help="drop zero-variance groups")] = None,
    clip_low: Annotated[float | None, Opt()] = None,
    clip_high: Annotated[float | None, Opt()] = None,
    loss_norm: Annotated[str | None, Opt(help="token, sequence or constant")] = None,
    inner_iters: Annotated[int | None, Opt(help="μ, GRPO iterations per batch")] = None,
    context_position: Annotated[str | None, Opt(
        help="where C enters: before_generation_prompt (default), after_prompt "
             "(after the chat template's assistant header) or before_prompt")] = None,
    no_context_every: Annotated[int | None, Opt(help="every N steps also log the reward "
                                                     "without C (Figure 5); 0 = never")] = None,
    device: Annotated[str | None, Opt()] = None,
    dtype: Annotated[str | None, Opt(help="auto (bf16 where the device computes it natively, "
                                          "else float32), float32, bfloat16, float16")] = None,
    cache_dir: Annotated[Path | None, Opt(help="stores root (env MUSKETEERS_CACHE_DIR)")] = None,
    run_dir: Annotated[Path | None, Opt(help="run folder (default runs/<name>)")] = None,
    config: Annotated[Path | None, Opt("--config", help="YAML of options")] = None,
    resume: Annotated[bool, Opt(help="continue the run in --run-dir from its newest intact "
                                     "checkpoint (from step 0 if it has none yet)")] = False,
) -> None:
    """Train the policy and adapter with GRPO on cached expert vectors."""
    from musketeers.cli.interrupt import on_interrupt
    from musketeers.config import apply_overrides, read_run_config, resolve_config, validate
    from musketeers.runfolder import resume_command
    from musketeers.trainer import train as run_training

    overrides = {k: v for k, v in locals().items()
                 if k not in ("config", "resume", "run_training", "resolve_config",
                              "read_run_config", "apply_overrides", "validate", "on_interrupt",
                              "resume_command")
                 and v is not None}
    for key in ("cache_dir", "run_dir", "team_file"):
        if key in overrides:
            overrides[key] = str(overrides[key])
    stop_after = None
    if resume:
        if run_dir is None:
            raise UserError("--resume needs the --run-dir of the run to continue")
        if config is not None:
            raise UserError("--resume continues a run with its own config.yaml; drop --config")
        saved = read_run_config(run_dir)
        stop_after = overrides.pop("steps", None)
        if stop_after is not None and not 1 <= stop_after <= saved.steps:
            raise UserError(f"--resume --steps {stop_after}: the run has {saved.steps} steps and "
                            f"keeps them; pass --steps 1..{saved.steps} to stop early, or start "
                            "a new --run-dir for a longer run")
        cfg = apply_overrides(saved, overrides)
        changed = [k for k in overrides if k not in RESUME_MAY_CHANGE
                   and getattr(cfg, k) != getattr(saved, k)]
        if changed:
            raise UserError(
                f"--resume continues {run_dir} as it was configured; "
                + ", ".join(f"--{k.replace('_', '-')} {getattr(saved, k)!r} → "
                            f"{getattr(cfg, k)!r}" for k in changed)
                + " would change it mid-run: drop them, or start a new --run-dir")
        validate(cfg)
    else:
        cfg = resolve_config(config, overrides)
    on_interrupt(f"resume it with: {resume_command(cfg.run_path())}")
    summary = run_training(cfg, resume=resume, stop_after=stop_after)
    typer.echo(f"run: {cfg.run_path()}")
    typer.echo(json.dumps(summary, indent=2))


def evaluate(
    run_dir: Annotated[Path, typer.Argument(help="folder written by musketeers train")],
    limit: Annotated[int | None, Opt(help="val items to score (> 0)")] = None,
    no_context: Annotated[bool, Opt("--no-context", help="generate without C (Figure 5)")
                          ] = False,
) -> None:
    """Greedy accuracy of a trained run on the cached validation split."""
    from musketeers.evaluate import evaluate as run_eval

    result = run_eval(run_dir, limit=limit, no_context=no_context)
    typer.echo(json.dumps(result, indent=2))


def register(app: typer.Typer) -> None:
    app.command("train")(train)
    app.command("eval")(evaluate)
