"""Paths that once ended in a traceback: each now ends in one line naming its fix, or reads
past what it cannot use."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from musketeers.cache.errors import UserError
from musketeers.config import TrainConfig, save_config

GRIDS = {
    "invalid YAML": (b"runs: [{task: arithmetic\n", "is not valid YAML at line"),
    "not UTF-8": (b"budget: t\nruns: [{task: \xff}]\n", "is not UTF-8 text"),
    "a top-level list": (b"- task: arithmetic\n", "must be a mapping"),
    "runs: 5": (b"runs: 5\n", "runs must be a list of mappings"),
    "seeds: 5": (b"seeds: 5\nruns: [{task: arithmetic}]\n", "seeds must be a list of integers"),
    "stage: abc": (b"runs: [{task: arithmetic, stage: abc}]\n", "runs[0].stage must be an int"),
}


@pytest.mark.parametrize("case", GRIDS)
def test_a_malformed_grid_file_is_one_line_naming_it(tmp_path: Path, case: str):
    from musketeers.design.gridspec import load_grid

    text, says = GRIDS[case]
    path = tmp_path / "g.yaml"
    path.write_bytes(text)
    with pytest.raises(UserError, match=r".*".join(map(lambda s: s.replace("[", r"\["),
                                                        (str(path), says)))) as err:
        load_grid(path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("line", [b"{}\n", b"[1, 2]\n", b'{"step": 2, "reward_mean": \xff}\n',
                                  b"\xfe\xff\n"])
def test_a_stray_metrics_line_is_skipped_by_resume_and_summary(tmp_path: Path, line: bytes):
    from musketeers.run.runlog import read_metrics, summarize, truncate_metrics

    rows = [{"step": s, "reward_mean": 0.1 * s, "exact": 0.0, "zero_var_frac": 0.5}
            for s in (1, 2, 3)]
    path = tmp_path / "metrics.jsonl"
    body = [json.dumps(r).encode() + b"\n" for r in rows]
    path.write_bytes(b"".join(body[:1] + [line] + body[1:]))
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3]
    assert summarize(tmp_path, 3)["steps"] == 3
    truncate_metrics(path, 2)
    assert [r["step"] for r in read_metrics(path)] == [1, 2]


@pytest.mark.parametrize("saved", ['{"experts": []}', '{"experts": "x"}', "[1]", '"x"'])
def test_a_fingerprints_file_of_the_wrong_shape_is_one_line(tmp_path: Path, saved: str):
    from musketeers.run.runfolder import FINGERPRINTS, check_store

    (tmp_path / FINGERPRINTS).write_text(saved)
    with pytest.raises(UserError, match="fingerprints.json is unreadable.*start a new --run-dir"):
        check_store(TrainConfig(task="arithmetic", cache_dir=tmp_path / "s"), tmp_path,
                    now={"items": None, "experts": {}})


def test_an_over_long_run_dir_is_one_line(tmp_path: Path):
    from musketeers.run.runfolder import check_run_dir

    with pytest.raises(UserError, match=r"cannot be used \(File name too long\); pass a "
                                        "shorter --run-dir"):
        check_run_dir(tmp_path / ("r" * 300))


def test_a_samples_file_that_is_not_utf8_names_the_evaluation_that_rewrites_it(tmp_path):
    from musketeers.reports.paired import by_item

    run = tmp_path / "my run"
    run.mkdir()
    (run / "eval_no_context_samples.jsonl").write_bytes(b'{"id": "a", "score": 1}\n\xff\n')
    with pytest.raises(UserError) as err:
        by_item(run / "eval_no_context_samples.jsonl", "exact")
    fix = str(err.value).split("again: ")[1]
    assert shlex.split(fix) == ["musketeers", "eval", str(run), "--no-context"]


# --- eval ------------------------------------------------------------------------------------

def _fake_run(run: Path) -> None:
    """A run folder as far as eval's checks read it: config and one checkpoint."""
    from musketeers.run.checkpoint import write_manifest

    (run / "checkpoints" / "step-000001").mkdir(parents=True)
    (run / "checkpoints" / "step-000001" / "state.json").write_text("{}")
    write_manifest(run / "checkpoints" / "step-000001")
    save_config(TrainConfig(task="arithmetic", run_dir=str(run)), run / "config.yaml")


