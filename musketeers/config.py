"""TrainConfig: every option of a run in one typed dataclass.

Precedence, lowest first: dataclass defaults < budget preset < YAML file (``--config``) <
explicit CLI options. The resolved config is saved as ``runs/<name>/config.yaml`` and is what
``--resume`` and ``musketeers eval`` read back.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from musketeers.budgets import BUDGETS
from musketeers.cache.errors import UserError
from musketeers.config_checks import validate

# a token channel's layer unless told: each expert's last hidden state
DEFAULT_TOKEN_LAYER = -1


def opt(default: Any = MISSING, *, help: str, cli: bool | str = False, path: bool = False,
        factory: Callable[[], Any] | None = None, choices: Callable[[], Any] | None = None
        ) -> Any:
    """A TrainConfig field that carries its own help text, so the YAML keys, the grids' keys
    and the ``musketeers train`` options come from this one declaration.

    ``cli``: True exposes the field as ``--the-name``; a string is the option's declaration
    (a ``--x/--no-x`` pair). ``path``: the option takes a path. ``choices``: called when the
    CLI is built, its names end the help (registries that fill up at import time)."""
    meta = {"help": help, "cli": cli, "path": path, "choices": choices}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _method_names() -> tuple[str, ...]:
    from musketeers.method.methods import names

    return names()


@dataclass
class TrainConfig:
    """One training run. The optimisation defaults are the paper's hyper-parameters
    (appendix 7); the default ``budget`` (pocket) and ``policy`` (a 0.5B model) size a run for
    a CPU, and ``--budget paper --roster paper --policy paper`` restores the paper's."""

    # what to train on
    task: str = opt("logic", cli=True, help="arithmetic, algorithmic, logic, gsm8k, ...")
    team: str | None = opt("default", cli=True,
                           help="named team (default, generalist, naive, llm)")
    roster: str = opt("pocket", cli=True, help="pocket, paper or tiny")
    experts: list[str] | None = opt(None, cli=True, help="comma-separated expert names")
    team_file: str | None = opt(None, cli=True, path=True, help="YAML team file")
    method: str = opt("perceiver", cli=True, choices=_method_names, help="")
    pooling: str = opt("last", cli=True, help="last, first_token, random_token, first_layer, "
                                              "random_layer, mean, layer:K")
    latents: int = opt(8, cli=True, help="m, the number of context tokens")
    d_model: int = opt(512, help="the adapter's width")
    heads: int = opt(8, help="the adapter's attention heads")
    # a registry name, a local folder, a hub id, or ``package.module:function`` naming a
    # factory ``(TrainConfig) -> Policy`` (a plug-in policy: the planted check's tiny model)
    policy: str = opt("qwen2.5-coder-0.5b-instruct", cli=True,
                      help="qwen2.5-coder-0.5b-instruct, smollm2, ...")
    budget: str = opt("pocket", cli=True, help="smoke, pocket or paper")
    seed: int = opt(0, cli=True, help="seed of the run")
    cache_dir: str = opt(cli=True, path=True, help="stores root (env MUSKETEERS_CACHE_DIR)",
                         factory=lambda: os.environ.get("MUSKETEERS_CACHE_DIR", "stores"))
    run_dir: str | None = opt(None, cli=True, path=True, help="run folder (default runs/<name>)")
    # the optimisation (Eq. 4 and the RLOO+ options)
    steps: int = opt(500, cli=True, help="steps of the run; with --resume, stop this "
                                         "invocation after step N (the run keeps its own)")
    prompts_per_micro: int = opt(4, cli=True, help="prompts per micro-batch")
    grad_accum: int = opt(8, cli=True, help="micro-batches per update")
    group_size: int = opt(8, cli=True, help="G, completions per prompt")
    # a GPU decode step costs its launches whatever the rows (benchmarks-history, 2026-11-26)
    decode_prompts: int = opt(0, cli=True, help="prompts sampled as one batch (0: a micro-batch)")
    decode_graphs: bool = opt(False, cli=True, help="on CUDA, replay decode steps as CUDA graphs")
    prepack_decode: bool = opt(True, cli=True, help="on CPU, decode from prepacked frozen weights")
    # a loss pass holds its rows' activations until the backward (~4 GiB for the pocket step)
    loss_rows: int = opt(0, cli=True, help="completions per loss forward and backward, their "
                                           "gradients accumulated (0: a micro-batch's): the "
                                           "same gradient, fewer activations held at once")
    max_new_tokens: int = opt(128, cli=True, help="completion length limit")
    temperature: float = opt(1.0, cli=True, help="sampling temperature")
    beta: float = opt(0.04, cli=True, help="KL coefficient")
    lr: float = opt(1e-4, cli=True, help="LoRA learning rate")
    adapter_lr: float = opt(1e-4, cli=True, help="adapter learning rate")
    weight_decay: float = opt(0.01, help="AdamW weight decay")
    # the paper's Listing 1 ("epsilon: 1e-6"), not torch's 1e-8
    adam_eps: float = opt(1e-6, help="AdamW epsilon")
    grad_clip: float = opt(1.0, help="gradient norm clip")
    scheduler: str = opt("constant", help="constant, linear or cosine")
    warmup_steps: int = opt(0, help="LR warm-up steps")
    advantage: str = opt("group", cli=True, help="group or loo")
    reward_norm: str = opt("group", cli=True, help="group, task or none")
    dynamic_sampling: bool = opt(False, cli="--dynamic-sampling/--no-dynamic-sampling",
                                 help="drop zero-variance groups")
    # skip an update in which no group has a non-zero advantage: its only gradient is the KL
    # term's, which AdamW would turn into lr-sized drift of φ and θ with no reward at all
    skip_no_signal: bool = opt(True, cli="--skip-no-signal/--no-skip-no-signal",
                               help="skip updates in which no group has signal")
    clip_low: float = opt(0.2, cli=True, help="lower ratio clip ε_low")
    clip_high: float = opt(0.2, cli=True, help="upper ratio clip ε_high")
    loss_norm: str = opt("token", cli=True, help="token, sequence or constant")
    inner_iters: int = opt(1, cli=True, help="μ, GRPO iterations per batch")
    # C between the user turn and the chat template's generation prompt: m zero vectors right
    # after "<|im_start|>assistant\n" (after_prompt) move a chat policy's first token by 4-11
    # nats, so "C ≈ 0 at init" would not leave π where it was (see musketeers.method.policy)
    context_position: str = opt(
        "before_generation_prompt", cli=True,
        help="where C enters: before_generation_prompt (default), after_prompt "
             "(after the chat template's assistant header) or before_prompt")
    # Eq. 11 leaves C near zero; "embedding" rescales each context token to the policy's
    # token-embedding rms, so C speaks as loudly as the prompt from the first step
    context_scale: str = opt("init", cli=True,
                             help="C's scale: init (Eq. 11 as written, near zero at first) or "
                                  "embedding (each token at the policy's embedding rms)")
    # what the adapter's keys and values are (musketeers.cache.tokens.CHANNELS); a token
    # channel reads the states stored at one layer (precompute --token-states)
    channel: str = opt("pooled", cli=True,
                       help="what the adapter reads of each expert: pooled (one vector, the "
                            "paper's), tokens (every prompt token) or answer (every token of "
                            "its own greedy answer)")
    token_layer: int = opt(DEFAULT_TOKEN_LAYER, cli=True,
                           help="the hidden-state layer a token channel reads "
                                "(-1: each expert's last, 0: embeddings)")
    # beyond the paper: the Perceiver's keys are a set; this adds each token's place among its
    # expert's tokens (musketeers.method.token_positions), so a multi-digit answer keeps its order
    token_positions: bool = opt(False, cli="--token-positions/--no-token-positions",
                                help="on a token channel, add to each expert token the Fourier "
                                     "code of its position (the Perceiver reads a set without)")
    standardize_experts: bool = opt(
        False, cli="--standardize-experts/--no-standardize-experts",
        help="centre and scale each expert dimension by the train split's statistics "
             "before Eq. 6 (their shared direction otherwise dwarfs what differs by item)")
    # a lever beyond the paper: φ reads the experts before RL (musketeers.method.warmup)
    adapter_warmup: int = opt(0, cli=True, help="teacher-forced steps fitting the adapter to "
                              "the train split's gold answers before GRPO (0 = none, the paper's)")
    adapter_warmup_lr: float = opt(1e-3, cli=True, help="the adapter warm-up's learning rate")
    adapter_warmup_batch: int = opt(0, cli=True, help="train items per warm-up step (0 = the "
                                                      "prompts of one GRPO update)")
    warmup_policy_lr: float = opt(0.0, cli=True, help="the warm-up also fits the LoRA beside φ "
                                  "at this lr (0: frozen); Single then gets the same steps")
    warmup_permute_share: float = opt(
        0.0, cli=True, help="share (0-1) of each warm-up step's rows asked another of those "
                            "rows' question, so that only C can score them (0: none)")
    # a different reward, named in reports (musketeers.tasks.scoring.EXTRACTIONS)
    extraction: str = opt("strict", cli=True,
                          help="how the graded answer is found: strict (the last "
                               "<answer>…</answer>, the paper's) or lenient")
    lora_r: int = opt(8, help="LoRA rank")
    # bookkeeping
    save_every: int = opt(50, help="checkpoint every N steps")
    no_context_every: int = opt(0, cli=True, help="every N steps also log the reward "
                                                  "without C (Figure 5); 0 = never")
    eval_limit: int | None = opt(200, help="val items the end-of-run evaluation scores")
    device: str = opt("cpu", cli=True, help="cpu, cuda or cuda:N")
    # tiny models gain nothing from threads and on a shared CPU the thread handoffs make them
    # several times slower
    threads: int | None = opt(None, help="torch intra-op threads while the run trains "
                                         "(None: torch's default)")
    dtype: str = opt("auto", cli=True, help="auto (bf16 where the device computes it "
                                            "natively, else float32), float32, bfloat16, "
                                            "float16")
    live_experts: bool = opt(False, help="run the experts live, not from the store (the "
                                         "benchmarks only)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def run_path(self) -> Path:
        """``run_dir`` if given, else ``runs/<task>-<team>-<method>-<pooling>-s<seed>`` (a task
        file by its store's name: a path's slashes would nest the folder; checked as a name)."""
        from musketeers.cache.store import store_name
        from musketeers.cache.untrusted import safe_name
        if self.run_dir:
            return Path(self.run_dir)
        # the paper's channel keeps its old names; another channel is part of the run's name
        read = self.pooling.replace(':', '') if self.channel == "pooled" else (
            f"{self.channel}{self.token_layer}{'-pos' if self.token_positions else ''}")
        name = f"{store_name(self.task)}-{self.team or 'custom'}-{self.method}-{read}-s{self.seed}"
        return Path("runs") / safe_name(name, "run name", "pass plain --team/--method/"
                                        "--pooling values, or --run-dir")


def _check_type(key: str, value: Any, hint: Any) -> Any:
    """Return ``value`` converted to ``hint``'s type, or raise UserError naming ``key``."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check_type(key, value, inner[0])
    if origin is list:
        (item,) = typing.get_args(hint)
        if isinstance(value, str):  # "a,b" from a CLI option
            value = [v for v in value.split(",") if v]
        if not isinstance(value, list):
            raise UserError(f"config key '{key}' must be a list, got {value!r}")
        return [_check_type(key, v, item) for v in value]
    if hint is bool:
        if not isinstance(value, bool):
            raise UserError(f"config key '{key}' must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"config key '{key}' must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UserError(f"config key '{key}' must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise UserError(f"config key '{key}' must be a string, got {value!r}")
        return str(value)
    return value


def _apply(base: dict[str, Any], updates: dict[str, Any], where: str) -> None:
    hints = typing.get_type_hints(TrainConfig)
    for key, value in updates.items():
        if key not in hints:
            valid = ", ".join(sorted(hints))
            raise UserError(f"unknown config key '{key}' in {where}; valid keys: {valid}")
        base[key] = _check_type(key, value, hints[key])


def load_yaml(path: Path) -> dict[str, Any]:
    """Read a run YAML into a plain dict (keys are checked by :func:`resolve_config`)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file {path} not found; pass an existing --config path")
    try:
        data = yaml.safe_load(path.read_text("utf-8")) or {}
    except UnicodeDecodeError:
        raise UserError(f"config file {path} is not UTF-8 text; pass a YAML file to --config"
                        ) from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0]
        raise UserError(f"config file {path} is not valid YAML: {first}") from None
    if not isinstance(data, dict):
        raise UserError(f"config file {path} must be a mapping of option: value")
    return data


