"""A grid that varies the channel: its runs' names, its report cells and its verdicts keep
the channels apart, a run from before channels reads as pooled, and the pre-registered
pocket-channels grid loads with the cells it names."""

from __future__ import annotations

from pathlib import Path

from musketeers.design.gridspec import load_grid, run_name
from musketeers.reports.aggregate import load_runs
from musketeers.reports.keys import group_key
from musketeers.reports.verdict_table import verdict_rows
from tests.test_sensitivity import _run

GRID = Path(__file__).parent.parent / "musketeers/configs/ablations/pocket-channels.yaml"
TASK = "arithmetic:easier@direct"


def test_a_run_name_names_a_token_channel_and_keeps_the_pooled_names():
    base = dict(task=TASK, method="perceiver", team="oracle", pooling="last", latents=8)
    old = "pocket-arithmeticeasier@direct-perceiver-oracle-last-m8-s0"
    assert run_name("pocket", base) == old
    assert run_name("pocket", {**base, "channel": "pooled", "token_layer": 12}) == old
    assert run_name("pocket", {**base, "channel": "tokens"}) == (
        "pocket-arithmeticeasier@direct-perceiver-oracle-tokens-m8-s0")
    assert run_name("pocket", {**base, "channel": "answer", "token_layer": 12}) == (
        "pocket-arithmeticeasier@direct-perceiver-oracle-answer-L12-m8-s0")
    # Single reads no expert: its name is the same whatever channel a grid's defaults give
    single = dict(task=TASK, method="single", pooling="last", latents=8)
    assert run_name("pocket", {**single, "channel": "tokens"}) == run_name("pocket", single)


def test_a_cell_key_reads_a_run_without_a_channel_as_pooled():
    base = dict(task=TASK, method="perceiver", team="oracle", pooling="last", latents=8)
    assert group_key(base) == group_key({**base, "channel": "pooled", "token_layer": 3})
    assert group_key(base)["channel"] == "pooled" and group_key(base)["token_layer"] is None
    tokens = group_key({**base, "channel": "tokens"})
    assert tokens["channel"] == "tokens" and tokens["token_layer"] == -1
    assert tokens["pooling"] is None  # a token channel reads no pooled vector
    assert group_key({**base, "channel": "tokens", "token_layer": 2}) != tokens
    single = group_key(dict(task=TASK, method="single", channel="tokens"))
    assert single["channel"] is None and single["token_layer"] is None


def test_verdicts_compare_each_channel_with_its_own_control(tmp_path: Path):
    base = dict(task=TASK, pooling="last", latents=8)
    gains = {"pooled": 0.0, "tokens": 0.30, "answer": 0.10}
    for s in range(3):
        _run(tmp_path, f"single{s}", 0.55 + s / 100, method="single", seed=s, **base)
        for channel, gain in gains.items():
            # pooled runs as the published ones are: no channel field in their config
            on = {} if channel == "pooled" else {"channel": channel, "token_layer": -1}
            _run(tmp_path, f"o-{channel}{s}", 0.56 + gain - s / 200, method="perceiver",
                 team="oracle", seed=s, **base, **on)
            _run(tmp_path, f"c-{channel}{s}", 0.56 + s / 300, method="shuffled_experts",
                 team="oracle", seed=s, **base, **on)
    rows = {r.comparison.name: r for r in verdict_rows(load_runs(tmp_path), ["arithmetic"])}
    assert set(rows) == {f"oracle{c} > {ctl}" for c in ("", " (tokens)", " (answer)")
                         for ctl in ("Single", "its shuffled experts")}
    for name, gain in (("oracle", 0.0), ("oracle (tokens)", 0.30), ("oracle (answer)", 0.10)):
        assert abs(rows[f"{name} > its shuffled experts"].test.diff - 100 * gain) < 1.0, name
        assert abs(rows[f"{name} > Single"].tested - rows["oracle > Single"].tested
                   - 100 * gain) < 1e-6, name


def test_the_default_team_through_a_channel_is_compared_with_its_own_cells(tmp_path: Path):
    # the oracle's cells on the same channel must not stand in for the team's
    base = dict(task=TASK, pooling="last", latents=8)
    on = {"channel": "tokens", "token_layer": -1}
    for s in range(3):
        _run(tmp_path, f"single{s}", 0.40 + s / 100, method="single", seed=s, **base)
        _run(tmp_path, f"t{s}", 0.50 + s / 200, method="perceiver", team="default", seed=s,
             **base, **on)
        _run(tmp_path, f"tc{s}", 0.45 + s / 300, method="shuffled_experts", team="default",
             seed=s, **base, **on)
        _run(tmp_path, f"o{s}", 0.90, method="perceiver", team="oracle", seed=s, **base, **on)
    rows = {r.comparison.name: r for r in verdict_rows(load_runs(tmp_path), ["arithmetic"])}
    assert {"Ours (tokens) > Single", "Ours (tokens) > shuffled experts"} <= set(rows)
    team = rows["Ours (tokens) > Single"]
    assert abs(team.tested - 100 * (0.50 + 0.01 / 2)) < 1e-6  # the team's mean, not the oracle's
    assert abs(team.test.diff - 100 * (0.10 - 0.01 / 2)) < 1e-6
    assert abs(rows["Ours (tokens) > shuffled experts"].test.diff
               - 100 * (0.05 + (1 / 200 - 1 / 300))) < 1e-6
    assert "Ours > Single (§4.2)" not in rows  # no pooled team cell ran


