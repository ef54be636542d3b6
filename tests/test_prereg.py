"""A grid's pre-registration: its confirmatory family is tested, Holm-adjusted, on its own
seeds; a seed, arm or comparison added after a look is exploratory and gets no family p."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from musketeers.cache.errors import UserError
from musketeers.design.gridspec import load_grid
from musketeers.design.prereg import read_prereg
from musketeers.reports.aggregate import load_runs
from musketeers.reports.verdict_table import verdict_markdown, verdict_rows
from tests.test_sensitivity import _run

FAMILY = ["oracle > Single", "oracle > its shuffled experts"]
ARMS = ["perceiver/oracle", "shuffled_experts/oracle", "single"]


def _prereg(**over):
    return read_prereg({"fixed": "2026-11-28", "primary": "exact", "seeds": [0, 1, 2],
                        "arms": ARMS, "confirmatory": FAMILY, **over}, Path("g.yaml"))


def _grid(root: Path, seeds: range) -> None:
    base = dict(task="arithmetic:easier@direct", pooling="last", latents=8)
    for s in seeds:
        _run(root, f"single{s}", 0.55 + s / 100, method="single", seed=s, **base)
        _run(root, f"oracle{s}", 0.80 - s / 200, method="perceiver", team="oracle", seed=s,
             **base)
        _run(root, f"ctl{s}", 0.56, method="shuffled_experts", team="oracle", seed=s, **base)


def test_seeds_added_after_a_look_are_exploratory_and_get_no_family_p(tmp_path: Path):
    _grid(tmp_path, range(5))
    rows = verdict_rows(load_runs(tmp_path), ["arithmetic"], prereg=_prereg())
    confirmatory = [r for r in rows if not r.exploratory]
    later = [r for r in rows if r.exploratory]
    assert [r.test.seeds for r in confirmatory] == [3, 3]  # the registered seeds only
    assert all(r.p_adjusted is not None for r in confirmatory)
    assert [r.test.seeds for r in later] == [5, 5]
    assert all(r.p_adjusted is None and "seeds 3, 4 added after a look" in r.verdict
               and "Holm" not in r.verdict and "not family-wise" in r.verdict for r in later)
    table = "\n".join(verdict_markdown(rows, _prereg()))
    assert "confirmatory family fixed before any run (2026-11-28)" in table
    assert "Seeds to detect" not in table  # a significant row, exploratory or not, needs none


def test_a_comparison_outside_the_family_does_not_enter_holm(tmp_path: Path):
    _grid(tmp_path, range(3))
    rows = verdict_rows(load_runs(tmp_path), ["arithmetic"],
                        prereg=_prereg(confirmatory=FAMILY[:1]))
    by = {r.comparison.name: r for r in rows}
    assert by["oracle > its shuffled experts"].exploratory == "not in the confirmatory family"
    # a family of one: Holm leaves its p as it is
    assert by["oracle > Single"].p_adjusted == pytest.approx(by["oracle > Single"].test.p)
    # without the registration both rows form the family: the smaller p is doubled
    plain = {r.comparison.name: r for r in verdict_rows(load_runs(tmp_path), ["arithmetic"])}
    smallest = min(plain.values(), key=lambda r: r.test.p)
    assert smallest.p_adjusted == pytest.approx(2 * smallest.test.p)
    assert "fixed no confirmatory family" in "\n".join(verdict_markdown(list(plain.values())))


@pytest.mark.parametrize("over, words", [
    ({"confirmatory": ["oracle beats all"]}, "preregistered.confirmatory"),
    ({"arms": ["single"]}, "needs 'perceiver/oracle'"),
    ({"seeds": []}, "preregistered.seeds"),
    ({"primary": "reward"}, "preregistered.primary"),
    ({"look": 1}, "preregistered.look"),
])
def test_a_registration_that_cannot_be_held_to_is_refused_by_its_key(over, words):
    with pytest.raises(UserError, match=words.replace(".", r"\.")):
        _prereg(**over)


def test_the_grid_yaml_carries_its_registration(tmp_path: Path):
    grid = tmp_path / "g.yaml"
    grid.write_text(yaml.safe_dump({
        "budget": "smoke", "seeds": [0, 1],
        "runs": [{"task": "arithmetic", "method": ["single", "perceiver"], "team": "oracle"}],
        "preregistered": {"seeds": [0, 1], "arms": ARMS, "confirmatory": FAMILY[:1]}}))
    pre = load_grid(grid).prereg
    assert pre is not None and pre.seeds == (0, 1) and pre.confirmatory == tuple(FAMILY[:1])
    assert load_grid("smoke").prereg is None


def test_a_grid_without_a_registration_marks_its_parts_extra_seeds(tmp_path: Path):
    from musketeers.design.prereg import implicit

    _grid(tmp_path, range(5))
    pre = implicit([0, 1, 2])
    rows = verdict_rows(load_runs(tmp_path), ["arithmetic"], prereg=pre)
    later = [r for r in rows if r.exploratory]
    assert len(later) == 2 and all("seeds 3, 4 beyond the grid's main seeds" in r.verdict
                                   and r.p_adjusted is None for r in later)
    assert "read these p-values as exploratory too" in "\n".join(verdict_markdown(rows, pre))
