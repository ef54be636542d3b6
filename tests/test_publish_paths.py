"""Published artefacts carry no machine's paths: the publisher writes them relative to the
folder the grid ran from, or drops them, and what is committed under reports/ holds none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from musketeers.grid.pack import SUFFIX, read_pack
from musketeers.grid.portable import REWRITES, has_absolute_path
from musketeers.grid.publish import publish_run

ROOT = Path(__file__).resolve().parents[1]


def test_published_config_has_relative_paths_or_none(tmp_path: Path):
    root, elsewhere = tmp_path / "repo", tmp_path / "scratch"
    run = root / "runs" / "r-s0"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({
        "task": "arithmetic", "team_file": None, "cache_dir": str(root / "stores" / "pocket"),
        "run_dir": str(run), "seed": 0}, sort_keys=False))
    (run / "fingerprints.json").write_text(json.dumps(
        {"cache_dir": str(elsewhere / "stores"), "items": "abc", "experts": {}}))
    (run / "error.txt").write_text(f"UserError: run folder {run} is busy\nTraceback (most recent "
                                   f"call last):\n  File \"{elsewhere}/x.py\", line 1\n")
    (run / "summary.json").write_text('{"status": "done"}')
    dest = tmp_path / "reports" / "g" / "runs" / "r-s0"
    publish_run(run, dest, root=root)

    cfg = yaml.safe_load((dest / "config.yaml").read_text())
    assert cfg == {"task": "arithmetic", "team_file": None, "cache_dir": "stores/pocket",
                   "run_dir": "runs/r-s0", "seed": 0}
    fp = json.loads((dest / "fingerprints.json").read_text())
    assert fp == {"items": "abc", "experts": {}}  # a store outside the root: no path at all
    assert (dest / "error.txt").read_text() == "UserError: run folder runs/r-s0 is busy\n"
    assert (dest / "summary.json").read_text() == '{"status": "done"}'  # copied as it is
    for name in ("config.yaml", "fingerprints.json", "error.txt"):
        assert not has_absolute_path((dest / name).read_text()), name


def test_a_task_file_path_is_published_relative_or_as_its_name(tmp_path: Path):
    from musketeers.grid.portable import portable_config

    root = tmp_path / "repo"
    for task, published in ((f"{root}/tasks/mix.yaml:easy@direct", "tasks/mix.yaml:easy@direct"),
                            (f"{tmp_path}/elsewhere/mix.yml", "mix.yml"),
                            ("rg:gcd@direct", "rg:gcd@direct")):
        text = yaml.safe_dump({"task": task, "seed": 0})
        assert yaml.safe_load(portable_config(text, root))["task"] == published


def test_the_check_sees_an_absolute_path():
    assert has_absolute_path("cache_dir: /work/main/stores/pocket\n")
    assert not has_absolute_path("cache_dir: stores/pocket\ntask: algorithmic:easier@direct\n")


# every committed artefact the publisher rewrites, plain or in a pack: {id: text}
PUBLISHED = {str(p.relative_to(ROOT)): p.read_text(errors="replace")
             for name in REWRITES for p in (ROOT / "reports").rglob(name)}
PUBLISHED |= {f"{pack.relative_to(ROOT)}:{member}": data.decode(errors="replace")
              for pack in sorted((ROOT / "reports").rglob(f"*{SUFFIX}"))
              for member, data in read_pack(pack).items() if Path(member).name in REWRITES}


def test_there_are_published_artefacts_to_check():
    assert any(key.endswith("config.yaml") for key in PUBLISHED)


@pytest.mark.parametrize("key", sorted(PUBLISHED))
def test_no_published_artefact_holds_an_absolute_path(key: str):
    assert not has_absolute_path(PUBLISHED[key])
