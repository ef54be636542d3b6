"""The report's "Is C read?" section: each item's gold NLL with and without C, paired by item,
per cell, with intervals over items and over seeds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.stats as sps
from test_reports import KEY, write_run

from musketeers.reports import aggregate as agg
from musketeers.reports.c_read import c_read_markdown, nll_matrices

ORACLE = {**KEY, "team": "oracle"}


def kept(run: Path, with_c: list[float], without: list[float | None]) -> None:
    """Both evaluations' completions, item ``q<i>`` with its gold NLL (None: not kept)."""
    for name, nll in (("eval_samples.jsonl", with_c), ("eval_no_context_samples.jsonl", without)):
        rows = [{"id": f"q{i}", "score": 0.0, **({} if v is None else {"gold_nll": v})}
                for i, v in enumerate(nll)]
        (run / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_difference_is_paired_by_item_over_the_items_every_seed_graded(tmp_path: Path):
    a = write_run(tmp_path, "a0", 0.5, seed=0, **ORACLE)
    b = write_run(tmp_path, "a1", 0.5, seed=1, **ORACLE)
    kept(a, [1.0, 2.0, 3.0, 9.0], [4.0, 4.0, 5.0, 9.0])
    kept(b, [2.0, 2.0, 4.0], [3.0, 5.0, 5.0])  # q3 not graded in seed 1: left out
    with_c, without = nll_matrices(agg.load_runs(tmp_path))
    assert with_c.tolist() == [[1, 2, 3], [2, 2, 4]] and without.tolist() == [[4, 4, 5], [3, 5, 5]]
    lines = c_read_markdown(agg.load_runs(tmp_path))
    assert lines[0].startswith("## Is C read?")
    row = next(x for x in lines if x.startswith("| Ours"))
    d = (with_c - without).mean(axis=0)  # per item over seeds: -2, -2.5, -1.5
    half = sps.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
    assert row.startswith(f"| Ours | 2 | 3 | {with_c.mean():.2f} | {without.mean():.2f} | -2.00 |")
    assert f"{-2 - half:+.2f} to {-2 + half:+.2f}" in row
    assert "df" in row.split("|")[-2]  # two seeds: a test over seeds too
    assert d.mean() == pytest.approx(-2.0)


def test_runs_without_the_kept_nll_have_no_row(tmp_path: Path):
    old = write_run(tmp_path, "a0", 0.5, seed=0, **ORACLE)
    kept(old, [1.0, 2.0], [None, None])  # evaluated without C before the NLL was kept
    assert c_read_markdown(agg.load_runs(tmp_path)) == []
    one = write_run(tmp_path, "s0", 0.5, seed=0, **{**KEY, "method": "single"})
    kept(one, [1.0, 2.0, 3.5], [1.5, 2.5, 3.0])
    lines = c_read_markdown(agg.load_runs(tmp_path))
    rows = [x for x in lines if x.startswith("| ") and not x.startswith("| Method")]
    assert len(rows) == 1 and rows[0].startswith("| Single | 1 | 3 |")
    assert rows[0].endswith("| one seed |")


def test_two_warm_up_shares_are_two_rows_never_two_seeds_of_one(tmp_path: Path):
    plain = write_run(tmp_path, "p0", 0.5, seed=0, **ORACLE)
    taught = write_run(tmp_path, "t0", 0.5, seed=0, **ORACLE, warmup_permute_share=0.5)
    kept(plain, [1.0, 2.0, 3.0], [2.0, 3.0, 4.0])
    kept(taught, [5.0, 5.0, 5.0], [4.0, 4.0, 4.0])
    rows = [x for x in c_read_markdown(agg.load_runs(tmp_path))
            if x.startswith("| Ours")]
    assert sorted(r.split(" | ")[0:3] for r in rows) == [["| Ours, 0% asked", "1", "3"],
                                                         ["| Ours, 50% asked", "1", "3"]]
    assert {r.split(" | ")[5] for r in rows} == {"-1.00", "+1.00"}  # not one averaged row
