"""Evaluations compared item by item: with vs without C (Figure 5), and cell against cell."""

import json
from pathlib import Path

import pytest

from musketeers.reports import aggregate as agg
from musketeers.reports.ablation_claims import _paired_claim
from musketeers.reports.paired import paired_cells, paired_context
from musketeers.reports.verdicts import within_noise


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
    p = paired_context([run])
    # d = [0, 1, 0, 0]: mean 0.25, sample var 0.25, SE sqrt(0.25 / 4) = 0.25
    assert (p.n, p.runs) == (4, 1)
    assert p.a == pytest.approx(50.0) and p.b == pytest.approx(25.0)
    assert p.diff == pytest.approx(25.0) and p.se == pytest.approx(25.0)
    claim = _paired_claim("arithmetic", [run], [])
    assert "**no control run: not evidence**" in claim and "≤ 2 SE = 50.00" in claim
    # the control's C helps nowhere: the with/without verdict stands (here: noise)
    flat = _run(tmp_path, "k", {"a": 1, "b": 0, "c": 0, "d": 0}, {"a": 1, "b": 0, "c": 0, "d": 0})
    claim = _paired_claim("arithmetic", [run], [flat])
    assert "**no evidence either way (for it, within noise)**" in claim


def test_pairing_is_what_makes_a_small_gain_a_finding(tmp_path: Path):
    """The same items, C fixing 20 of 400 and breaking none: independent Bernoulli bounds
    (2 SE ≈ 6.5 points) would call +5 points noise; paired, it clears 2 SE (2.2)."""
    without = {f"i{k}": float(k < 120) for k in range(400)}
    with_c = {k: float(v or int(k[1:]) in range(120, 140)) for k, v in without.items()}
    runs = [_run(tmp_path, "ours", with_c, without)]
    p = paired_context(runs)
    assert p.diff == pytest.approx(5.0) and 2 * p.noise < 2.3
    # a control whose C does nothing: the gain is Ours' own
    flat = [_run(tmp_path, "flat", without, without)]
    assert "**holds here**" in _paired_claim("arithmetic", runs, flat)
    # a control whose C gains as much (on other items): C's presence, not its information
    same = {k: float(v or int(k[1:]) in range(300, 320)) for k, v in without.items()}
    claim = _paired_claim("arithmetic", runs, [_run(tmp_path, "same", same, without)])
    assert "**does not clear its control: within noise of it, not evidence**" in claim
    assert "C's gain +5.00 in Ours vs +5.00 in the control (1 seed)" in claim
    # the same scores with the items shuffled against each other: no pairing, no finding
    shuffled = dict(zip(with_c, sorted(with_c.values()), strict=True))
    assert "within noise" in _paired_claim("arithmetic", [_run(tmp_path, "x", shuffled,
                                                                without)], flat)


def test_no_pairs_no_verdict(tmp_path: Path):
    d = tmp_path / "only-with-c"
    d.mkdir()
    (d / "eval_samples.jsonl").write_text(json.dumps({"id": "a", "score": 1}) + "\n")
    run = agg.Run("x", d, {}, "done")
    assert paired_context([run]) is None
    assert "cannot be checked" in _paired_claim("arithmetic", [run], [])


def _cell_run(root: Path, name: str, seed: int, scores: dict[str, float]) -> agg.Run:
    d = root / name
    d.mkdir(parents=True)
    (d / "eval_samples.jsonl").write_text("".join(json.dumps({"id": i, "score": s}) + "\n"
                                                  for i, s in scores.items()))
    exact = sum(s >= 1 for s in scores.values()) / len(scores)
    return agg.Run(name, d, {"seed": seed}, "done", eval={"exact": exact, "n": len(scores)})


def test_cells_pair_run_with_run_on_the_same_seed(tmp_path: Path):
    """Ours ahead by 20 of 400 items on each of 3 seeds, wrong on none Single gets: a
    finding paired (seed SE 0, item SE ~1.1), noise for independent bounds (2 SE ~6.6)."""
    base = {f"i{k}": float(k < 120) for k in range(400)}
    ours, single = [], []
    for s in range(3):
        lift = {k: float(v or int(k[1:]) in range(120 + s, 140 + s)) for k, v in base.items()}
        ours.append(_cell_run(tmp_path, f"ours{s}", s, lift))
        single.append(_cell_run(tmp_path, f"single{s}", s, base))
    a, b = agg.Cell(ours), agg.Cell(single)
    p = paired_cells(a, b)
    assert (p.n, p.runs) == (1200, 3) and p.diff == pytest.approx(5.0)
    assert p.seed_se == pytest.approx(0.0, abs=1e-9) and p.noise == p.se
    noise, why = within_noise(a, b)
    assert not noise and "> 2 SE = 1.26" in why  # SE sqrt(.05 · .95 / 1200)
    # the untrained policy: one run, paired with every seed
    untrained = agg.Cell([_cell_run(tmp_path, "untrained", 0, base)])
    assert paired_cells(a, untrained).n == 1200
    # seeds that disagree: the spread of their differences is the noise
    ours[1] = _cell_run(tmp_path, "ours1b", 1, {k: float(not v) for k, v in base.items()})
    p = paired_cells(agg.Cell(ours), b)
    assert p.seed_se > p.se and p.noise == p.seed_se
    assert within_noise(agg.Cell(ours), b)[0]
    # without the graded completions: the independent Bernoulli bounds, as before
    for r in (*ours, *single):
        (r.path / "eval_samples.jsonl").unlink()
    assert paired_cells(a, b) is None
    bound = 2 * (a.item_se**2 + b.item_se**2) ** 0.5
    assert f"2 SE = {bound:.2f}" in within_noise(a, b)[1] and bound > 3


def test_a_one_seed_verdict_says_its_se_leaves_out_the_training_seeds(tmp_path: Path):
    """A cell run on one seed (Table 2's, Figure 6's, the baselines') beats another by 20 of
    400 items: beyond the items' 2 SE, and the clause says that SE has no seed spread in it."""
    base = {f"i{k}": float(k < 120) for k in range(400)}
    lift = {k: float(v or int(k[1:]) in range(120, 140)) for k, v in base.items()}
    a = agg.Cell([_cell_run(tmp_path, "ours", 0, lift)])
    b = agg.Cell([_cell_run(tmp_path, "base", 0, base)])
    noise, why = within_noise(a, b)
    assert not noise and why.startswith("Δ 5.00 points > 2 SE = 2.18 (400 item pairs, "
                                        "one seed")
    assert "one seed: the items' noise only" in why
    # on two seeds the clause names the seeds' SE instead
    two_a = agg.Cell([*a.runs, _cell_run(tmp_path, "ours1", 1, lift)])
    two_b = agg.Cell([*b.runs, _cell_run(tmp_path, "base1", 1, base)])
    assert "800 item pairs over 2 seeds; seed SE 0.00" in within_noise(two_a, two_b)[1]
