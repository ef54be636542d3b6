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


# --- hostile completions that target the scorer itself: code in answers, forged grades in the
# worker's pipe, writes on the machine

EVALUATING = ("polynomial_multiplication", "intermediate_integration", "binary_matrix")


def _payloads(target) -> list[str]:
    """Answers that run code if evaluated: each would create ``target`` or forge a grade."""
    t = str(target)
    return [
        f"__import__('os').system('touch {t}')",
        f"open('{t}', 'w').write('x')",
        f"exec(\"open('{t}', 'w')\")",
        f"__import__('pathlib').Path('{t}').touch()",
        f"[__import__('subprocess').run(['touch', '{t}'])]",
        "print(1.0)",
        "__import__('sys').stdout.write('1.0\\n')",
        "[[0]] if print(1.0) else [[1]]",
        "x.__class__",
        "Symbol('x')",
        "sympify('x')",
        "[[0, 1], [1, 0]] + [().__class__.__base__.__subclasses__()]",
    ]


def test_every_evaluating_scorer_has_a_grammar():
    """A family dataset whose scorer evals or sympy-parses the answer must be in the table."""
    import inspect

    import reasoning_gym

    from musketeers.tasks import answer_grammar, families
    from musketeers.tasks.reasoning_gym_tasks import dataset_config

    names = {n for members in families().values() for n, _ in members}
    assert set(EVALUATING) <= names and set(EVALUATING) <= set(answer_grammar.GRAMMARS)
    for name in names:
        ds = reasoning_gym.create_dataset(name, seed=0, size=1, **dataset_config(name))
        source = inspect.getsource(type(ds).score_answer)
        if any(s in source for s in ("eval(", "exec(", "parse_expr", "sympify", "simplify(")):
            assert name in answer_grammar.GRAMMARS, name


@pytest.mark.parametrize("name", EVALUATING)
def test_grammar_admits_every_gold_answer(name):
    """200 items per dataset, our config: the grammar never costs a correct answer."""
    import reasoning_gym

    from musketeers.tasks import answer_grammar
    from musketeers.tasks.reasoning_gym_tasks import dataset_config, entry_to_json

    ds = reasoning_gym.create_dataset(name, seed=1_000, size=200, **dataset_config(name))
    for i in range(200):
        entry = json.loads(entry_to_json(ds[i]))  # as the worker sees it
        assert answer_grammar.admits(name, entry["answer"], entry), entry["answer"]
        for bad in _payloads("/tmp/f"):
            assert not answer_grammar.admits(name, bad, entry), bad


@pytest.mark.parametrize("name", EVALUATING)
def test_code_in_answers_scores_zero_and_runs_nothing(items, name, tmp_path):
    it = next(i for i in items if i.source == name)
    for n in range(len(_payloads("x"))):
        target = tmp_path / f"F{n}"
        payload = _payloads(target)[n]
        assert score(it, f"<answer>{payload}</answer>") == 0.0, payload
        assert not target.exists(), payload
    assert list(tmp_path.iterdir()) == []
    assert score(it, f"<answer>{it.answer}</answer>") == 1.0


def test_print_payload_does_not_shift_later_grades(items):
    by = {i.source: i for i in items}
    geometry, chain = by["simple_geometry"], by["chain_sum"]
    wrong = str(int(chain.answer) + 1)
    for name in EVALUATING:
        assert score(by[name], "<answer>print(1.0)</answer>") == 0.0
        assert score(geometry, f"<answer>{geometry.answer}</answer>") == 1.0
        for _ in range(3):
            assert score(chain, f"<answer>{wrong}</answer>") == 0.0
        assert score(chain, f"<answer>{chain.answer}</answer>") == 1.0


# child programs for _ScorerWorker stand-ins: the real _serve, with a scorer that prints
_PRINTING_CHILD = """
import os, sys
from musketeers.tasks import scoring
real = scoring._grade_rg
def printing(*args):
    print("1.0", flush=True)
    sys.stderr.write("1.0\\n")
    os.write(1, b"1.0\\n")
    os.write(2, b"1.0\\n")
    return real(*args)
scoring._grade_rg = printing
scoring._serve({root!r}, private={private})
"""


class _Worker(scoring._ScorerWorker):
    """A worker whose first ``noisy_lives`` children print stray lines before each grade."""

    def __init__(self, noisy_lives: int, private: bool = False) -> None:
        super().__init__()
        self.noisy_lives, self.private = noisy_lives, private

    def _child_code(self, root: str) -> str:
        if self.starts < self.noisy_lives:
            return _PRINTING_CHILD.format(root=root, private=self.private)
        return super()._child_code(root)


def test_stray_output_restarts_the_worker_and_regrades(items):
    chain = next(i for i in items if i.source == "chain_sum")
    wrong = str(int(chain.answer) + 1)
    worker = _Worker(noisy_lives=1)  # protocol on fds 0/1: the stray "1.0" reaches the parent
    try:
        assert worker("chain_sum", wrong, chain.entry) == 0.0  # not the forged 1.0
        assert worker.starts == 2
        assert worker("chain_sum", chain.answer, chain.entry) == 1.0
        assert worker("chain_sum", wrong, chain.entry) == 0.0
        assert worker.starts == 2
    finally:
        worker.stop()
    always = _Worker(noisy_lives=10)  # misbehaves again on the re-grade: 0, never the forgery
    try:
        assert always("chain_sum", wrong, chain.entry) == 0.0
        assert always.starts == 2
    finally:
        always.stop()


