"""One declaration per TrainConfig field: YAML, ``musketeers train`` and a grid's defaults all
reach it, and none of them can grow or lose a field behind the dataclass's back."""

from __future__ import annotations

import typing
from dataclasses import MISSING, Field, fields
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from musketeers.config import TrainConfig, cli_fields, resolve_config
from musketeers.design.gridspec import load_grid
from musketeers.grid.run import _default_config_fn

# a valid non-default value for each field whose type alone does not give one (names that
# the registries check); numbers and booleans are derived from the default below
NAMES = {"task": "arithmetic", "team": "naive", "roster": "tiny", "team_file": "team.yaml",
         "method": "single", "pooling": "mean", "policy": "smollm2", "budget": "smoke",
         "cache_dir": "elsewhere", "run_dir": "runs/x", "scheduler": "cosine",
         "advantage": "loo", "reward_norm": "task", "loss_norm": "sequence",
         "context_position": "after_prompt", "extraction": "lenient", "device": "cpu:0",
         "dtype": "float32", "experts": ["tiny-llama", "tiny-gpt2"], "context_scale": "embedding",
         "channel": "tokens"}
# a grid names a run's seed in its own ``seeds`` list (a run per seed), not in ``defaults``
GRID_KEY = {"seed": "seeds"}


def _default(f: Field) -> Any:
    return f.default_factory() if f.default is MISSING else f.default  # type: ignore[misc]


def other_value(f: Field) -> Any:
    """A value ``validate`` accepts that differs from the field's default."""
    if f.name in NAMES:
        return NAMES[f.name]
    hint = typing.get_type_hints(TrainConfig)[f.name]
    base = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    default = _default(f)
    if base[0] is bool:
        return not default
    if base[0] is int:
        return 2 * default if default else 2
    if base[0] is float:
        return 2 * default if default else 0.5
    raise AssertionError(f"TrainConfig.{f.name}: add a valid non-default value to NAMES")


FIELDS = [f.name for f in fields(TrainConfig)]


def _field(name: str) -> Field:
    return next(f for f in fields(TrainConfig) if f.name == name)


def test_every_field_carries_its_help():
    missing = [f.name for f in fields(TrainConfig) if not f.metadata.get("help")
               and not f.metadata.get("choices")]
    assert not missing, f"fields without help text: {missing}"


@pytest.mark.parametrize("name", FIELDS)
def test_every_field_is_settable_from_yaml(tmp_path, name):
    value = other_value(_field(name))
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({name: value}))
    cfg = resolve_config(path)
    assert getattr(cfg, name) == value != _default(_field(name))


@pytest.mark.parametrize("name", FIELDS)
def test_every_field_is_settable_from_a_grids_defaults(tmp_path, name):
    value = other_value(_field(name))
    key = GRID_KEY.get(name, name)
    grid = {"budget": "smoke", "seeds": [0], "defaults": {"task": "logic"},
            "runs": [{"eval_no_context": False}]}  # one run, all of it from defaults
    if key == "seeds":
        grid["seeds"] = [value]
    else:
        grid["defaults"][key] = value
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    (run,) = load_grid(path).runs
    assert getattr(_default_config_fn(run.fields), name) == value


def _train_params() -> dict[str, Any]:
    from musketeers.cli import main as cli_main

    command = typer.main.get_command(cli_main.app).commands["train"]  # type: ignore[attr-defined]
    return {p.name: p for p in command.params}


def test_the_cli_options_are_the_declared_set():
    """Exactly the fields config.py marks ``cli`` (plus --config, --resume,
    --resume-unverified and --allow-unadmitted-reward), named after them; the rest stay
    YAML-only."""
    params = _train_params()
    assert set(params) == {f.name for f in cli_fields()} | {
        "config", "resume", "resume_unverified", "allow_unadmitted_reward"}
    for f in cli_fields():
        assert "--" + f.name.replace("_", "-") in params[f.name].opts
    assert params["dynamic_sampling"].secondary_opts == ["--no-dynamic-sampling"]


@pytest.mark.parametrize("name", [f.name for f in cli_fields()])
def test_every_cli_field_is_settable_from_the_command_line(tmp_path, monkeypatch, name):
    from musketeers.cli import main as cli_main

    value = other_value(_field(name))
    if isinstance(value, bool):
        args = [f"--{'' if value else 'no-'}{name.replace('_', '-')}"]
    else:
        shown = ",".join(value) if isinstance(value, list) else str(value)
        args = [f"--{name.replace('_', '-')}", shown]
    seen: list[TrainConfig] = []
    monkeypatch.setattr("musketeers.run.trainer.train", lambda cfg, **kw: seen.append(cfg) or {})
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli_main.app, ["train", *args])
    assert result.exit_code == 0, (args, result.output, result.exception)
    (cfg,) = seen
    want = str(Path(value)) if _field(name).metadata.get("path") else value
    assert getattr(cfg, name) == want


def test_yaml_only_fields_have_no_option():
    from musketeers.cli import main as cli_main

    yaml_only = [f for f in fields(TrainConfig) if not f.metadata.get("cli")]
    assert yaml_only  # the split is real: e.g. weight_decay is a YAML key only
    for f in yaml_only:
        result = CliRunner().invoke(cli_main.app, ["train", f"--{f.name.replace('_', '-')}", "1"])
        assert result.exit_code == 2 and "No such option" in result.output, f.name
