"""warmup_permute_share: the supervised warm-up asks a seeded share of its rows another row's
question (musketeers.method.asked), the same rows for every arm of a seed; GRPO and the
evaluation keep the real task; a run's name and report say so; bad values are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from musketeers.cache.errors import UserError
from musketeers.checks.planted import planted_config
from musketeers.design.comparisons import comparison_names
from musketeers.design.gridspec import run_name
from musketeers.method import methods, warmup
from musketeers.reports.report import _supervised_warmup
from musketeers.run.build import build_components

pytestmark = pytest.mark.usefixtures("one_thread")
_GOLD_NLL = warmup.gold_nll


def _seen(monkeypatch, cfg) -> tuple[list[list[tuple[str, str]]], list[str], list[str]]:
    """Warm ``cfg``'s run up; per step, (answer, question) of each row its loss read, and the
    split's questions before and after."""
    seen: list[list[tuple[str, str]]] = []

    def spy(policy, adapter, data, rows, device):
        items, _, _ = data.batch(rows)
        seen.append([(it.answer or "", it.question) for it in items])
        return _GOLD_NLL(policy, adapter, data, rows, device)

    monkeypatch.setattr(warmup, "gold_nll", spy)
    method = methods.get(cfg.method)
    data, policy, adapter = build_components(cfg, "train", method=method)
    before = [it.question for it in data.items]
    assert warmup.warms_up(cfg, adapter, method)
    warmup.warm_up_adapter(cfg, policy, adapter, data)
    return seen, before, [it.question for it in data.items]


def test_the_warm_up_asks_a_fresh_share_of_rows_another_question_and_leaves_the_split_real(
        planted_store, monkeypatch, tmp_path: Path):
    share = dict(adapter_warmup=3, adapter_warmup_batch=16, warmup_policy_lr=1e-3)
    cfg = planted_config("perceiver", 0, 1, planted_store, tmp_path / "a",
                         warmup_permute_share=0.5, **share)
    seen, before, after = _seen(monkeypatch, cfg)
    assert after == before  # the split GRPO and the evaluation read is the real task
    data, _, _ = build_components(cfg, "train", method=methods.get(cfg.method))
    assert len(seen) == 3 and all(len(s) == 16 for s in seen)
    # each step asks its rows by that step's σ: a share of the rows moved among themselves
    steps = [warmup.asked_at(cfg, data, step).items for step in range(3)]
    for items in steps:
        moved = sum(a.question != b.question for a, b in zip(items, data.items, strict=True))
        assert moved == round(0.5 * len(data))
        assert [a.answer for a in items] == [b.answer for b in data.items]
    for step, pairs in enumerate(seen):
        assert set(pairs) <= {(it.answer or "", it.question) for it in steps[step]}
    # drawn afresh each step: no row keeps one wrong question the LoRA could learn by heart
    assert [it.question for it in steps[0]] != [it.question for it in steps[1]]
    own = {(it.answer or "", it.question) for it in data.items}
    assert any(not set(pairs) <= own for pairs in seen)

    # Single on the same seed warms up on the same rows asked the same questions: the arms
    # differ only in C
    single = planted_config("single", 0, 1, planted_store, tmp_path / "b",
                            warmup_permute_share=0.5, **share)
    assert _seen(monkeypatch, single)[0] == seen
    # without the share the rows keep their own questions
    plain = planted_config("perceiver", 0, 1, planted_store, tmp_path / "c", **share)
    assert all(set(pairs) <= own for pairs in _seen(monkeypatch, plain)[0])


@pytest.mark.parametrize(("overrides", "said"), [
    (dict(warmup_permute_share=1.5, adapter_warmup=2), "in [0, 1], not 1.5"),
    (dict(warmup_permute_share=float("nan"), adapter_warmup=2), "in [0, 1], not nan"),
    (dict(warmup_permute_share=-0.1, adapter_warmup=2), "in [0, 1], not -0.1"),
])
def test_a_bad_share_is_refused_in_one_line(planted_store, tmp_path: Path, overrides, said):
    with pytest.raises(UserError, match="warmup_permute_share") as exc:
        planted_config("perceiver", 0, 1, planted_store, tmp_path / "r", **overrides)
    assert said in str(exc.value) and "\n" not in str(exc.value)


def test_the_untrained_baseline_ignores_the_share(planted_store, tmp_path: Path):
    cfg = planted_config("untrained", 0, 1, planted_store, tmp_path / "r",
                         warmup_permute_share=0.5)
    assert "warmup_permute_share" in methods.ignored(cfg.method)


