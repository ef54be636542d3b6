"""Figure 5's paired form: greedy exact with C against without C, item by item."""

import json
from pathlib import Path

import pytest

from musketeers.reports import aggregate as agg
from musketeers.reports.claims import _paired_claim
from musketeers.reports.paired import paired_exact


def _run(root: Path, name: str, with_c: dict[str, float], without_c: dict[str, float]):
    d = root / name
    d.mkdir(parents=True)
    for fname, scores in (("eval_samples.jsonl", with_c),
                          ("eval_no_context_samples.jsonl", without_c)):
        (d / fname).write_text("".join(json.dumps({"id": i, "score": s}) + "\n"
                                       for i, s in scores.items()))
    return agg.Run(name, d, {}, "done")


def test_paired_difference_and_its_standard_error(tmp_path: Path):
    # item b is right only with C; c's partial credit is not exact; e is graded one way only
    run = _run(tmp_path, "r", {"a": 1, "b": 1, "c": 0.5, "d": 0, "e": 1},
               {"a": 1, "b": 0, "c": 0.0, "d": 0})
    p = paired_exact([run])
    # d = [0, 1, 0, 0]: mean 0.25, sample var 0.25, SE sqrt(0.25 / 4) = 0.25
    assert (p.n, p.runs) == (4, 1)
    assert p.with_c == pytest.approx(50.0) and p.without_c == pytest.approx(25.0)
    assert p.diff == pytest.approx(25.0) and p.se == pytest.approx(25.0)
    claim = _paired_claim("arithmetic", [run])
    assert "**holds here, but within noise**" in claim and "within 2 SE (50.00)" in claim


def test_pairing_is_what_makes_a_small_gain_a_finding(tmp_path: Path):
    """The same items, C fixing 20 of 400 and breaking none: independent Bernoulli bounds
    (2 SE ≈ 6.5 points) would call +5 points noise; paired, it clears 2 SE (2.2)."""
    without = {f"i{k}": float(k < 120) for k in range(400)}
    with_c = {k: float(v or int(k[1:]) in range(120, 140)) for k, v in without.items()}
    runs = [_run(tmp_path, "ours", with_c, without)]
    p = paired_exact(runs)
    assert p.diff == pytest.approx(5.0) and 2 * p.se < 2.3
    assert "**holds here**" in _paired_claim("arithmetic", runs)
    # the same scores with the items shuffled against each other: no pairing, no finding
    shuffled = dict(zip(with_c, sorted(with_c.values()), strict=True))
    assert "within noise" in _paired_claim("arithmetic", [_run(tmp_path, "x", shuffled,
                                                                without)])


def test_no_pairs_no_verdict(tmp_path: Path):
    d = tmp_path / "only-with-c"
    d.mkdir()
    (d / "eval_samples.jsonl").write_text(json.dumps({"id": "a", "score": 1}) + "\n")
    run = agg.Run("x", d, {}, "done")
    assert paired_exact([run]) is None
    assert "cannot be checked" in _paired_claim("arithmetic", [run])
