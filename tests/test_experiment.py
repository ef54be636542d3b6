"""One experiment design (musketeers/design/experiment.py); the packaged grids are overlays
on it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from musketeers.budgets import BUDGETS
from musketeers.cache.errors import UserError
from musketeers.config import resolve_config
from musketeers.design import experiment
from musketeers.design.gridspec import BUDGETS as GRID_BUDGETS
from musketeers.design.gridspec import grid_file, load_grid
from musketeers.grid.pack import opened
from musketeers.grid.status import stale_fields
from musketeers.reports.report import report_dir

REPO = Path(__file__).resolve().parents[1]
SIZES = {k for sizes in BUDGETS.values() for k in sizes}


@pytest.mark.parametrize("budget", GRID_BUDGETS)
def test_packaged_grids_overlay_the_design_and_leave_sizes_to_the_budget(budget: str):
    raw = yaml.safe_load(grid_file(budget).read_text())
    assert "runs" not in raw and set(raw["parts"]) <= set(experiment.PARTS)
    # a budget means the same to `train` and `ablate`: no grid restates a run's size
    assert raw["defaults"]["budget"] == raw["budget"] == budget
    assert not SIZES & {k for k in raw["defaults"] if k not in ("dtype",)}, budget
    grid = load_grid(budget)
    # every run of Table 2 and Figure 6 comes from the design's values
    poolings = {r.fields.get("pooling") for r in grid.runs}
    assert poolings <= {*experiment.POOLINGS, experiment.DEFAULT_POOLING}
    latents = {r.fields.get("latents") for r in grid.runs}
    assert latents <= {*experiment.LATENTS, experiment.DEFAULT_LATENTS}


def write_overlay(tmp_path: Path, parts: dict, tasks=("arithmetic", "logic")) -> Path:
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({
        "budget": "smoke", "seeds": [3, 4], "defaults": {"budget": "smoke", "latents": 8,
                                                        "pooling": "last"},
        "tasks": {"arithmetic": "arithmetic:easy@direct"} if tasks is None else list(tasks),
        "parts": parts}))
    return path


def test_an_overlay_selects_parts_values_seeds_and_stages(tmp_path: Path):
    grid = load_grid(write_overlay(tmp_path, {
        "table1": {"only": {"team": ["naive"]}},
        "figure6": {"seeds": "first", "stage": 2, "only": {"latents": [4, 32]}},
        "figure5": {"set": {"no_context_every": 5}},
        "untrained": {}}))
    names = [r.name for r in grid.runs]
    assert names[:2] == ["smoke-arithmetic-untrained-s3", "smoke-logic-untrained-s3"]
    assert "smoke-arithmetic-perceiver-naive-last-m8-s4" in names
    assert not any(team in n for n in names for team in ("generalist", "-llm-"))
    # Figure 6 is Arithmetic's only, on the first seed, after everything else
    assert names[-2:] == ["smoke-arithmetic-perceiver-default-last-m4-s3",
                          "smoke-arithmetic-perceiver-default-last-m32-s3"]
    # Figure 5's runs are Ours' default team on its own tasks, with the overlay's setting,
    # and its shuffled-experts control, evaluated without C too but trained as the controls
    # part trains it (the overlay's setting is not applied to it)
    fig5 = {r.name: r for r in grid.runs if r.eval_no_context}
    ours = {f"smoke-{t}-perceiver-default-last-m8-s{s}" for t in ("logic", "arithmetic")
            for s in (3, 4)}
    assert set(fig5) == ours | {n.replace("perceiver", "shuffled_experts") for n in ours}
    assert all((fig5[n].fields.get("no_context_every") == 5) == (n in ours) for n in fig5)
    assert not any("hard_routing" in n or "shuffled_reward" in n for n in names)


def test_an_overlay_maps_families_to_variants_and_drops_the_rest(tmp_path: Path):
    grid = load_grid(write_overlay(tmp_path, {"table1": {}, "figure5": {}}, tasks=None))
    assert {r.fields["task"] for r in grid.runs} == {"arithmetic:easy@direct"}
    assert any(r.eval_no_context for r in grid.runs)  # logic is not run, arithmetic is


def test_a_named_grid_keeps_its_report_and_ledger_apart_from_its_budgets(tmp_path: Path):
    path = write_overlay(tmp_path, {"table1": {}})
    plain = load_grid(path)
    assert plain.name == "smoke" and report_dir(tmp_path, plain) == tmp_path / "smoke"
    raw = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**raw, "name": "smoke-kept"}))
    kept = load_grid(path)
    # the same runs, published and timed under the grid's own name
    assert [r.name for r in kept.runs] == [r.name for r in plain.runs]
    assert report_dir(tmp_path, kept) == tmp_path / "smoke-kept"


@pytest.mark.parametrize("parts, match", [
    ({"table3": {}}, "unknown parts"),
    ({"table1": {"sed": "first"}}, "a part takes seeds, stage, tasks, only and set"),
])
def test_a_bad_overlay_is_one_line_naming_the_fix(tmp_path: Path, parts, match):
    with pytest.raises(UserError, match=match):
        load_grid(write_overlay(tmp_path, parts))


def _published_grids() -> list[tuple[str, Path]]:
    """(grid source, its published runs folder): the pocket grid as it stands and every kept
    result beside it (a ``reports/<name>/grid.yaml``)."""
    kept = [(str(y), y.parent / "runs") for y in sorted((REPO / "reports").glob("*/grid.yaml"))]
    return [("pocket", REPO / "reports" / "pocket" / "runs"), *kept]


@pytest.mark.parametrize("source,folder", _published_grids(),
                         ids=lambda v: Path(str(v)).parent.name if "/" in str(v) else str(v))
def test_published_runs_are_runs_of_their_grid_as_it_stands(source, folder):
    """What a published runs folder holds was trained under its grid's current settings: a
    change to the design or a grid YAML that would make a published run stale fails here,
    before a later invocation sets it aside and trains it again (or a kept result stops being
    rebuildable)."""
    grid = load_grid(source)
    assert report_dir(REPO / "reports", grid) / "runs" == Path(folder)
    runs = {r.name: r for r in grid.runs}
    with opened(folder) as view:  # the folder's pack, runs.tar.xz, unpacked
        published = sorted(view.glob("pocket-*/config.yaml"))
        if not published:
            pytest.skip(f"no run published under {folder} yet")
        for path in published:
            name = path.parent.name
            assert name in runs, f"{name} is published but not a run of the grid {source}"
            cfg = resolve_config(overrides={**runs[name].fields, "run_dir": str(path.parent)})
            assert stale_fields(path.parent, cfg) == {}, name


def test_a_part_may_run_more_seeds_than_the_grid_and_the_command_line_selects(tmp_path: Path):
    path = write_overlay(tmp_path, {"table1": {"only": {"method": ["single"]},
                                               "seeds": [3, 4, 5, 6]},
                                    "untrained": {}})
    seeds = sorted(r.fields["seed"] for r in load_grid(path).runs
                   if r.name.startswith("smoke-arithmetic-single"))
    assert seeds == [3, 4, 5, 6]  # the part's own list, not the grid's [3, 4]
    assert [r.name for r in load_grid(path).runs if "arithmetic-untrained" in r.name] == [
        "smoke-arithmetic-untrained-s3"]
    picked = load_grid(path, seeds=[5, 9]).runs
    assert sorted(r.name for r in picked if "arithmetic" in r.name) == [
        "smoke-arithmetic-single-s5", "smoke-arithmetic-untrained-s5"]


@pytest.mark.parametrize("seeds", ["some", [], [1, "2"], [0, True]])
def test_a_parts_bad_seeds_are_refused_with_the_key(tmp_path: Path, seeds):
    with pytest.raises(UserError, match="part table1: seeds must be"):
        load_grid(write_overlay(tmp_path, {"table1": {"seeds": seeds}}))