def test_a_run_name_and_the_report_say_the_share():
    fields = dict(task="arithmetic", method="single", seed=1)
    assert run_name("pocket", fields) == "pocket-arithmetic-single-s1"
    assert run_name("pocket", {**fields, "warmup_permute_share": 0.0}) == \
        "pocket-arithmetic-single-s1"
    assert run_name("pocket", {**fields, "warmup_permute_share": 0.5}) == \
        "pocket-arithmetic-single-ask50-s1"
    assert run_name("pocket", {**fields, "method": "untrained", "warmup_permute_share": 0.5}) \
        == "pocket-arithmetic-untrained-s1"  # it has no warm-up to ask
    near = {run_name("pocket", {**fields, "warmup_permute_share": p}) for p in (0.5, 0.504, 0.29)}
    assert near == {"pocket-arithmetic-single-ask50-s1", "pocket-arithmetic-single-ask50.4-s1",
                    "pocket-arithmetic-single-ask29-s1"}  # close shares keep their own folders
    cfg = dict(method="single", adapter_warmup=80, adapter_warmup_batch=8,
               adapter_warmup_lr=1e-3, warmup_policy_lr=1e-4)
    assert "asked" not in _supervised_warmup([cfg])[0]
    assert "50% of its rows asked" in _supervised_warmup([{**cfg, "warmup_permute_share": 0.5}])[0]


def test_a_share_is_spelt_alike_in_names_labels_claims_and_the_warm_up_line():
    # 0.504 once printed as "50%" in claims and the warm-up line but "50.4" in names and labels
    from musketeers.design.comparisons import taught_comparisons
    from musketeers.reports.trained_headroom import _label_part
    share = 0.504
    assert run_name("pocket", {"task": "t", "method": "single", "seed": 0,
                               "warmup_permute_share": share}).endswith("-ask50.4-s0")
    assert _label_part("warmup_permute_share", share) == "50.4% asked"
    assert all("(answer, 50.4% asked)" in c.name or "Single (50.4% asked)" in c.name
               for c in taught_comparisons("answer", share))
    cfg = dict(method="single", adapter_warmup=80, adapter_warmup_batch=8,
               adapter_warmup_lr=1e-3, warmup_policy_lr=1e-4, warmup_permute_share=share)
    assert "; 50.4% of its rows asked" in _supervised_warmup([cfg])[0]


def test_a_report_cell_never_mixes_warm_up_shares():
    from musketeers.reports import aggregate as agg

    base = {"task": "arithmetic", "method": "single", "seed": 0}
    old = agg.Run("old", Path("old"), dict(base), "done", eval={"exact": 0.2})  # before the field
    plain = agg.Run("plain", Path("p"), {**base, "seed": 1, "warmup_permute_share": 0.0},
                    "done", eval={"exact": 0.3})
    asked = agg.Run("asked", Path("a"), {**base, "warmup_permute_share": 0.5}, "done",
                    eval={"exact": 0.9})
    untrained = agg.Run("u", Path("u"), {**base, "method": "untrained",
                                         "warmup_permute_share": 0.5}, "done", eval={"exact": 0.0})
    runs = [old, plain, asked, untrained]
    assert agg.cell(runs, method="single").runs == [old, plain]  # unnamed: no permuted rows
    assert agg.cell(runs, method="single", warmup_permute_share=0.5).runs == [asked]
    assert agg.cell(runs, method="untrained").runs == [untrained]  # it has no warm-up
    assert asked.key["warmup_permute_share"] == 0.5 and old.key["warmup_permute_share"] == 0.0


def test_the_taught_claims_compare_cells_of_the_named_shares():
    from musketeers.design.comparisons import COMPARISONS
    from musketeers.reports import aggregate as agg

    def run(name: str, share: float, **key) -> agg.Run:
        config = {"task": "arithmetic:easier@direct", "seed": 0, "latents": 8,
                  "warmup_permute_share": share, "channel": "answer", **key}
        return agg.Run(name, Path(name), config, "done", eval={"exact": 0.5})

    runs = [run("oracle-asked", 0.5, method="perceiver", team="oracle"),
            run("oracle", 0.0, method="perceiver", team="oracle"),
            run("single-asked", 0.5, method="single"), run("single", 0.0, method="single")]
    by_name = {c.name: c for c in COMPARISONS}

    def cells(name: str) -> tuple[list[str], list[str]]:
        c = by_name[name]
        return tuple([r.name for r in agg.cell(runs, task="arithmetic", latents=8,
                                               **{**c.defaults, **side}).runs]
                     for side in (c.tested, c.control))

    assert cells("oracle (answer, 50% asked) > Single (50% asked)") == (
        ["oracle-asked"], ["single-asked"])
    assert cells("oracle (answer, 50% asked) > oracle (answer)") == (["oracle-asked"], ["oracle"])
    assert cells("Single (50% asked) > Single") == (["single-asked"], ["single"])
    # the plain channel claims keep to the plain warm-up
    assert cells("oracle (answer) > Single") == (["oracle"], ["single"])


def test_every_claim_has_a_name_of_its_own():
    """A claim declared once per channel that does not name its channel would sit twice in a
    verdict table (and twice in Holm's family): what a share costs Single is one claim."""
    names = comparison_names()
    assert len(names) == len(set(names)), [n for n in names if names.count(n) > 1]
    assert names.count("Single (50% asked) > Single") == 1
