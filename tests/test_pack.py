"""A grid's published runs are one xz tarball beside its report: packing keeps every byte,
the report rebuilt from the pack is the report rebuilt from the folder, a finished run is
published into the pack, a fresh machine adopts runs from it, and a damaged pack is one line
naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from musketeers.cache.errors import UserError
from musketeers.design.gridspec import load_grid
from musketeers.grid.fake import fake_evaluate, fake_train
from musketeers.grid.ledger import ledger_path
from musketeers.grid.pack import (
    editing,
    folder_files,
    opened,
    pack_of,
    read_pack,
    unpack,
    write_pack,
)
from musketeers.grid.publish import adopt_published, publish_finished, publish_run, publish_runs
from musketeers.grid.run import run_grid
from tests.test_shard import run_cli

FILES = {"r-s0/config.yaml": b"method: single\n",
         "r-s0/eval_samples.jsonl": b'{"a": 1}\n' * 50, "stale/r-s0.1/eval.json": b"{}",
         "ledger-g.jsonl": b"", "r-s1/odd \xc3\xa9.txt": b"\x00\xff"}


def _grid(tmp_path: Path) -> Path:
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({
        "name": "g", "budget": "t", "seeds": [0, 1], "eval_limit": 4,
        "defaults": {"budget": "t", "pooling": "last"},
        "runs": [{"task": ["arithmetic", "logic"], "method": "single"}]}))
    return path


def _ran(tmp_path: Path, runs_dir: Path):
    grid = load_grid(_grid(tmp_path))
    run_grid(grid, runs_dir, lambda f: fake_train(f, steps=3), fake_evaluate, lambda f: f,
             ledger=ledger_path(runs_dir, grid.name))
    return grid


def test_pack_then_unpack_gives_back_every_file_byte_for_byte(tmp_path: Path):
    write_pack(tmp_path / "runs.tar.xz", FILES)
    assert read_pack(tmp_path / "runs.tar.xz") == FILES
    unpack(tmp_path / "runs.tar.xz", tmp_path / "out")
    assert folder_files(tmp_path / "out") == FILES
    # the same files make the same bytes: a publish that changes nothing changes no commit
    write_pack(tmp_path / "again.tar.xz", dict(reversed(FILES.items())))
    assert (tmp_path / "again.tar.xz").read_bytes() == (tmp_path / "runs.tar.xz").read_bytes()


def test_the_report_from_the_pack_is_the_report_from_the_folder(tmp_path: Path, monkeypatch,
                                                                capsys):
    grid = _ran(tmp_path, tmp_path / "runs")
    published = tmp_path / "reports" / "g" / "runs"
    assert sorted(publish_runs(grid, tmp_path / "runs", published)) == sorted(
        r.name for r in grid.runs)
    assert pack_of(published).is_file() and not published.exists()
    monkeypatch.chdir(tmp_path)
    # the shortcut baselines score the tasks' validation items, the same either way: not here
    monkeypatch.setattr("musketeers.reports.report.shortcut_lines", lambda grid: [])
    built = {}
    for where, runs in (("folder", "runs"), ("pack", "reports/g/runs")):
        code, _, err = run_cli(monkeypatch, capsys, "ablate", "--grid", "g.yaml", "--report-only",
                            "--runs-dir", runs, "--reports-dir", where)
        assert code == 0, err
        built[where] = folder_files(tmp_path / where / "g")
    built["folder"].pop("runs.tar.xz")  # the report from local runs publishes them beside it
    assert built["folder"] == built["pack"] and "table1.md" in built["pack"]
    assert b"runs.tar.xz" in built["pack"]["README.md"]  # it says how to unpack one run
    assert not (tmp_path / "reports" / "g" / "runs").exists()  # unpacked elsewhere, removed
    with opened(pack_of(published)) as named:  # the pack named directly reads the same
        assert sorted(p.name for p in named.iterdir()) == sorted(
            [*(r.name for r in grid.runs), "ledger-g.jsonl"])
    # rebuilt in place from its own pack: said so, not "the artefacts of 0 finished runs"
    before = pack_of(published).read_bytes()
    code, out, err = run_cli(monkeypatch, capsys, "ablate", "--grid", "g.yaml", "--report-only",
                             "--runs-dir", "reports/g/runs", "--reports-dir", "reports")
    assert code == 0, err
    assert "rebuilt from the published runs in reports/g/runs.tar.xz" in out, out
    assert pack_of(published).read_bytes() == before


def test_a_finished_run_is_published_into_the_pack_and_adopted_from_it(tmp_path: Path):
    grid = _ran(tmp_path, tmp_path / "runs")
    run = grid.runs[0].name
    (tmp_path / "runs" / run / "warmup.jsonl").write_text('{"warmup_step": 1}\n')
    published = tmp_path / "reports" / "g" / "runs"
    publish_finished(grid, tmp_path / "runs" / run, tmp_path / "runs", published)
    publish_run(tmp_path / "runs" / run, tmp_path / "plain" / run, eval_limit=grid.eval_limit)
    packed = read_pack(pack_of(published))
    assert {k: v for k, v in packed.items() if k.startswith(f"{run}/")} == folder_files(
        tmp_path / "plain")
    assert f"{run}/warmup.jsonl" in packed and "ledger-g.jsonl" in packed
    assert list(published.parent.iterdir()) == [pack_of(published)]  # no folder, no temp file
    # another machine: an empty runs/ adopts what the pack holds, and only that
    assert adopt_published(grid, tmp_path / "fresh", published) == [run]
    assert folder_files(tmp_path / "fresh" / run) == folder_files(tmp_path / "plain" / run)


def test_a_folder_published_before_packs_is_packed_and_removed(tmp_path: Path):
    folder = tmp_path / "runs"
    for name, data in FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    with editing(folder) as view:
        (view / "r-s2").mkdir()
        (view / "r-s2" / "eval.json").write_text("{}")
    assert not folder.exists() and read_pack(pack_of(folder)) == {**FILES, "r-s2/eval.json": b"{}"}


@pytest.mark.parametrize("damage", ["truncated", "foreign"])
def test_a_damaged_pack_is_one_line_naming_the_fix(tmp_path: Path, damage: str, monkeypatch,
                                                   capsys):
    pack = tmp_path / "reports" / "g" / "runs.tar.xz"
    write_pack(pack, FILES)
    if damage == "truncated":
        pack.write_bytes(pack.read_bytes()[:len(pack.read_bytes()) // 2])
    else:  # a member that climbs out of the folder it unpacks into
        write_pack(pack, {"../escape.txt": b"x"})
    with pytest.raises(UserError) as err, opened(tmp_path / "reports" / "g" / "runs"):
        pass
    assert "git checkout -- " in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "reports" / "escape.txt").exists()
    _grid(tmp_path)
    monkeypatch.chdir(tmp_path)
    code, _, err_text = run_cli(monkeypatch, capsys, "ablate", "--grid", "g.yaml", "--report-only",
                             "--runs-dir", "reports/g/runs", "--reports-dir", "elsewhere")
    assert code == 2 and len(err_text.strip().splitlines()) == 1
    assert "git checkout -- reports/g/runs.tar.xz" in err_text


def test_a_folder_beside_its_pack_is_refused_in_one_line(tmp_path: Path):
    write_pack(tmp_path / "runs.tar.xz", FILES)
    (tmp_path / "runs").mkdir()
    with pytest.raises(UserError, match="keep one"), opened(tmp_path / "runs"):
        pass
