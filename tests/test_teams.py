"""Teams: every team × roster resolves, sizes as documented, user lists and team files."""

from __future__ import annotations

import importlib.util

import pytest

from musketeers.cache.errors import UserError
from musketeers.cache.experts import KINDS, TINY_EXPERTS
from musketeers.teams import (
    EXPERTS,
    POLICIES,
    ROSTERS,
    TEAMS,
    describe,
    expert_spec,
    load_team_file,
    policy_spec,
    resolve_team,
)

SIZES = {  # (paper, pocket, tiny); pocket deviations are documented in teams.yaml notes
    "default": (3, 3, 3), "generalist": (5, 3, 5), "naive": (4, 4, 4), "llm": (3, 2, 3),
    "strong": (3, 3, 3), "oracle": (4, 4, 4),
}


def test_names():
    assert TEAMS == ("default", "generalist", "naive", "llm", "strong", "oracle")
    assert ROSTERS == ("pocket", "paper", "tiny")


@pytest.mark.parametrize("team", TEAMS)
def test_every_team_and_roster_resolves_with_documented_size(team):
    for roster, size in zip(("paper", "pocket", "tiny"), SIZES[team], strict=True):
        specs = resolve_team(team, roster)
        assert len(specs) == size
        assert len({s.name for s in specs}) == size
        assert all(s.kind in KINDS for s in specs)
        text = describe(team, roster)
        assert all(s.name in text for s in specs)
        if size != SIZES[team][0]:
            assert f"{size} of the paper's {SIZES[team][0]}" in text and "note:" in text


def test_paper_roster_is_the_papers_hub_ids():
    refs = [s.ref for s in resolve_team("default", "paper")]
    assert refs == ["Qwen/Qwen2.5-Math-1.5B-Instruct", "Qwen/Qwen2.5-Coder-7B-Instruct",
                    "meta-llama/Llama-3.2-3B-Instruct"]
    naive = [s.ref for s in resolve_team("naive", "paper")]
    assert naive == [*refs, "openai-community/gpt2"]
    llm = [s.ref for s in resolve_team("llm", "paper")]
    assert llm == [*refs[:2], "openai/gpt-oss-20b"]
    assert all(s.kind == "hub" for t in TEAMS for s in resolve_team(t, "paper"))


def test_pocket_naive_member_is_random_gpt2_named_as_such():
    weak = resolve_team("naive", "pocket")[-1]
    assert (weak.name, weak.kind, weak.ref) == ("gpt2-random", "random", "gpt2")
    assert "seeded random weights" in weak.description
    assert resolve_team("naive", "pocket")[:3] == resolve_team("default", "pocket")


def test_pocket_packages_exist():
    for spec in resolve_team("naive", "pocket")[:3]:
        for package in spec.ref.split(","):
            assert importlib.util.find_spec(package) is not None, package
        assert spec.sha256 and len(spec.sha256) == 64


def test_tiny_experts_match_the_cache_test_models():
    for spec in TINY_EXPERTS:
        assert EXPERTS[spec.name] == spec and EXPERTS[spec.name].config == spec.config
    widths = {s.name: s.config.get("hidden_size", s.config.get("n_embd"))
              for s in resolve_team("generalist", "tiny")}
    assert all(32 <= w <= 96 for w in widths.values()) and len(set(widths.values())) == 5


def test_default_team_and_roster():
    assert resolve_team() == resolve_team("default", "pocket")


@pytest.mark.parametrize("kwargs, match", [
    ({"team": "dream"}, "valid teams: default, generalist, naive, llm"),
    ({"team": "default", "roster": "cloud"}, "valid rosters: pocket, paper, tiny"),
    ({"experts": "smollm2-135m-instruct,nonexistent"}, "unknown expert 'nonexistent'"),
    ({"experts": ""}, "empty"),
    ({"experts": "gemma-3-270m,gemma-3-270m"}, "repeat"),
    ({"team": "default", "experts": "gemma-3-270m"}, "not several"),
])
def test_bad_names_are_user_errors(kwargs, match):
    with pytest.raises(UserError, match=match):
        resolve_team(**kwargs)


def test_experts_list_parsing(tmp_path):
    folder = tmp_path / "My Model"
    folder.mkdir()
    specs = resolve_team(experts=f"smollm2-135m-instruct, Qwen/Qwen2.5-Math-1.5B-Instruct,"
                                 f"someorg/Some-LM_7B,{folder}")
    assert specs[0] == EXPERTS["smollm2-135m-instruct"]
    assert specs[1] == EXPERTS["qwen2.5-math-1.5b-instruct"]  # a registry hub id is that expert
    assert (specs[2].kind, specs[2].ref, specs[2].name) == ("hub", "someorg/Some-LM_7B",
                                                             "some-lm_7b")
    assert (specs[3].kind, specs[3].name) == ("dir", "my-model")
    assert resolve_team(experts=["tiny-llama", "tiny-gpt2"]) == [EXPERTS["tiny-llama"],
                                                                 EXPERTS["tiny-gpt2"]]


