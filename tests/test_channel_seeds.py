"""Channel-bench runs judged over training seeds (musketeers.bench.channel_seeds): runs paired
by seed, not by the order they are listed in, a t over the seeds, and refusals that name the
fix."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from musketeers.bench.channel_seeds import check_arm, load_run, main, paired_by_seed


def saved(tmp_path: Path, name: str, nll_own: float, read: float, seed: int | None = None,
          **config) -> str:
    """A one-channel --save file with the fields the seeds' comparison reads."""
    run = {"channel": "answer", "train_items": 512, "steps": 1000, "threads": 2,
           "val_nll_own": nll_own, "val_nll_own_minus_shuffled": {"diff": read},
           "val_nll_own_minus_none": {"diff": read - 1.0}, "exact_own": 2.0,
           **({} if seed is None else {"seed": seed}), **config}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps([run]))
    return str(path)


def test_two_arms_are_paired_by_seed_whatever_order_they_are_listed_in(tmp_path: Path):
    a = {s: v for s, v in zip((1, 2, 3), (7.0, 6.0, 8.0), strict=True)}
    b = {s: v for s, v in zip((1, 2, 3), (6.0, 5.5, 6.0), strict=True)}
    arm_a = [load_run(saved(tmp_path, f"a{s}", a[s], -1.0, s)) for s in (1, 2, 3)]
    arm_b = [load_run(saved(tmp_path, f"b{s}", b[s], -2.0, s, train_items=2048))
             for s in (3, 1, 2)]  # listed out of order
    test = paired_by_seed(arm_a, arm_b)["own C's gold NLL"]
    d = np.array([b[s] - a[s] for s in (1, 2, 3)])  # −1, −0.5, −2
    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
    assert test.diff == pytest.approx(d.mean())
    assert test.df == pytest.approx(2)  # k − 1: the seed is the unit
    assert (test.low, test.high) == (pytest.approx(d.mean() - half),
                                     pytest.approx(d.mean() + half))
    assert test.mde is not None and test.mde > 0
    with pytest.raises(ValueError, match="different seeds"):
        paired_by_seed(arm_a, arm_b[:2])


def test_a_run_must_name_its_seed_once_and_an_arm_holds_one_configuration(tmp_path: Path):
    old = saved(tmp_path, "old", 6.0, -1.0)  # saved before runs recorded their seed
    with pytest.raises(ValueError, match="@SEED"):
        load_run(old)
    assert load_run(f"{old}@4")["seed"] == 4
    with pytest.raises(ValueError, match="says seed 1"):
        load_run(saved(tmp_path, "s1", 6.0, -1.0, 1) + "@2")
    runs = [load_run(saved(tmp_path, "x0", 6.0, -1.0, 0)),
            load_run(saved(tmp_path, "x1", 6.0, -1.0, 1, threads=1))]
    check_arm("x", runs)  # the thread count is noise a seed family averages over
    other = load_run(saved(tmp_path, "y", 6.0, -1.0, 2, train_items=2048))
    with pytest.raises(ValueError, match="differ in train_items"):
        check_arm("x", [*runs, other])
    with pytest.raises(ValueError, match="seed listed twice"):
        check_arm("x", [runs[0], runs[0]])


def test_the_command_prints_the_read_over_seeds_and_refuses_bad_input(tmp_path: Path, capsys):
    files = [saved(tmp_path, f"r{s}", 6.0, read, s) for s, read in ((0, -4.0), (1, -3.0))]
    out = main(["--arm", "300", *files, "--save", str(tmp_path / "seeds.json")])
    said = capsys.readouterr().out
    assert "The read over 2 seed(s), own − another's C: -3.50" in said and "df 1" in said
    assert json.loads((tmp_path / "seeds.json").read_text()) == out
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    for args, fix in ((["--arm", "a", str(bad)], "must hold one channel's results"),
                      (["--arm", "a"], "lists no file"),
                      (["--arm", "a", files[0], "--arm", "b", files[1]], "different seeds")):
        with pytest.raises(SystemExit) as exc:
            main([*args, "--save", str(tmp_path / "not-written.json")])
        assert exc.value.code == 2 and fix in capsys.readouterr().err
    assert not (tmp_path / "not-written.json").exists()