@pytest.fixture
def read_only(tmp_path: Path):
    """A folder this process cannot write (as root, chmod is not enough: the immutable flag)."""
    run = tmp_path / "ro run"
    run.mkdir()
    _fake_run(run)
    root = os.geteuid() == 0
    if root and subprocess.run(["chattr", "+i", str(run)], capture_output=True).returncode:
        pytest.skip("no way to make a folder read-only for root here")
    if not root:
        run.chmod(0o555)
    yield run
    if root:
        subprocess.run(["chattr", "-i", str(run)], check=True)
    else:
        run.chmod(0o755)


def test_eval_refuses_a_read_only_run_folder_before_it_evaluates(read_only, monkeypatch):
    from musketeers.run import evaluate

    def no_models(*a, **k):
        raise AssertionError("the evaluation started before the folder was checked")

    monkeypatch.setattr(evaluate, "build_components", no_models)
    with pytest.raises(UserError, match="is not writable") as err:
        evaluate.evaluate(read_only)
    message = str(err.value)
    assert "\n" not in message and message.endswith(
        f"run again: musketeers eval {shlex.quote(str(read_only))}")


def test_eval_on_a_full_disk_keeps_the_earlier_files_whole(tmp_path: Path):
    from musketeers.run.evaluate import write_eval

    run = tmp_path / "run"
    run.mkdir()
    write_eval(run, {"exact": 0.5}, [{"id": "a"}], False, "again")
    before = (run / "eval_samples.jsonl").read_bytes()
    code = "\n".join([  # a file size cap fails the write as a full disk would
        "import resource, signal, sys",
        "from pathlib import Path",
        "from musketeers.cache.errors import UserError",
        "from musketeers.run.evaluate import write_eval",
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)",
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))",
        "try:",
        f"    write_eval(Path({str(run)!r}), {{'exact': 0.9}}, [{{'id': 'b' * 9999}}], False, "
        "'again')",
        "except UserError as exc:",
        "    print(exc)",
    ])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.startswith("disk full or unwritable"), out.stderr[-500:]
    assert out.stdout.strip().endswith("run again: again") and out.stdout.count("\n") == 1
    assert (run / "eval_samples.jsonl").read_bytes() == before
    assert sorted(p.name for p in run.iterdir()) == ["eval.json", "eval_samples.jsonl"]
    kept = json.loads((run / "eval.json").read_text())
    assert kept["exact"] == 0.5  # the earlier pair, whole: its samples' digest is theirs
    assert kept["samples_sha256"] == hashlib.sha256(before).hexdigest()


def test_eval_reads_the_newer_checkpoint_when_training_prunes_the_one_it_read(tmp_path,
                                                                              monkeypatch):
    import shutil

    from musketeers.run import checkpoint as ckpt
    from musketeers.run.evaluate import load_newest

    run = tmp_path / "run"
    _fake_run(run)
    loaded = []

    def load(folder, model, adapter):
        if folder.name == "step-000001":  # training saves step 2 and prunes step 1 mid-read
            newer = folder.with_name("step-000002")
            newer.mkdir()
            (newer / "state.json").write_text("{}")
            ckpt.write_manifest(newer)
            shutil.rmtree(folder)
            raise FileNotFoundError(folder / "lora")
        loaded.append(folder.name)

    monkeypatch.setattr(ckpt, "load_weights", load)
    assert load_newest(run, None, None).name == "step-000002" and loaded == ["step-000002"]


def test_a_grid_entry_list_is_read_as_before(tmp_path: Path):
    """The checks refuse only what load_grid cannot use: a valid grid still loads."""
    from musketeers.design.gridspec import load_grid

    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"budget": "t", "seeds": [0, 1], "runs": [
        {"task": "arithmetic", "method": "single", "stage": 2, "seeds": "first"}]}))
    assert [r.stage for r in load_grid(path).runs] == [2]


def test_another_store_is_refused_with_the_quoted_folder_it_trained_on(tmp_path: Path):
    from musketeers.run.runfolder import FINGERPRINTS, check_store

    old = tmp_path / "old stores; rm -rf ~"
    (tmp_path / FINGERPRINTS).write_text(json.dumps({"cache_dir": str(old), "items": "a",
                                                     "experts": {}}))
    with pytest.raises(UserError) as err:
        check_store(TrainConfig(task="arithmetic", cache_dir=str(tmp_path / "new")), tmp_path,
                    now={"items": "b", "experts": {}})
    pasted = shlex.split(str(err.value).split("pass ")[1].split(", the store")[0])
    assert pasted == ["--cache-dir", str(old)]
