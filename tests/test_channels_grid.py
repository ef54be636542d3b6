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
