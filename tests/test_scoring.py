"""Rewards survive hostile completions: never raise, stay in [0, 1], grade what they can."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from musketeers.cache.items import Item
from musketeers.tasks import build_items, extract_answer, score, scoring
from musketeers.tasks.reasoning_gym_tasks import prebuild


@pytest.fixture(scope="module")
def items():
    """One item per source: every Reasoning Gym sub-dataset, gsm_symbolic, gsm8k, planted."""
    prebuild([(t, "train", 60) for t in ("arithmetic", "algorithmic", "logic", "gsm_symbolic")])
    by_source: dict[str, Item] = {}
    for t in ("arithmetic", "algorithmic", "logic", "gsm_symbolic", "planted"):
        for it in build_items(t, "train", 60):
            by_source.setdefault(it.source, it)
    by_source["gsm8k"] = Item("g0", "Q?", "", "18", json.dumps({"final": "18"}), "gsm8k")
    return list(by_source.values())


def test_extract_answer_cases():
    assert extract_answer("<think>a</think><answer> 42 </answer>") == "42"
    assert extract_answer("<answer>1</answer> then <answer>2</answer>") == "2"
    assert extract_answer("<answer>a<answer>b</answer>") == "b"  # nested: innermost last pair
    assert extract_answer("<answer>unclosed") is None
    assert extract_answer("</answer><answer>") is None
    assert extract_answer("no tags") is None
    assert extract_answer(None) is None  # type: ignore[arg-type]
    assert extract_answer(b"<answer>1</answer>") is None  # type: ignore[arg-type]


def test_gsm8k_numeric_exact_match():
    it = Item("g", "Q", "", "1234", "{}", "gsm8k")
    for good in ("1234", "1,234", "$1,234", "1234.00", " 1234. "):
        assert score(it, f"<answer>{good}</answer>") == 1.0, good
    for bad in ("1235", "1234 dollars", "about 1234", "12345", "", "1e999999999", "nan", "inf"):
        assert score(it, f"<answer>{bad}</answer>") == 0.0, bad


HOSTILE = [
    "",
    "<answer>",
    "</answer>",
    "<answer><answer><answer>",
    "<answer>" * 200_000 + "7",                       # many unclosed openings, 1.6 MB
    "x" * 1_000_000 + "<answer>18</answer>",          # megabyte of reasoning, short answer
    "<answer>" + "9" * 2_000_000 + "</answer>",       # megabyte answer (above the cap)
    "<answer>\\frac{1}{2} + \\sqrt{x^2}$$\\boxed{3}$$</answer>",
    "<answer>\udcff\ud800 surrogates \udc80</answer>",
    b"\xff\xfe<answer>\xc3\x28</answer>".decode("utf-8", "surrogateescape"),
    "<answer>10**10**10</answer>",
    "<answer>" + "(" * 600 + "</answer>",
    "<answer>None</answer>",
    "<answer>{\"a\": [1, 2}</answer>",
    "<answer>\x00\x01\x02</answer>",
]


@pytest.mark.parametrize("completion", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_completions_never_raise(items, completion, monkeypatch):
    monkeypatch.setattr(scoring, "SCORE_TIMEOUT_S", 3.0)
    for it in items:
        value = score(it, completion)
        assert 0.0 <= value <= 1.0


def test_hostile_text_around_the_gold_still_grades(items):
    for it in items:
        if it.source in ("gsm8k", "planted"):
            junk = "\udcff" * 3 + "<answer>" * 1000 + "x" * 100_000
            assert score(it, f"{junk}<answer>{it.answer}</answer>") == 1.0
    gsm = next(it for it in items if it.source == "gsm8k")
    assert score(gsm, "<answer>" * 200_000 + "18</answer>") == 1.0


def test_overlong_answer_is_zero_without_reaching_the_scorer(items, monkeypatch):
    it = next(i for i in items if i.source == "chain_sum")
    calls = []
    monkeypatch.setattr(scoring, "_rg_score", lambda *a: calls.append(a) or 1.0)
    monkeypatch.setitem(scoring._SCORERS, "chain_sum", scoring._rg_score)
    assert score(it, "<answer>" + "1" * (scoring.MAX_ANSWER_CHARS + 1) + "</answer>") == 0.0
    assert calls == []


def test_hanging_scorer_times_out_and_worker_recovers(items, monkeypatch):
    it = next(i for i in items if i.source == "bitwise_arithmetic")  # evals the answer
    monkeypatch.setattr(scoring, "SCORE_TIMEOUT_S", 1.0)
    assert score(it, "<answer>10**10**10</answer>") == 0.0
    assert score(it, f"<answer>{it.answer}</answer>") == 1.0  # a fresh worker grades again


def test_scorer_exception_is_zero():
    broken = Item("b", "Q", "", "1", "not json", "chain_sum")
    assert score(broken, "<answer>1</answer>") == 0.0


_FRAGMENTS = st.sampled_from([
    "<answer>", "</answer>", "<answer >", "</ answer>", "<think>", "</think>", "\\frac{", "}",
    "$$", "\\boxed{", "**", "^", "(", ")", "\udcff", "\ud800", "\x00", "1,234", "-3.5", "True",
    "x**2 + 1", "[[1, 0], [0, 1]]", " ", "\n",
])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), parts=st.lists(st.one_of(_FRAGMENTS, st.text(max_size=30)), max_size=25))
def test_property_score_in_unit_interval(items, data, parts):
    it = data.draw(st.sampled_from(items))
    completion = "".join(parts)
    value = score(it, completion)
    assert 0.0 <= value <= 1.0
    if extract_answer(completion) is None:
        assert value == 0.0 or it.answer is None  # no tag, no reward (propositional_logic aside)
