"""Every Reasoning Gym scorer that evaluates text, not only the families': found by scanning
the registry, each behind an answer grammar and the sandboxed scorer process."""

from __future__ import annotations

import inspect
import json
import re

import pytest

from musketeers.tasks import answer_grammar, build_items, score
from musketeers.tasks.forgeries import FORGERIES, measure
from musketeers.tasks.reasoning_gym_tasks import entry_to_json, prebuild

_EVALUATES = re.compile(r"\beval\(|\bexec\(|parse_expr|sympify|simplify\(|literal_eval")


def _scorer_source(cls) -> str:
    """``score_answer``'s source with the methods and module functions it calls."""
    src = inspect.getsource(cls.score_answer)
    module = inspect.getmodule(cls)
    extra = [getattr(cls, n, None) for n in re.findall(r"self\.(\w+)\(", src)]
    extra += [getattr(module, n, None) for n in re.findall(r"(?<![.\w])(\w+)\(", src)]
    for f in extra:
        if inspect.isfunction(f) and f.__module__ == module.__name__:
            src += inspect.getsource(f)
    return src


def _scan() -> set[str]:
    from reasoning_gym.factory import DATASETS

    return {name for name, (cls, _) in DATASETS.items()
            if name != "composite" and _EVALUATES.search(_scorer_source(cls))}


ANSWER_EVALUATING = tuple(sorted(answer_grammar.GRAMMARS))


def test_every_evaluating_scorer_of_the_registry_is_declared():
    found = _scan()
    declared = set(answer_grammar.GRAMMARS) | answer_grammar.EVALUATES_ENTRY
    assert found == declared, (found - declared, declared - found)


def _payloads(target) -> list[str]:
    """Answers that run code when evaluated: each would create ``target`` or forge a grade."""
    t = str(target)
    return [
        f"__import__('os').system('touch {t}')",
        f"open('{t}', 'w').write('x')",
        f"[__import__('pathlib').Path('{t}').touch()]",
        f"exec(\"open('{t}', 'w')\")",
        "print(1.0)",
        "[[0]] if print(1.0) else [[1]]",
        "().__class__.__base__.__subclasses__()",
        "24 if __import__('sys') else 0",
    ]


@pytest.fixture(scope="module")
def items():
    """Four validation items of every answer-evaluating dataset, each as ``rg:NAME``."""
    prebuild([(f"rg:{n}", "val", 4) for n in ANSWER_EVALUATING])
    return {n: build_items(f"rg:{n}", "val", 4) for n in ANSWER_EVALUATING}


@pytest.mark.parametrize("name", ANSWER_EVALUATING)
def test_grammar_admits_every_gold_answer(name):
    import reasoning_gym

    ds = reasoning_gym.create_dataset(name, seed=1_000, size=60)
    for i in range(60):
        entry = json.loads(entry_to_json(ds[i]))
        if entry["answer"] is not None:
            assert answer_grammar.admits(name, entry["answer"], entry), entry["answer"]
        for bad in _payloads("/tmp/f"):
            assert not answer_grammar.admits(name, bad, entry), bad


@pytest.mark.parametrize("name", ANSWER_EVALUATING)
def test_code_in_answers_scores_zero_and_runs_nothing(items, name, tmp_path):
    it = items[name][0]
    assert it.source == name
    for n, payload in enumerate(_payloads(tmp_path / "X")):
        target = tmp_path / f"F{n}"
        payload = payload.replace(str(tmp_path / "X"), str(target))
        assert score(it, f"<answer>{payload}</answer>") == 0.0, payload
    assert list(tmp_path.iterdir()) == []
    if it.answer is not None:
        assert score(it, f"<answer>{it.answer}</answer>") == 1.0


@pytest.mark.parametrize("name", ANSWER_EVALUATING)
def test_forgeries_score_no_more_than_the_shortcuts(items, name):
    for r in measure(items[name]):
        assert set(r.forgery_score) == set(FORGERIES)
        assert r.worst_forgery[1] <= r.shortcut_baseline + 1e-9, (r.source, r.worst_forgery)