def test_scorer_prints_never_reach_the_private_channel(items):
    chain = next(i for i in items if i.source == "chain_sum")
    worker = _Worker(noisy_lives=10, private=True)
    try:
        for answer, grade in ((str(int(chain.answer) + 1), 0.0), (chain.answer, 1.0)) * 2:
            assert worker("chain_sum", answer, chain.entry) == grade
        assert worker.starts == 1  # nothing stray ever came back: no restart needed
    finally:
        worker.stop()


_GRAMMARLESS_CHILD = """
from musketeers.tasks import answer_grammar, scoring
answer_grammar.GRAMMARS.clear()
scoring._serve({root!r})
"""


class _GrammarlessWorker(scoring._ScorerWorker):
    def _child_code(self, root: str) -> str:
        return _GRAMMARLESS_CHILD.format(root=root)


def test_sandbox_alone_stops_the_payloads(items, tmp_path):
    """Grammars off: the scorers eval the payloads, and the child's sandbox refuses them."""
    poly = next(i for i in items if i.source == "polynomial_multiplication")
    worker = _GrammarlessWorker()
    try:
        for n, _ in enumerate(_payloads("x")):
            target = tmp_path / f"F{n}"
            value = worker("polynomial_multiplication", _payloads(target)[n], poly.entry)
            assert value == 0.0 and not target.exists()
        assert worker("polynomial_multiplication", poly.answer, poly.entry) == 1.0
    finally:
        worker.stop()
    assert list(tmp_path.iterdir()) == []


def test_sandbox_refuses_effects_outside_its_directory(tmp_path):
    import subprocess
    import sys

    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    attempts = {
        "system": f"os.system('touch {outside}/a')",
        "popen": f"subprocess.run(['touch', '{outside}/b'])",
        "fork_exec": "import _posixsubprocess; _posixsubprocess.fork_exec()",
        "fork": "os.fork()",
        "exec": "os.execv('/bin/true', ['true'])",
        "open": f"open('{outside}/c', 'w')",
        "os.open": f"os.open('{outside}/d', os.O_WRONLY | os.O_CREAT)",
        "touch": f"pathlib.Path('{outside}/e').touch()",
        "relative": "open('../outside/f', 'w')",
        "mkdir": f"os.mkdir('{outside}/g')",
        "remove": f"os.remove('{outside}/keep')",
        "socket": "socket.socket().connect(('127.0.0.1', 9))",
        "chdir": "os.chdir('/')",
        "rlimit": "resource.setrlimit(resource.RLIMIT_FSIZE, (-1, -1))",
    }
    (outside / "keep").write_text("k")
    code = "\n".join([
        "import json, os, pathlib, resource, socket, subprocess, sys",
        "from musketeers.tasks import sandbox",
        f"sandbox.confine({str(root)!r})",
        "refused = []",
        f"for name, stmt in {attempts!r}.items():",
        "    try:",
        "        exec(stmt)",
        "    except PermissionError:",
        "        refused.append(name)",
        "open('inside', 'w').write('ok')",  # its own directory stays writable
        "print(json.dumps([refused, os.getcwd(), os.environ['HOME'], os.environ['TMPDIR']]))",
    ])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    refused, cwd, home, tmp = json.loads(out.stdout)
    assert sorted(refused) == sorted(attempts)
    assert sorted(p.name for p in outside.iterdir()) == ["keep"]
    assert (root / "inside").read_text() == "ok" and cwd == home == tmp == str(root.resolve())


_HOSTILE_ANSWERS = st.sampled_from(range(len(_payloads("x"))))


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_property_hostile_and_honest_interleaved(items, tmp_path, data):
    """Each honest grade equals a fresh in-process grade; hostile ones score 0, run nothing."""
    rg = [i for i in items if i.source not in ("gsm8k", "planted")]
    evaluating = [i for i in rg if i.source in EVALUATING]
    golds = [i.answer for i in rg if i.answer is not None]
    steps = data.draw(st.lists(st.booleans(), min_size=2, max_size=8))
    for n, hostile in enumerate(steps):
        if hostile:
            it = data.draw(st.sampled_from(evaluating))
            target = tmp_path / f"H{n}"
            payload = _payloads(target)[data.draw(_HOSTILE_ANSWERS)]
            assert score(it, f"<answer>{payload}</answer>") == 0.0
            assert not target.exists()
        else:
            it = data.draw(st.sampled_from(rg))
            drawn = data.draw(st.sampled_from([it.answer, *golds]))
            answer = extract_answer(f"<answer>{drawn}</answer>")
            entry = json.loads(it.entry)
            source = entry.get("metadata", {}).get("source_dataset") or it.source
            expected = min(max(float(scoring._rg_scorer(source, None)(answer, entry)), 0.0), 1.0)
            assert score(it, f"<answer>{answer}</answer>") == pytest.approx(expected), answer