def resolve_config(yaml_path: Path | None = None, overrides: dict[str, Any] | None = None
                   ) -> TrainConfig:
    """Defaults < budget preset < YAML < ``overrides`` (CLI options that were given)."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    from_yaml = load_yaml(yaml_path) if yaml_path else {}
    values = asdict(TrainConfig())
    budget = overrides.get("budget", from_yaml.get("budget", values["budget"]))
    if budget not in BUDGETS:
        raise UserError(f"unknown budget '{budget}'; valid: {', '.join(BUDGETS)}")
    _apply(values, BUDGETS[budget], f"budget {budget}")
    # a saved config.yaml holds the default team beside its experts (team_specs lets experts
    # win), so only the command line is held to one choice; that choice replaces the YAML's
    if _one_team(overrides):
        from_yaml = {k: v for k, v in from_yaml.items() if k not in TEAM_KEYS}
    _apply(values, from_yaml, str(yaml_path))
    _apply(values, overrides, "the command line")
    from musketeers.method.methods import fixed_steps  # imports torch: only when resolving

    if (steps := fixed_steps(values["method"])) is not None:
        values["steps"] = steps  # the method decides (untrained: one step, whatever the budget)
    cfg = TrainConfig(**values)
    validate(cfg)
    return cfg


TEAM_KEYS = ("team", "experts", "team_file")


def _one_team(given: dict[str, Any]) -> bool:
    """Whether the options ``given`` pick the team; two ways at once are refused, as
    precompute refuses them."""
    keys = [k for k in TEAM_KEYS if given.get(k) is not None]
    if len(keys) > 1:
        names = " and ".join("--" + k.replace("_", "-") for k in keys)
        raise UserError(f"{names} both given; give one of --team, --experts or --team-file, "
                        "not several")
    return bool(keys)


def apply_overrides(cfg: TrainConfig, overrides: dict[str, Any]) -> TrainConfig:
    """``cfg`` with the given (non-None) options replaced, type-checked like YAML keys."""
    values = asdict(cfg)
    _apply(values, {k: v for k, v in overrides.items() if v is not None}, "the command line")
    return TrainConfig(**values)


def torch_dtype_name(dtype: str, device: str) -> str:
    """The dtype a run computes in: ``auto`` resolved by the device (see
    ``musketeers.config_checks.DTYPES``), on the machine that runs it, so a config saved as
    ``auto`` stays portable across CPUs."""
    if dtype != "auto":
        return dtype
    from musketeers.cache.devices import dtype_name, resolve_dtype  # precompute's own rule

    return dtype_name(resolve_dtype("auto", device))


def save_config(cfg: TrainConfig, path: Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


# TrainConfig fields that say where files live and how the hardware ran a run, not what it
# computed: a resumed run may change them, and a grid run that differs only in them is its own
NOT_COMPUTED = ("run_dir", "cache_dir", "device", "threads", "decode_prompts", "decode_graphs",
                "prepack_decode", "loss_rows")


def config_digest(cfg: TrainConfig, keys: list[str] | None = None) -> dict[str, Any]:
    """{fields, sha256} of what the config computes: NOT_COMPUTED and the fields its method
    ignores left out, so moving a store or changing threads never reads as another run.
    ``keys``: the fields a run recorded, so a field added to TrainConfig since (read back as
    its default) does not read as an edit."""
    from musketeers.method.methods import ignored  # imports torch: only when a run records

    # team_file is a path too: the team it names is checked by fingerprints.json's experts
    skip = {*NOT_COMPUTED, "team_file", *ignored(cfg.method)}
    values = cfg.to_dict()
    keys = sorted(k for k in values if k not in skip) if keys is None else keys
    text = json.dumps({k: values.get(k, "<absent>") for k in keys}, sort_keys=True, default=str)
    return {"fields": keys, "sha256": hashlib.sha256(text.encode()).hexdigest()}


def resume_command(run: Path) -> str:
    """The command that continues the run in ``run``: pasted into a shell, it works (the path
    is quoted where it needs to be)."""
    return f"musketeers train --run-dir {shlex.quote(str(run))} --resume"


def read_run_config(run_dir: Path) -> TrainConfig:
    """The resolved config of an existing run (for ``--resume`` and ``eval``)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise UserError(f"{run_dir} has no config.yaml; pass the folder `musketeers train` wrote")
    values = asdict(TrainConfig())
    _apply(values, load_yaml(path), str(path))
    return TrainConfig(**values)


def cli_fields() -> tuple[Any, ...]:
    """The TrainConfig fields ``musketeers train`` takes as options (the rest are YAML-only)."""
    return tuple(f for f in fields(TrainConfig) if f.metadata.get("cli"))


__all__ = ["TrainConfig", "cli_fields", "BUDGETS", "resolve_config", "apply_overrides", "validate",
           "save_config", "config_digest", "resume_command", "NOT_COMPUTED",
           "read_run_config", "load_yaml"]