def test_team_file(tmp_path):
    (tmp_path / "local").mkdir()
    team = tmp_path / "team.yaml"
    team.write_text(
        "name: mine\n"
        "experts:\n"
        "  - tiny-llama\n"
        "  - local\n"                                   # relative to the team file
        "  - org/hub-model\n"
        "  - {name: My GGUF, kind: gguf, ref: some_pkg, file: m.gguf, sha256: abc}\n"
        "  - {ref: tiny-gpt2, name: weak}\n"
    )
    specs = resolve_team(team_file=team)
    assert [s.name for s in specs] == ["tiny-llama", "local", "hub-model", "my-gguf", "weak"]
    assert specs[1].ref == str((tmp_path / "local").resolve())
    assert (specs[3].kind, specs[3].file, specs[3].sha256) == ("gguf", "m.gguf", "abc")
    assert specs[4].kind == "random" and specs[4].ref == "gpt2"
    (tmp_path / "bare.yaml").write_text("- tiny-qwen2\n- tiny-gemma3\n")
    assert [s.name for s in load_team_file(tmp_path / "bare.yaml")] == ["tiny-qwen2",
                                                                       "tiny-gemma3"]


@pytest.mark.parametrize("text, match", [
    ("experts: [{kind: hub, ref: a/b, colour: red}]", "unknown keys"),
    ("experts: [{kind: teleport, ref: x}]", "kind 'teleport' is unknown"),
    ("experts: [{kind: hub}]", "needs 'kind' and 'ref'"),
    ("experts: [42]", "must be a name"),
    ("members: [tiny-llama]", "expected keys experts"),
    ("experts: tiny-llama", "must be a list"),
    ("experts: [unclosed", "not valid YAML"),
])
def test_bad_team_file(tmp_path, text, match):
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=match):
        resolve_team(team_file=path)
    with pytest.raises(UserError, match="team file not found"):
        resolve_team(team_file=tmp_path / "missing.yaml")


def test_policies():
    assert policy_spec().name == "qwen2.5-coder-0.5b-instruct"
    assert policy_spec("smollm2").name == "smollm2-135m-instruct"
    assert policy_spec("paper").ref == "Qwen/Qwen2.5-3B-Instruct"
    tiny = policy_spec("tiny")
    assert tiny.kind == "random" and tiny.tokenizer == "smollm2"  # chat template: SmolLM2's
    assert policy_spec("gemma-3-270m") == EXPERTS["gemma-3-270m"]
    assert set(POLICIES) == {"pocket", "smollm2", "paper", "tiny"}
    with pytest.raises(UserError, match="unknown policy 'nobody'.*pocket, smollm2"):
        policy_spec("nobody")
    assert expert_spec("Qwen/Qwen2.5-3B-Instruct") == policy_spec("paper")


@pytest.mark.slow
def test_new_random_specs_build_and_run(tmp_path, monkeypatch):
    """tiny-gemma3, tiny-mistral and gpt2-random build through the cache's loader and run."""
    import torch

    from musketeers.cache.experts import load_expert

    monkeypatch.setenv("MUSKETEERS_MODELS_DIR", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name, width in (("tiny-gemma3", 32), ("tiny-mistral", 80), ("gpt2-random", 384)):
        model, tok = load_expert(EXPERTS[name])
        ids = tok("What is 2 + 2?", return_tensors="pt")
        with torch.inference_mode():
            out = model(**ids, output_hidden_states=True)
        assert out.hidden_states[-1].shape[-1] == width


def test_teams_command_shows_every_team_and_refuses_an_unknown_one():
    from typer.testing import CliRunner

    from musketeers.cli.main import app

    out = CliRunner().invoke(app, ["teams", "--roster", "paper"])
    assert out.exit_code == 0, out.output
    for team in TEAMS:
        assert f"team {team} (paper roster)" in out.output
    assert "Qwen/Qwen2.5-Math-1.5B-Instruct" in out.output and "policies: " in out.output
    one = CliRunner().invoke(app, ["teams", "llm"])
    assert "team llm (pocket roster)" in one.output and "team default" not in one.output
    bad = CliRunner().invoke(app, ["teams", "nope"])
    assert isinstance(bad.exception, UserError) and "valid teams" in str(bad.exception)
