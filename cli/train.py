"""``musketeers train`` and ``musketeers eval``: thin wiring of musketeers.trainer/evaluate.

The train options are the TrainConfig fields that musketeers.config marks ``cli`` (their help
text lives there too). Every option is also a key of the YAML file given with ``--config``; an
option given on the command line wins over the YAML, which wins over the ``--budget`` preset.

``--resume --steps N`` stops that invocation after step N; the run keeps its configured length
(config.yaml, the LR schedule), so a later ``--resume`` finishes it. N beyond the run's steps is
refused: a longer run is a new ``--run-dir``.
"""

from __future__ import annotations

import inspect
import json
import typing
from dataclasses import Field
from pathlib import Path
from typing import Annotated, Any

import typer

from musketeers.cache.errors import UserError
from musketeers.cli.tasks import AllowOpt
from musketeers.config import TrainConfig, cli_fields

Opt = typer.Option
# what a resumed run may change on the command line: where its parts live, not what it is
# (--steps only stops the invocation early: see the module docstring); a subset of
# config.NOT_COMPUTED, which its config digest leaves out
RESUME_MAY_CHANGE = ("device", "cache_dir", "run_dir")


def _cli_type(f: Field) -> Any:
    """The option's type: None stands for "not given", so the YAML / budget value stays."""
    if f.metadata.get("path"):
        return Path | None
    hint = typing.get_type_hints(TrainConfig)[f.name]
    inner = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    base = inner[0]
    # a list option is one comma-separated string; config splits it like a YAML "a,b"
    return (str if typing.get_origin(base) is list else base) | None


def _option(f: Field) -> inspect.Parameter:
    meta = f.metadata
    help_text = meta["help"]
    if meta.get("choices"):
        help_text = ", ".join(filter(None, [help_text, *meta["choices"]()]))
    decls = [meta["cli"]] if isinstance(meta["cli"], str) else []
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[_cli_type(f), Opt(*decls, help=help_text)])


def _train(config: Path | None = None, resume: bool = False, resume_unverified: bool = False,
           allow_unadmitted_reward: bool = False, **options: Any) -> None:
    """Train the policy and adapter with GRPO on cached expert vectors."""
    from musketeers.cli.interrupt import on_interrupt
    from musketeers.config import (
        apply_overrides,
        read_run_config,
        resolve_config,
        resume_command,
        validate,
    )
    from musketeers.run.trainer import train as run_training
    from musketeers.runtime.distributed import lead
    from musketeers.tasks.admission import admit

    overrides = {k: str(v) if isinstance(v, Path) else v for k, v in options.items()
                 if v is not None}
    run_dir = options.get("run_dir")
    stop_after = None
    resume = resume or resume_unverified
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
    admit(cfg.task, allow_unadmitted_reward)  # before any model loads (cached per task)
    on_interrupt(f"resume it with: {resume_command(cfg.run_path())}")
    summary = run_training(cfg, resume=resume, stop_after=stop_after,
                           unverified=resume_unverified)
    if lead():  # under torchrun, once
        typer.echo(f"run: {cfg.run_path()}")
        typer.echo(json.dumps(summary, indent=2))


def train_command() -> Any:
    """``_train`` with one option per CLI field of TrainConfig (declared in musketeers.config)
    plus ``--config`` and ``--resume``: Typer reads the options off ``__signature__``.

    Built when the app is, so a method registered before then is listed in ``--method``'s
    help."""
    def train(**options: Any) -> None:
        _train(**options)

    own = [
        inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None,
                          annotation=Annotated[Path | None, Opt("--config",
                                                                help="YAML of options")]),
        inspect.Parameter("resume", inspect.Parameter.KEYWORD_ONLY, default=False,
                          annotation=Annotated[bool, Opt(
                              help="continue the run in --run-dir from its newest intact "
                                   "checkpoint (from step 0 if it has none yet)")]),
        inspect.Parameter("resume_unverified", inspect.Parameter.KEYWORD_ONLY, default=False,
                          annotation=Annotated[bool, Opt(
                              help="--resume, also from checkpoints whose manifest is missing "
                                   "or not signed with your key (manifest.key)")]),
        inspect.Parameter("allow_unadmitted_reward", inspect.Parameter.KEYWORD_ONLY,
                          default=False, annotation=AllowOpt),
    ]
    train.__signature__ = inspect.Signature([*map(_option, cli_fields()), *own])  # type: ignore[attr-defined]
    train.__doc__ = _train.__doc__
    return train


def evaluate(
    run_dir: Annotated[Path, typer.Argument(help="folder written by musketeers train")],
    limit: Annotated[int | None, Opt(help="val items to score (> 0)")] = None,
    no_context: Annotated[bool, Opt("--no-context", help="generate without C (Figure 5)")
                          ] = False,
    unverified: Annotated[bool, Opt("--unverified", help="score a checkpoint whose manifest is "
                                    "missing or not signed with your key")] = False,
) -> None:
    """Greedy accuracy of a trained run on the cached validation split."""
    from musketeers.run.evaluate import evaluate as run_eval
    from musketeers.runtime.distributed import lead

    result = run_eval(run_dir, limit=limit, no_context=no_context, unverified=unverified)
    if lead():
        typer.echo(json.dumps(result, indent=2))


def register(app: typer.Typer) -> None:
    app.command("train")(train_command())
    app.command("eval")(evaluate)
