"""Claims as data: each declares the cells it reads by key, its control and its test; the
report states exactly the registry's claims, in its order, and no claim finds a cell by a
table's display label."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from musketeers.method import methods
from musketeers.reports import claim_registry, tables
from musketeers.reports.aggregate import load_runs
from musketeers.reports.claim_registry import CLAIMS, Claim, paper_claims

KEY = dict(task="arithmetic", method="perceiver", team="default", pooling="last", latents=8)


def write_run(root: Path, name: str, acc: float, seed: int, **cfg) -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({"budget": "t", "steps": 1, "seed": seed,
                                                   **cfg}))
    (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.1}) + "\n")
    (d / "summary.json").write_text(json.dumps({"steps": 1}))
    (d / "eval.json").write_text(json.dumps({"exact": acc, "score": acc, "n": 10,
                                             "split": "val"}))


def test_every_claim_reads_registered_methods_and_is_stated_against_a_control():
    assert len({c.name for c in CLAIMS}) == len(CLAIMS)
    for claim in CLAIMS:
        assert claim.reads and claim.says, claim.name
        for key in claim.reads:
            assert key["method"] in methods.REGISTRY, (claim.name, key)
        if claim.control is not None:
            assert methods.get(claim.control).control_of is not None, claim.name


def test_the_report_states_the_registrys_claims_in_its_order(monkeypatch):
    fake = (Claim("b", "second", ({"method": "single"},), None, lambda s: ["- b"]),
            Claim("a", "first", ({"method": "single"},), None, lambda s: ["- a1", "- a2"]))
    monkeypatch.setattr(claim_registry, "CLAIMS", fake)
    assert paper_claims([], 8) == ["- b", "- a1", "- a2"]


def test_the_pooling_claim_finds_its_cells_by_key_not_by_label(tmp_path: Path, monkeypatch):
    write_run(tmp_path, "first", 0.6, 0, **dict(KEY, pooling="first_token"))
    write_run(tmp_path, "last", 0.5, 0, **KEY)
    runs = load_runs(tmp_path)

    def claim() -> str:
        return next(c for c in paper_claims(runs, 8) if "first-token pooling" in c)

    before = claim()
    assert "60.00 vs 50.00 (seed 0)" in before
    relabelled = tuple((f"renamed {label}", pooling, paper)
                       for label, pooling, paper in tables.TABLE2)
    monkeypatch.setattr(tables, "TABLE2", relabelled)
    assert claim() == before
