"""``ablate --list`` and ``--shard K/N``: workers take disjoint shares that together are the
grid, each publishes into one folder, and a report built from it sees every run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from musketeers.cli import main as cli_main
from musketeers.design.gridspec import load_grid
from musketeers.grid.fake import fake_evaluate, fake_train
from musketeers.grid.ledger import ledger_path, totals
from musketeers.grid.pack import opened
from musketeers.grid.publish import publish_ledger, publish_runs
from musketeers.grid.run import run_grid
from musketeers.grid.shard import parse_shard, shard
from musketeers.reports.aggregate import load_runs


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["musketeers", *args])
    with pytest.raises(SystemExit) as exc:
        cli_main.main()
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def listed(monkeypatch, capsys, *args: str) -> list[str]:
    code, out, err = run_cli(monkeypatch, capsys, "ablate", "--budget", "pocket", "--list", *args)
    assert code == 0, err
    return out.splitlines()


def test_list_prints_the_grids_runs_in_run_order(monkeypatch, capsys):
    names = listed(monkeypatch, capsys)
    assert names == [r.name for r in load_grid("pocket").runs]
    assert len(names) == len(set(names)) > 8


@pytest.mark.parametrize("n", [1, 3, 8])
def test_the_shards_are_disjoint_and_together_the_whole_list(n, monkeypatch, capsys):
    everything = listed(monkeypatch, capsys)
    shares = [listed(monkeypatch, capsys, "--shard", f"{k}/{n}") for k in range(1, n + 1)]
    assert sorted(sum(shares, [])) == sorted(everything)
    assert sum(len(s) for s in shares) == len(everything)  # no run in two shares
    for k, share in enumerate(shares, start=1):
        assert share == everything[k - 1::n]  # in run order, every n-th from the k-th


@pytest.mark.parametrize("bad", ["0/2", "3/2", "x", "1/0", "2", "-1/2", "1/2/3"])
def test_a_bad_shard_is_refused_in_one_line(bad, monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "ablate", "--budget", "pocket", "--list",
                             "--shard", bad)
    assert code != 0 and out == ""
    assert err.startswith("error: --shard") and len(err.strip().splitlines()) == 1, err


def test_parse_shard_reads_k_of_n():
    assert parse_shard("1/8") == (1, 8) and parse_shard(" 8 / 8 ") == (8, 8)


def test_workers_publish_into_one_folder_and_the_report_sees_every_run(tmp_path: Path):
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({
        "budget": "t", "seeds": [0, 1], "defaults": {"budget": "t", "pooling": "last"},
        "runs": [{"task": ["arithmetic", "logic"], "method": "single"}]}))
    grid = load_grid(path)
    published = tmp_path / "reports" / "t" / "runs"
    for k in (1, 2):  # each worker on its own machine: its own runs folder and ledger
        part, runs_dir = shard(grid, k, 2), tmp_path / f"worker{k}"
        result = run_grid(part, runs_dir, lambda f: fake_train(f, steps=3), fake_evaluate,
                          lambda f: f, ledger=ledger_path(runs_dir, grid.name))
        assert sorted(result.trained) == sorted(r.name for r in part.runs)
        publish_runs(part, runs_dir, published)
        publish_ledger(part, runs_dir, published)  # again: no call is counted twice
    with opened(published) as folder:  # one pack: reports/t/runs.tar.xz
        assert sorted(r.name for r in load_runs(folder)) == sorted(r.name for r in grid.runs)
        rows = [json.loads(x) for x in ledger_path(folder, grid.name).read_text().splitlines()]
        trained = sorted(r["name"] for r in rows if r["phase"] == "train")
        assert trained == sorted(r.name for r in grid.runs)  # both workers' calls, each once
        assert totals(ledger_path(folder, grid.name))["train"] == pytest.approx(
            sum(r["seconds"] for r in rows if r["phase"] == "train"))


def test_report_only_refuses_a_shard(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "ablate", "--budget", "pocket",
                           "--report-only", "--shard", "1/2")
    assert code == 2 and "--shard" in err and len(err.strip().splitlines()) == 1


def test_precompute_only_trains_nothing(tmp_path: Path, monkeypatch, capsys):
    path = tmp_path / "g.yaml"
    fixtures = Path(__file__).resolve().parent / "fixtures"  # Single reads the store's items
    path.write_text(yaml.safe_dump({"budget": "t", "seeds": [0, 1], "defaults": {
        "budget": "t", "cache_dir": str(fixtures)},
        "runs": [{"task": "arithmetic", "method": "single"}]}))
    runs_dir = tmp_path / "runs"
    code, out, err = run_cli(monkeypatch, capsys, "ablate", "--grid", str(path), "--runs-dir",
                             str(runs_dir), "--reports-dir", str(tmp_path / "reports"),
                             "--precompute-only")
    assert code == 0, err
    assert "stores ready for the 2 runs of grid t" in out
    assert not runs_dir.exists() and not (tmp_path / "reports").exists()


def test_another_dtype_is_a_grid_of_its_own(monkeypatch, capsys):
    """--dtype auto runs a grid natively; its runs never share a folder with the float32
    grid's (a changed dtype would otherwise set the published runs aside as stale)."""
    pinned = listed(monkeypatch, capsys)
    assert listed(monkeypatch, capsys, "--dtype", "float32") == pinned  # the grid's own
    native = listed(monkeypatch, capsys, "--dtype", "auto")
    assert native == [f"{name}-auto" for name in pinned]
    code, _, err = run_cli(monkeypatch, capsys, "ablate", "--budget", "pocket", "--list",
                           "--dtype", "bf17")
    assert code != 0 and err.strip() == ("error: unknown dtype 'bf17'; use auto, float32, "
                                         "bfloat16 or float16")
