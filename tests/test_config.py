"""TrainConfig: precedence, YAML checking, name validation, and the CLI's one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from musketeers.budgets import BUDGETS
from musketeers.cache.errors import UserError
from musketeers.config import (
    TrainConfig,
    read_run_config,
    resolve_config,
    save_config,
)


def write(tmp_path: Path, data) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def test_paper_budget_is_the_papers_numbers():
    cfg = resolve_config(None, {"budget": "paper"})
    assert (cfg.steps, cfg.prompts_per_micro, cfg.grad_accum, cfg.group_size) == (500, 4, 8, 8)
    assert cfg.prompts_per_micro * cfg.grad_accum == 32
    assert (cfg.max_new_tokens, cfg.beta, cfg.lr, cfg.adapter_lr) == (128, 0.04, 1e-4, 1e-4)
    assert (cfg.weight_decay, cfg.grad_clip, cfg.latents) == (0.01, 1.0, 8)


def test_precedence_defaults_budget_yaml_cli(tmp_path):
    path = write(tmp_path, {"budget": "smoke", "steps": 7, "group_size": 3, "lr": 0.5})
    cfg = resolve_config(path, {"group_size": 5, "seed": None})
    assert cfg.budget == "smoke"
    assert cfg.steps == 7  # YAML over the smoke preset (2)
    assert cfg.group_size == 5  # CLI over YAML
    assert cfg.lr == 0.5 and cfg.max_new_tokens == BUDGETS["smoke"]["max_new_tokens"]
    assert cfg.beta == TrainConfig().beta  # untouched default
    # the CLI's budget wins over the YAML's, and the YAML's keys still win over it
    cfg = resolve_config(path, {"budget": "paper"})
    assert cfg.budget == "paper" and cfg.grad_accum == 8 and cfg.steps == 7


def test_saved_config_reads_back_identically(tmp_path):
    cfg = resolve_config(None, {"budget": "smoke", "experts": "a,b", "pooling": "layer:3"})
    assert cfg.experts == ["a", "b"]
    save_config(cfg, tmp_path / "config.yaml")
    assert read_run_config(tmp_path) == cfg


@pytest.mark.parametrize("data, match", [
    ({"stepz": 3}, "unknown config key 'stepz'"),
    ({"steps": "many"}, "'steps' must be an integer"),
    ({"steps": 2.5}, "'steps' must be an integer"),
    ({"lr": "fast"}, "'lr' must be a number"),
    ({"dynamic_sampling": "yes"}, "'dynamic_sampling' must be true or false"),
    ({"experts": 3}, "'experts' must be a list"),
    ("- a\n- b\n", "must be a mapping"),
    ("steps: [1,\n", "not valid YAML"),
])
def test_yaml_errors_name_the_key(tmp_path, data, match):
    with pytest.raises(UserError, match=match):
        resolve_config(write(tmp_path, data))


@pytest.mark.parametrize("key, value, valid", [
    ("method", "transformer", "perceiver, no_cross_attn, hard_routing, output_collab, single"),
    ("pooling", "max", "last, first_token, random_token, first_layer, random_layer, mean"),
    ("budget", "huge", "smoke, pocket, paper"),
    ("task", "chess", "arithmetic, algorithmic"),
    ("advantage", "ppo", "group, loo"),
    ("loss_norm", "sum", "token, sequence, constant"),
    ("context_position", "middle", "before_generation_prompt, after_prompt, before_prompt"),
])
def test_unknown_names_list_the_valid_ones(key, value, valid):
    with pytest.raises(UserError, match=f"unknown {key} '{value}'; valid: {valid}"):
        resolve_config(None, {key: value})


@pytest.mark.parametrize("key", ["steps", "group_size", "latents", "eval_limit"])
def test_non_positive_sizes_are_refused(key):
    with pytest.raises(UserError, match=f"'{key}' must be >= 1"):
        resolve_config(None, {key: 0})


def test_no_context_every_is_off_by_default_and_refuses_negatives():
    assert resolve_config(None, {}).no_context_every == 0
    assert resolve_config(None, {"no_context_every": 5}).no_context_every == 5
    with pytest.raises(UserError, match="'no_context_every' must be >= 0"):
        resolve_config(None, {"no_context_every": -1})


@pytest.mark.parametrize("values, match", [
    ({"temperature": 0.0}, "'temperature' must be > 0"),
    ({"d_model": 100, "heads": 8}, "'d_model' \\(100\\) must be a multiple of 'heads' \\(8\\)"),
])
def test_values_that_would_fail_later_are_refused_up_front(values, match):
    with pytest.raises(UserError, match=match):
        resolve_config(None, values)


def test_resume_refuses_options_that_change_the_run(tmp_path, monkeypatch):
    """A resumed run is the run it was: --config or a changed --method is refused before any
    work; the same values again (``make demo`` repeats its options) and --steps pass."""
    from musketeers.cli import main as cli_main

    run = tmp_path / "r"
    run.mkdir()
    save_config(resolve_config(None, {"method": "perceiver", "run_dir": str(run)}),
                run / "config.yaml")
    runner = CliRunner()
    for args, match in [
        (["--method", "single"], "--method 'perceiver' → 'single'"),
        (["--budget", "paper"], "--budget 'pocket' → 'paper'"),
        (["--config", str(write(tmp_path, {"seed": 1}))], "drop --config"),
    ]:
        result = runner.invoke(cli_main.app, ["train", "--resume", "--run-dir", str(run), *args])
        assert isinstance(result.exception, UserError), (args, result.output)
        assert match in str(result.exception) and "\n" not in str(result.exception)
    # allowed: reaches the trainer; --steps stops this invocation, the run keeps its length
    calls = []
    monkeypatch.setattr("musketeers.run.trainer.train",
                        lambda cfg, **kw: calls.append((cfg, kw)) or {})
    result = runner.invoke(cli_main.app, ["train", "--resume", "--run-dir", str(run),
                                          "--method", "perceiver", "--steps", "9"])
    assert result.exit_code == 0, result.output
    (cfg, kw), = calls
    saved_steps = BUDGETS["pocket"]["steps"]  # the run's own length, from its budget
    assert cfg.steps == saved_steps and kw == {"resume": True, "stop_after": 9,
                                              "unverified": False}
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]
    result = runner.invoke(cli_main.app, ["train", "--resume", "--run-dir", str(run),
                                          "--steps", str(saved_steps + 1)])
    assert f"the run has {saved_steps} steps and keeps them" in str(result.exception)


def test_cli_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch):
    from musketeers.cli import main as cli_main

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    cases = [
        ["train", "--method", "nope", "--run-dir", "r"],
        ["train", "--pooling", "nope", "--run-dir", "r"],
        ["train", "--budget", "nope", "--run-dir", "r"],
        ["train", "--config", str(write(tmp_path, {"bogus": 1})), "--run-dir", "r"],
        ["train", "--resume", "--run-dir", "r"],
        ["eval", "r"],
    ]
    for args in cases:
        monkeypatch.setattr("sys.argv", ["musketeers", *args])
        result = runner.invoke(cli_main.app, args)
        assert result.exit_code != 0, args
        assert isinstance(result.exception, UserError), (args, result.exception)
        assert "\n" not in str(result.exception)
        with pytest.raises(SystemExit) as exit_info:
            cli_main.main()
        assert exit_info.value.code == 2
    assert not (tmp_path / "r").exists() and not (tmp_path / "runs").exists()


def test_bad_input_is_refused_in_one_line_before_anything_is_created(tmp_path, monkeypatch):
    """Binary files, a negative seed, CUDA on a machine without it, two ways to pick a team:
    each a one-line UserError naming the fix, exit 2, no run folder."""
    import torch

    from musketeers.cli import main as cli_main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(bytes(range(256)) * 4)
    cases = [
        (["--config", str(garbage)], "not UTF-8 text; pass a YAML file to --config"),
        (["--team-file", str(garbage), "--budget", "smoke"], "not UTF-8 text; pass a YAML team"),
        (["--seed", "-1"], "'seed' must be in [0, 2**32), got -1"),
        (["--device", "cuda"], "needs CUDA, which this machine lacks; pass --device cpu"),
        (["--device", "gpu0"], "unknown device 'gpu0'"),
        (["--team", "naive", "--experts", "a,b"], "--team and --experts both given; give one"),
        (["--experts", "a", "--team-file", str(garbage)], "give one of --team, --experts or"),
    ]
    runner = CliRunner()
    for args, match in cases:
        full = ["train", *args, "--run-dir", "r"]
        result = runner.invoke(cli_main.app, full)
        assert isinstance(result.exception, UserError), (args, result.exception)
        assert match in str(result.exception) and "\n" not in str(result.exception), args
        monkeypatch.setattr("sys.argv", ["musketeers", *full])
        with pytest.raises(SystemExit) as exit_info:
            cli_main.main()
        assert exit_info.value.code == 2
    assert not (tmp_path / "r").exists() and not (tmp_path / "runs").exists()


def test_a_yaml_team_is_replaced_by_the_command_lines(tmp_path):
    path = write(tmp_path, {"experts": ["a", "b"]})
    cfg = resolve_config(path, {"team": "naive"})
    assert cfg.team == "naive" and cfg.experts is None
    # a saved config.yaml holds the default team beside its experts: still readable as --config
    assert resolve_config(write(tmp_path, {"team": "default", "experts": ["a"]})).experts == ["a"]


@pytest.mark.parametrize("command, raised, code, said", [
    ("train", KeyboardInterrupt, 130, "interrupted (SIGINT); resume it with: musketeers train "
                                      "--run-dir {run} --resume"),
    ("train", SystemExit(143), 143, "interrupted (SIGTERM); resume it with: musketeers train "
                                    "--run-dir {run} --resume"),
    ("precompute", KeyboardInterrupt, 130, "interrupted (SIGINT); run the same command again "
                                           "to resume"),
])
def test_interrupts_say_how_to_resume_and_keep_the_exit_status(tmp_path, monkeypatch, capsys,
                                                               command, raised, code, said):
    import signal

    from musketeers.cli import main as cli_main

    def interrupted(*args, **kwargs):
        raise raised

    monkeypatch.setattr("musketeers.run.trainer.train", interrupted)
    monkeypatch.setattr("musketeers.run.features.precompute_features", interrupted)
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # keep pytest's own handlers
    run = tmp_path / "r"
    args = ["train", "--budget", "smoke", "--run-dir", str(run)] if command == "train" else [
        "precompute", "--task", "logic", "--cache-dir", str(tmp_path / "stores")]
    monkeypatch.setattr("sys.argv", ["musketeers", *args])
    with pytest.raises(SystemExit) as exit_info:
        cli_main.main()
    assert exit_info.value.code == code
    assert said.format(run=run) in capsys.readouterr().err


def test_dtype_auto_follows_the_devices_native_support(monkeypatch):
    """auto: bf16 where the device computes it natively, float32 where it would be emulated."""
    from musketeers.cache import devices
    from musketeers.config import torch_dtype_name

    assert torch_dtype_name("auto", "cpu") == ("bfloat16" if devices.cpu_has_bf16()
                                               else "float32")
    monkeypatch.setattr(devices, "cpu_has_bf16", lambda: False)
    assert torch_dtype_name("auto", "cpu") == "float32"
    assert torch_dtype_name("auto", "cuda") == "bfloat16"
    monkeypatch.setattr(devices, "cpu_has_bf16", lambda: True)
    assert torch_dtype_name("auto", "cpu") == "bfloat16"
    assert torch_dtype_name("float32", "cuda") == "float32"  # an explicit dtype is kept
    assert resolve_config(None, {"budget": "pocket"}).dtype == "auto"


def test_precompute_and_train_take_the_same_dtype_names():
    # one grid file names one dtype for both halves (the pocket grid pins float32)
    import torch

    from musketeers.cache.devices import resolve_dtype
    from musketeers.cache.errors import UserError
    from musketeers.config_checks import DTYPES

    for name in DTYPES:
        if name != "auto":
            assert resolve_dtype(name, "cpu") == getattr(torch, name)
    assert resolve_dtype("bf16", "cpu") == torch.bfloat16  # the short names still work
    with pytest.raises(UserError, match="float32, bfloat16 or float16"):
        resolve_dtype("fp8", "cpu")


@pytest.mark.parametrize("budget", sorted(BUDGETS))
def test_untrained_runs_one_step_whatever_the_budget(budget):
    assert resolve_config(None, {"method": "untrained", "budget": budget}).steps == 1
    assert resolve_config(None, {"method": "untrained", "budget": budget, "steps": 50}).steps == 1
    assert resolve_config(None, {"method": "single", "budget": budget}).steps == \
        BUDGETS[budget]["steps"]


def test_train_untrained_reaches_the_trainer_with_one_step(tmp_path, monkeypatch):
    from musketeers.cli import main as cli_main

    calls = []
    monkeypatch.setattr("musketeers.run.trainer.train",
                        lambda cfg, **kw: calls.append(cfg) or {})
    result = CliRunner().invoke(cli_main.app, ["train", "--method", "untrained", "--budget",
                                               "pocket", "--run-dir", str(tmp_path / "u")])
    assert result.exit_code == 0, result.output
    (cfg,) = calls
    assert cfg.method == "untrained" and cfg.steps == 1


def test_the_grid_takes_the_methods_steps_too():
    from musketeers.design.gridspec import load_grid

    runs = load_grid("pocket").runs
    untrained = [r for r in runs if r.fields["method"] == "untrained"]
    assert untrained and all(r.fields["steps"] == 1 for r in untrained)
    assert all(r.fields.get("steps") != 1 for r in runs if r.fields["method"] == "single")


def test_help_outside_a_terminal_is_not_cut_at_80_columns():
    """CliRunner is no terminal: every option's help and default must come through whole."""
    from musketeers.cli import main as cli_main
    from musketeers.config import TrainConfig

    result = CliRunner().invoke(cli_main.app, ["train", "--help"])
    assert result.exit_code == 0, result.output
    assert TrainConfig.policy in result.output  # the default policy's full name
    assert "untrained" in result.output  # the end of --method's list of choices
    assert max(len(line) for line in result.output.splitlines()) > 80
