"""--channel and --token-layer: checked against the store's declaration, recorded in the run's
name and config, and kept by --resume."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from musketeers.cache.errors import UserError
from musketeers.cache.tokens import CHANNELS
from musketeers.config import resolve_config, save_config
from musketeers.method import methods


def test_channels_are_the_stores_declaration_and_pooled_is_the_default():
    assert resolve_config(None, {}).channel == "pooled"
    for channel in CHANNELS:
        assert resolve_config(None, {"channel": channel}).channel == channel
    with pytest.raises(UserError, match="unknown channel 'hidden'; valid: pooled, tokens, "
                                        "answer$"):
        resolve_config(None, {"channel": "hidden"})


def test_live_experts_refuse_a_token_channel():
    with pytest.raises(UserError, match="pooled vectors only.*pass --channel pooled$"):
        resolve_config(None, {"channel": "answer", "live_experts": True})


def test_a_token_channel_is_part_of_the_run_name_the_paper_s_is_not():
    pooled = resolve_config(None, {"task": "logic", "method": "perceiver"})
    assert pooled.run_path().name == "logic-default-perceiver-last-s0"  # names as before
    tokens = resolve_config(None, {"task": "logic", "channel": "tokens", "token_layer": 6})
    assert tokens.run_path().name == "logic-default-perceiver-tokens6-s0"


def test_methods_without_an_adapter_reading_experts_ignore_the_channel():
    for name in ("single", "output_collab", "untrained", "zero_context"):
        assert {"channel", "token_layer"} <= set(methods.ignored(name)), name
    for name in ("perceiver", "no_cross_attn", "hard_routing", "shuffled_experts",
                 "shuffled_reward"):
        assert "channel" not in methods.ignored(name), name


def test_resume_on_the_command_line_refuses_another_channel(tmp_path):
    from musketeers.cli import main as cli_main

    run = tmp_path / "r"
    run.mkdir()
    save_config(resolve_config(None, {"run_dir": str(run)}), run / "config.yaml")
    result = CliRunner().invoke(cli_main.app, ["train", "--resume", "--run-dir", str(run),
                                               "--channel", "tokens"])
    assert isinstance(result.exception, UserError), result.output
    msg = str(result.exception)
    assert "--channel 'pooled' → 'tokens'" in msg and "new --run-dir" in msg and "\n" not in msg
