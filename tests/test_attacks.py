"""The store and the scorer as attack surfaces: each attack that once worked, kept as a test."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from musketeers.cache.errors import UserError
from musketeers.cache.items import Item
from musketeers.tasks import build_items, check_items, score, task_spec
from musketeers.tasks.forgeries import FORGERIES, measure
from musketeers.tasks.variants import DEFAULT_PROMPT, packaged_tasks


@pytest.fixture(scope="module")
def arithmetic_items():
    return build_items("arithmetic:easier@direct", "val", 60)


def _by_source(items: list[Item], source: str) -> Item:
    return next(it for it in items if it.source == source)


@pytest.mark.parametrize("forgery", ["nan", "NaN", "nanj", "-nan", "nan+nanj", "inf"])
def test_non_finite_answers_no_longer_forge_complex_arithmetic(arithmetic_items, forgery):
    it = _by_source(arithmetic_items, "complex_arithmetic")
    assert score(it, f"<answer>{forgery}</answer>") == 0.0
    assert score(it, f"<answer>{it.answer}</answer>") == 1.0  # the gold still scores


def test_unevaluated_integral_and_restated_premise_score_nothing():
    from musketeers.tasks.hardening import forged

    entry = {"answer": "x**2/2 + C", "metadata": {"integrand": "x", "variable": "x"}}
    assert forged("Integral(x, x)", entry) and not forged("x**2/2 + C", entry)
    logic = {"answer": None, "metadata": {"premises": ["P", "(Q → P)"]}}
    assert forged("(P)", logic) and forged("Q → P", logic) and not forged("(P ∨ Q)", logic)
    # a gold that is itself non-finite is never refused; an unevaluated gold is no answer: the
    # integral restated earns nothing there either, and admission leaves the item out
    from musketeers.tasks.hardening import no_answer

    unevaluated = {"answer": "Integral(exp(x**2), x) + C"}
    assert forged("Integral(exp(x**2), x)", unevaluated) and no_answer(unevaluated)
    assert not no_answer(entry) and not forged("nan", {"answer": "nan"})


# every packaged base and level, each once: a prompt style changes what the experts read,
# never how an answer is scored
PACKAGED = tuple(packaged_tasks((DEFAULT_PROMPT,)))


@pytest.mark.parametrize("task", PACKAGED)
def test_forgery_battery_scores_no_more_than_the_shortcuts(task):
    for r in measure(build_items(task, "val", 40)):
        name, worst = r.worst_forgery
        assert set(r.forgery_score) == set(FORGERIES)
        assert worst <= r.shortcut_baseline + 1e-9, (r.source, name, worst)


def test_an_identical_precompute_reopens_the_store_of_every_packaged_variant(tmp_path: Path):
    """A tuple in a level's config used to read back as a list: the store could not reopen."""
    from musketeers.cache.store import open_root, store_path

    for task in packaged_tasks():
        path = store_path(tmp_path, task)
        open_root(path, task, task_spec(task))
        before = (path / "zarr.json").read_bytes()
        # no --force: a spec that differs from the one read back is refused
        open_root(path, task, task_spec(task), rebuild="--force")
        assert (path / "zarr.json").read_bytes() == before, task


def test_edited_items_are_refused_before_anything_is_scored(arithmetic_items):
    items = list(arithmetic_items)
    check_items("arithmetic:easier@direct", "val", items)  # as generated: accepted
    entry = json.loads(items[3].entry)
    entry["metadata"]["source_dataset"] = "bitwise_arithmetic"
    entry["metadata"]["problem"] = "(__import__('os').system('id'))"
    items[3] = replace(items[3], source="bitwise_arithmetic", entry=json.dumps(entry))
    with pytest.raises(UserError, match="row 3.*rebuild it: musketeers precompute"):
        check_items("arithmetic:easier@direct", "val", items, fix="musketeers precompute --force")