def test_the_channels_grid_loads_its_registered_cells():
    grid = load_grid(GRID)
    assert grid.name == "pocket-channels" and grid.seeds == [0, 1, 2]
    cells = {(r.fields["method"], r.fields.get("team"), r.fields.get("channel"), r.fields["seed"])
             for r in grid.runs}
    want = {("single", None, None, s) for s in range(3)} | {
        (m, "oracle", c, s) for m in ("perceiver", "shuffled_experts")
        for c in ("tokens", "answer") for s in range(3)}
    assert cells == want
    assert len({r.name for r in grid.runs}) == len(grid.runs) == 15
    assert grid.estimate.startswith(f"{len(grid.runs)} runs")
    assert all(r.fields["task"] == TASK and r.fields["adapter_warmup"] == 80 for r in grid.runs)
    assert grid.prereg is not None and grid.prereg.primary == "exact"
    assert grid.prereg.seeds == (0, 1, 2)
    assert set(grid.prereg.confirmatory) == {
        f"oracle ({c}) > {ctl}" for c in ("tokens", "answer")
        for ctl in ("Single", "its shuffled experts")}


def test_the_channels_grid_precomputes_the_token_states_its_runs_read(tmp_path: Path,
                                                                      monkeypatch):
    """The pre-registered grid needs no manual precompute: its oracle experts get the hints'
    pass and the last layer's token states (``--hints --token-states=-1``) in one call, and a
    grid without precompute settings names that command."""
    import shlex

    import pytest

    from musketeers.cache.errors import UserError
    from musketeers.grid.needs import ensure_cache, grid_needs

    grid = load_grid(GRID, overrides={"cache_dir": str(tmp_path / "stores")})

    def team(name, roster):
        return {"oracle": ["e1", "e2"]}[name]

    (need,) = grid_needs(grid, team)  # Single reads the same store's items
    assert need.token_units == {e: {("tokens", -1): None, ("answer", -1): None}
                                for e in ("e1", "e2")}
    assert list(need.hint_experts) == ["e1", "e2"] and need.token_layers("e1") == (-1,)
    calls: list[dict] = []
    monkeypatch.setattr("musketeers.run.features.precompute_features",
                        lambda task, **kw: calls.append({"task": task, **kw}))
    assert ensure_cache(grid, grid.precompute, team) == [TASK]
    assert [(c["task"], c["experts"], c["hints"], c["token_layers"]) for c in calls] == [
        (TASK, ["e1", "e2"], True, (-1,))]
    with pytest.raises(UserError) as err:
        ensure_cache(grid, None, team)
    fix = shlex.split(str(err.value).split("; run: ")[1])
    assert "--hints" in fix and "--token-states=-1" in fix


def test_a_grid_groups_its_precompute_by_hints_and_token_layers(tmp_path: Path, monkeypatch):
    """Pooled runs add no token states; a tokens run at another layer gets its own call, and
    zero_context (the same on every channel) reads pooled vectors."""
    import yaml

    from musketeers.grid.needs import ensure_cache, grid_needs

    path = tmp_path / "g.yaml"
    base = {"task": "arithmetic", "cache_dir": str(tmp_path / "stores")}
    path.write_text(yaml.safe_dump({"budget": "t", "runs": [
        {**base, "method": "perceiver", "team": "a"},
        {**base, "method": "zero_context", "team": "z", "channel": "tokens"},
        {**base, "method": "perceiver", "team": "b", "channel": "tokens", "token_layer": 2},
        {**base, "method": "output_collab", "team": "c"}]}))
    grid = load_grid(path)

    def team(name, roster):
        return {"a": ["e1"], "z": ["e4"], "b": ["e2"], "c": ["e3"]}[name]

    (need,) = grid_needs(grid, team)
    assert need.token_units == {"e2": {("tokens", 2): None}}
    calls: list[dict] = []
    monkeypatch.setattr("musketeers.run.features.precompute_features",
                        lambda task, **kw: calls.append(kw))
    ensure_cache(grid, {"limit": 8}, team)
    assert [(c["experts"], c["hints"], c["token_layers"]) for c in calls] == [
        (["e1", "e4"], False, ()), (["e2"], False, (2,)), (["e3"], True, ())]


def test_the_grid_adds_the_answer_states_a_store_lacks_and_then_finds_them(tmp_path: Path):
    """A grid on the answer channel over a store that a pooled grid filled: the grid adds the
    hints' pass and its answer states (the CLI's precompute path), leaves the pooled vectors'
    bytes as they were, the reader reads the new states, and a second pass has nothing to do."""
    import yaml

    from musketeers.cache import reader
    from musketeers.grid.needs import ensure_cache, grid_needs, missing_tokens, open_task_store

    stores = tmp_path / "stores"

    def grid(channel: str):
        path = tmp_path / f"{channel}.yaml"
        path.write_text(yaml.safe_dump({"budget": "smoke", "runs": [
            {"task": "arithmetic", "method": "perceiver", "roster": "tiny", "experts": "tiny-gpt2",
             "cache_dir": str(stores), "channel": channel}]}))
        return load_grid(path)

    settings = {"limit": 4, "dtype": "float32", "device": "cpu"}
    assert ensure_cache(grid("pooled"), settings) == ["arithmetic"]
    pooled = sorted((p, p.stat().st_mtime_ns) for p in stores.rglob("tiny-gpt2/last/**/*")
                    if p.is_file())
    (need,) = grid_needs(grid("answer"))
    assert missing_tokens(need, open_task_store(need)) == ["tiny-gpt2"]
    assert ensure_cache(grid("answer"), settings) == ["arithmetic"]
    assert missing_tokens(need, open_task_store(need)) == []
    for split in ("train", "val"):
        (rows,) = reader.read_token_rows(stores, "arithmetic", split, ["tiny-gpt2"], "answer", -1)
        assert len(rows) == 4
    assert pooled and pooled == sorted((p, p.stat().st_mtime_ns) for p, _ in pooled)
    assert ensure_cache(grid("answer"), settings) == []