def test_an_edited_entry_cannot_hand_the_evaluator_code(tmp_path: Path):
    """The store attack: an item claiming bitwise_arithmetic with code as its problem."""
    target = tmp_path / "pwned"
    entry = {"answer": "0x1", "metadata": {
        "source_dataset": "bitwise_arithmetic",
        "problem": f"(setattr(sys.modules['musketeers.tasks.sandbox'],'_DENIED',()), "
                   f"__import__('os').system('id > {target}'))"}}
    item = Item("x", "q", "", "0x1", json.dumps(entry), "bitwise_arithmetic")
    assert score(item, "<answer>0x1</answer>") == 0.0
    assert not target.exists()


def test_the_sandbox_cannot_be_switched_off_from_inside(tmp_path: Path):
    """Rebinding the module's globals or patching os.path no longer disarms the hook."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    attacks = {
        "globals": "setattr(sandbox, '_DENIED', ()); setattr(sandbox, '_inside', "
                   "lambda *a, **k: True); setattr(sandbox, '_PATH_EVENTS', {})",
        "realpath": f"os.path.realpath = lambda p: {str(root)!r}",
    }
    code = "\n".join([
        "import gc, json, os, sys",
        "from musketeers.tasks import sandbox",
        f"sandbox.confine({str(root)!r})",
        f"for stmt in {list(attacks.values())!r}:",
        "    exec(stmt)",
        "refused = []",
        f"for name, stmt in {{'system': 'os.system(\"touch {outside}/a\")', "
        f"'open': 'open(\"{outside}/b\", \"w\")', 'gc': 'gc.get_objects()'}}.items():",
        "    try:",
        "        exec(stmt)",
        "    except PermissionError:",
        "        refused.append(name)",
        "print(json.dumps(sorted(refused)))",
    ])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert json.loads(out.stdout) == ["gc", "open", "system"], out.stderr[-500:]
    assert list(outside.iterdir()) == []


# each runs after confine() in a fresh interpreter; ROOT and OUT are the sandbox and a folder
# outside it. Every one must end in PermissionError and leave OUT empty.
_INSIDE_ATTACKS = {
    "patch a function's code": "f = lambda m, fl: True\n"
                               "f.__code__ = (lambda m, fl: False).__code__",
    "patch a function's defaults": "f = lambda p=1: p\nf.__defaults__ = (2,)",
    "sys._getframe": "sys._getframe().f_back.f_locals",
    "a traceback's frame": "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n"
                           "    e.__traceback__.tb_frame",
    "a generator's frame": "(x for x in ()).gi_frame",
    "reload fork_exec": "del sys.modules['_posixsubprocess']\nimport _posixsubprocess\n"
                        "_posixsubprocess.fork_exec",
    "patch what realpath calls": "import posixpath\n"
                                 "posixpath.abspath = lambda p: ROOT + '/x'\n"
                                 "posixpath._joinrealpath = lambda *a: (ROOT + '/x', True)\n"
                                 "open(OUT + '/a', 'w')",
    "patch builtins": "import builtins\nbuiltins.isinstance = lambda *a: False\n"
                      "builtins.type = lambda *a: str\nopen(OUT + '/b', 'w')",
}


def test_an_evaluated_expression_cannot_reach_or_patch_the_sandbox(tmp_path: Path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    code = "\n".join([
        "import json, sys",
        "from musketeers.tasks import sandbox",
        f"ROOT, OUT = {str(root.resolve())!r}, {str(outside)!r}",
        "sandbox.confine(ROOT)",
        "refused = []",
        f"for name, stmt in {_INSIDE_ATTACKS!r}.items():",
        "    try:",
        "        exec(stmt, {'sys': sys, 'ROOT': ROOT, 'OUT': OUT})",
        "    except PermissionError:",
        "        refused.append(name)",
        "open('inside', 'w').write('ok')",  # its own directory stays writable
        "print(json.dumps(sorted(refused)))",
    ])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert json.loads(out.stdout) == sorted(_INSIDE_ATTACKS), out.stderr[-800:]
    assert list(outside.iterdir()) == [] and (root / "inside").read_text() == "ok"


@pytest.mark.parametrize("key,value", [("lr", float("nan")), ("adapter_lr", float("inf")),
                                       ("beta", float("nan")), ("temperature", float("inf"))])
def test_non_finite_hyper_parameters_are_refused_before_anything_starts(key, value):
    from musketeers.config import TrainConfig, validate

    with pytest.raises(UserError, match=f"'{key}' must be a finite number"):
        validate(TrainConfig(**{"task": "arithmetic", key: value}))


# --- run folders and published runs -----------------------------------------------------------

def test_publishing_leaves_symlinked_artefacts_behind(tmp_path: Path):
    from musketeers.grid.publish import publish_run

    secret = tmp_path / "secret.txt"
    secret.write_text("private key")
    src, dest = tmp_path / "run", tmp_path / "published"
    src.mkdir()
    (src / "config.yaml").write_text("seed: 0\n")
    (src / "error.txt").symlink_to(secret)
    publish_run(src, dest)
    assert (dest / "config.yaml").read_text() == "seed: 0\n"
    assert not (dest / "error.txt").exists()


def test_a_symlinked_ledger_is_neither_published_nor_adopted(tmp_path: Path):
    from musketeers.design.gridspec import Grid
    from musketeers.grid.ledger import ledger_path
    from musketeers.grid.publish import adopt_published, publish_ledger

    secret = tmp_path / "secret.txt"
    secret.write_text('{"private": "key"}\n')
    grid = Grid(budget="t", description="", defaults={}, runs=[])
    runs, published = tmp_path / "runs", tmp_path / "published"
    runs.mkdir()
    published.mkdir()
    ledger_path(runs, "t").symlink_to(secret)
    publish_ledger(grid, runs, published)
    assert not ledger_path(published, "t").exists()
    ledger_path(runs, "t").unlink()
    ledger_path(published, "t").symlink_to(secret)
    adopt_published(grid, runs, published)
    assert not ledger_path(runs, "t").exists()


def test_a_symlink_to_a_locked_run_folder_is_the_same_lock(planted_store, tmp_path: Path):
    from musketeers.cache.store import Lock, lock_path
    from musketeers.checks.planted import planted_config
    from musketeers.run.trainer import train

    real = tmp_path / "real"
    real.mkdir()
    alias = tmp_path / "alias"
    alias.symlink_to(real)
    with Lock(lock_path(real)):
        with pytest.raises(UserError, match="being trained by another process"):
            train(planted_config("perceiver", 0, 1, planted_store, alias, threads=1), plot=False)


def test_an_evaluation_of_an_earlier_checkpoint_is_not_the_runs_result(tmp_path: Path):
    from musketeers.grid.status import run_status

    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"status": "done", "steps": 400}))
    (run / "eval.json").write_text(json.dumps({"exact": 0.5, "checkpoint": "step-000100"}))
    assert run_status(run) == "trained"
    (run / "eval.json").write_text(json.dumps({"exact": 0.5, "checkpoint": "step-000400"}))
    assert run_status(run) == "done"


def test_the_grid_evaluates_the_final_checkpoint_over_an_earlier_evaluation(tmp_path: Path):
    """An `eval` run mid-training left eval.json of step 1; the grid must redo it, not adopt it."""
    import yaml

    from musketeers.design.gridspec import load_grid
    from musketeers.grid.fake import fake_train
    from musketeers.grid.run import run_grid

    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"budget": "t", "seeds": [0],
                                    "runs": [{"task": "arithmetic", "method": "single"}]}))
    grid = load_grid(path)
    runs = tmp_path / "runs"
    run = runs / grid.runs[0].name
    fake_train({**grid.runs[0].fields, "run_dir": str(run)}, steps=3)
    (run / "eval.json").write_text(json.dumps({"exact": 0.9, "checkpoint": "step-000001"}))
    graded: list[Path] = []

    def evaluate(run_dir: Path, limit: int | None, context: bool) -> dict:
        graded.append(run_dir)  # returns its result without writing it, as a fake may
        return {"exact": 0.4, "checkpoint": "step-000003"}

    result = run_grid(grid, runs, train_fn=lambda cfg: run, eval_fn=evaluate,
                      config_fn=lambda fields: fields)
    assert graded == [run] and result.evaluated == [grid.runs[0].name]
    assert json.loads((run / "eval.json").read_text())["checkpoint"] == "step-000003"


def test_a_checkpoint_with_non_finite_weights_is_never_written(tmp_path: Path):
    import torch

    from musketeers.run import checkpoint as ckpt

    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(UserError, match="weight is not finite; the checkpoint is not written"):
        ckpt.save_checkpoint(tmp_path, 1, model, None, opt, None, torch.Generator())
    assert ckpt.list_checkpoints(tmp_path) == []


@pytest.mark.parametrize("key,value", [("seed", 2**32), ("group_size", 10**9),
                                       ("latents", 10**7), ("d_model", 10**8)])
def test_out_of_range_sizes_are_one_line_errors(key, value):
    from musketeers.config import TrainConfig, validate

    with pytest.raises(UserError, match=f"'{key}' must be"):
        validate(TrainConfig(**{"task": "arithmetic", key: value}))


def test_an_adapter_too_large_for_memory_is_a_one_line_error(planted_store, tmp_path,
                                                             monkeypatch):
    """Sizes under the limits can still exceed this machine's memory: the allocator's error
    becomes one line naming the options, and any other error still surfaces as itself."""
    from musketeers.checks.planted import planted_config
    from musketeers.method import methods
    from musketeers.run import build

    cfg = planted_config("perceiver", 0, 1, planted_store, tmp_path / "run", d_model=16384)

    def refuse(*_a, **_k):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                           "1073741824 bytes")

    monkeypatch.setattr(build, "build_adapter", refuse)
    with pytest.raises(UserError, match="does not fit in memory; pass a smaller --d-model"):
        build.build_components(cfg, "train", method=methods.get(cfg.method))

    def broken(*_a, **_k):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(build, "build_adapter", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        build.build_components(cfg, "train", method=methods.get(cfg.method))


def test_tasks_show_prints_each_datasets_shortcuts_and_forgeries():
    from typer.testing import CliRunner

    from musketeers.cli.main import app

    out = CliRunner().invoke(app, ["tasks", "show", "arithmetic:easier@direct", "--limit", "40"],
                             env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    for source in ("chain_sum", "complex_arithmetic", "decimal_chain_sum", "products"):
        assert source in out.output
    assert "constant exact" in out.output and "non-finite 0.00" in out.output
    bad = CliRunner().invoke(app, ["tasks", "show", "arithmetc"])
    assert isinstance(bad.exception, UserError) and "unknown task" in str(bad.exception)


def test_cache_probe_refuses_items_its_task_does_not_generate(tmp_path: Path):
    import shutil

    import zarr
    from typer.testing import CliRunner

    from musketeers.cli.main import app

    fixtures = Path(__file__).resolve().parent / "fixtures"
    shutil.copytree(fixtures / "arithmetic.zarr", tmp_path / "arithmetic.zarr")
    question = zarr.open_group(tmp_path / "arithmetic.zarr", mode="r+")["val/items/question"]
    question[0] = "What is 2 + 2? (edited)"
    out = CliRunner().invoke(app, ["cache", "probe", "arithmetic", "--roster", "tiny",
                                   "--cache-dir", str(tmp_path), "--poolings", "last"])
    assert isinstance(out.exception, UserError)  # cli.main turns it into one line
    assert "are not the ones the task generates" in str(out.exception)
