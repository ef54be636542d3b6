"""Results are consistent or refused: each attack on what a run reads, resumes or publishes
that once went through, kept as a test (swapped or deleted digests, NaN vectors, an edited
config.yaml, evaluations of another size or torn from their samples, a failed grid run that
exited 0, store metadata that traced back or hung)."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr
from test_cache_manifest import build

from musketeers.cache import from_memory, layout, reader
from musketeers.cache.describe import describe
from musketeers.cache.errors import UserError
from musketeers.cache.verify import inspect_store, verify_store

REPO = Path(__file__).resolve().parents[1]


def _edit_attrs(meta: Path, **attrs) -> None:
    spec = json.loads(meta.read_text())
    spec["attributes"].update(attrs)
    meta.write_text(json.dumps(spec))


def _drop_attr(meta: Path, name: str) -> None:
    spec = json.loads(meta.read_text())
    del spec["attributes"][name]
    meta.write_text(json.dumps(spec))


# --- 1. the reader checks the digests of what a run reads ------------------------------------

def test_a_run_refuses_train_vectors_swapped_for_vals(planted_store, tmp_path: Path):
    from musketeers.checks.planted import planted_config, write_planted_store
    from musketeers.run.trainer import train

    store = tmp_path / "stores"
    write_planted_store(store, n_train=16, n_val=16)  # one 16-row chunk per split
    unit = store / "planted.zarr/{}/experts/noise-a/last/c/0/0"
    train_chunk, val_chunk = Path(str(unit).format("train")), Path(str(unit).format("val"))
    train_chunk.write_bytes(val_chunk.read_bytes())  # a valid chunk: its crc passes
    run = tmp_path / "run"
    cfg = planted_config("perceiver", 0, 1, store, run, prompts_per_micro=2, group_size=2,
                         threads=1)
    with pytest.raises(UserError, match=r"train/experts/noise-a .*differ from the digests"):
        train(cfg, plot=False)
    assert not (run / "metrics.jsonl").exists()


def test_the_reader_refuses_swapped_items_and_vectors(cache_dir: Path):
    path = build(cache_dir)
    rows = reader.read_vectors(cache_dir, "toy", "train", ["e"], "last")[0]
    assert rows.shape == (8, 3)
    items = path / "train/items/question/c/0"
    items.write_bytes((path / "val/items/question/c/0").read_bytes())
    with pytest.raises(UserError, match="train/items .*differ from the digests"):
        reader.read_items(cache_dir, "toy", "train")


# --- 2. a store without digests warns on every read and is not "OK" --------------------------

def test_a_store_whose_digests_were_deleted_warns_on_every_read(cache_dir: Path, caplog):
    path = build(cache_dir)
    _drop_attr(path / "train/experts/e/zarr.json", "sha256")
    with caplog.at_level(logging.WARNING, logger="musketeers.cache"):
        for _ in range(2):
            reader.read_vectors(cache_dir, "toy", "train", ["e"], "last")
    warned = [r for r in caplog.records if "no checksum manifest" in r.getMessage()]
    assert len(warned) == 2 and "--force" in warned[0].getMessage()
    assert describe(path).unsealed == ["train/experts/e"]  # what `cache info` warns about
    problems, notes = inspect_store(path)
    assert not problems and [n.where for n in notes] == ["train/experts/e"]


# --- 3. non-finite vectors are refused when written and when read ----------------------------

def test_resealed_nan_vectors_are_refused_by_the_reader_and_verify(cache_dir: Path):
    path = build(cache_dir)
    g = zarr.open_group(path, path="train/experts/e", mode="r+")
    g["last"][:] = np.nan
    layout.seal(g)  # the digests now agree with the NaN rows
    with pytest.raises(UserError, match=r"train/experts/e/last .*non-finite .*--force"):
        reader.read_vectors(cache_dir, "toy", "train", ["e"], "last")
    assert any("non-finite" in str(p) for p in verify_store(path))


def test_precompute_refuses_to_write_non_finite_vectors(cache_dir: Path):
    from musketeers.cache.dist import Dist
    from musketeers.cache.precompute import run_chunks

    path = build(cache_dir)
    g = zarr.open_group(path, path="train/experts/e", mode="r+")
    g["done"][:] = 0

    def compute(lo, hi, tick):
        return {"last": np.full((hi - lo, 3), np.inf, np.float32)}, 0

    with pytest.raises(UserError, match=r"train/experts/e: .*non-finite .*--dtype float32"):
        run_chunks(g, 8, 4, Dist(), "toy", compute)
    assert not layout.done_flags(g).any()
    sg = zarr.open_group(path, path="val", mode="r+")
    with pytest.raises(ValueError, match="non-finite"):
        from_memory.write_expert(sg, "f", {"last": np.full((8, 3), np.nan, np.float32)},
                                 fingerprint={"f": 1}, n_layers=1, d=3, dtype="float32")


# --- 4. --resume refuses an edited config.yaml ----------------------------------------------

def test_resume_and_eval_refuse_a_hand_edited_config(planted_store, tmp_path: Path):
    from musketeers.checks.planted import planted_config
    from musketeers.config import read_run_config
    from musketeers.run.evaluate import evaluate
    from musketeers.run.trainer import train

    run = tmp_path / "run"
    train(planted_config("perceiver", 0, 2, planted_store, run, prompts_per_micro=2,
                         group_size=2, save_every=1, threads=1), stop_after=1, plot=False)
    config = run / "config.yaml"
    original = config.read_text()
    assert "lr: 0.01\n" in original
    config.write_text(original.replace("lr: 0.01\n", "lr: 0.5\n", 1))
    with pytest.raises(UserError, match="differs from the config the run started with.*"
                                        "restore config.yaml.*new --run-dir"):
        train(read_run_config(run), resume=True, plot=False)
    with pytest.raises(UserError, match="differs from the config the run started with"):
        evaluate(run, limit=2)
    config.write_text(original)  # restored: the run goes on
    train(read_run_config(run), resume=True, plot=False)
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]


def test_the_config_digest_ignores_where_a_run_lives_and_fields_added_since(tmp_path: Path):
    from dataclasses import replace

    from musketeers.config import TrainConfig, config_digest
    from musketeers.run.runfolder import CONFIG_DIGEST, check_config

    cfg = TrainConfig(task="arithmetic", lr=1e-3)
    recorded = config_digest(cfg)
    recorded = config_digest(cfg, [k for k in recorded["fields"] if k != "adapter_lr"])
    (tmp_path / CONFIG_DIGEST).write_text(json.dumps(recorded))  # a run from before adapter_lr
    assert check_config(replace(cfg, adapter_lr=9.0, device="cuda", cache_dir="x", threads=3),
                        tmp_path)
    with pytest.raises(UserError, match="differs from the config the run started with"):
        check_config(replace(cfg, lr=1e-2), tmp_path)


# --- 5. the grid publishes only its own evaluations, whole -----------------------------------

def _evaluated_run(run: Path, limit: int, samples: list[dict]) -> None:
    from musketeers.run.evaluate import write_eval

    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"eval_limit: {limit}\n")
    (run / "summary.json").write_text(json.dumps({"status": "done", "steps": 4}))
    write_eval(run, {"exact": 0.5, "checkpoint": "step-000004", "limit": limit}, samples,
               no_context=False, again="again")


def test_an_eval_of_another_size_is_neither_the_grids_result_nor_published(tmp_path: Path):
    from musketeers.grid.publish import publish_run
    from musketeers.grid.status import run_status

    run = tmp_path / "run"
    _evaluated_run(run, 2, [{"score": 1.0}, {"score": 0.0}])  # `eval --limit 2` by hand
    assert run_status(run, limit=400) == "trained"  # the grid evaluates it again
    publish_run(run, tmp_path / "pub", eval_limit=400)
    assert not (tmp_path / "pub/eval.json").exists()
    assert not (tmp_path / "pub/eval_samples.jsonl").exists()
    assert (tmp_path / "pub/summary.json").exists()
    assert run_status(run, limit=2) == "done"
    publish_run(run, tmp_path / "pub2", eval_limit=2)
    assert (tmp_path / "pub2/eval.json").exists()


def test_an_eval_torn_from_its_samples_is_neither_done_nor_published(tmp_path: Path):
    from musketeers.grid.publish import publish_run
    from musketeers.grid.status import run_status

    run = tmp_path / "run"
    _evaluated_run(run, 3, [{"score": 1.0}] * 3)
    ev = json.loads((run / "eval.json").read_text())
    samples = (run / "eval_samples.jsonl").read_bytes()
    assert ev["samples_sha256"] == hashlib.sha256(samples).hexdigest()
    assert run_status(run, limit=3) == "done"
    # killed after the next evaluation's samples, before its eval.json
    (run / "eval_samples.jsonl").write_text(json.dumps({"score": 0.0}) + "\n")
    assert run_status(run, limit=3) == "trained"
    publish_run(run, tmp_path / "pub", eval_limit=3)
    assert not (tmp_path / "pub/eval.json").exists()
    assert not (tmp_path / "pub/eval_samples.jsonl").exists()


# --- 6. ablate exits non-zero when a run failed ----------------------------------------------

def test_ablate_exits_1_when_a_run_failed(monkeypatch, tmp_path: Path):
    from typer.testing import CliRunner

    import musketeers.grid.needs as needs
    import musketeers.grid.run as grid_run
    from musketeers.cli.main import app

    monkeypatch.setattr(needs, "ensure_cache", lambda *a, **k: None)
    monkeypatch.setattr(grid_run, "run_grid",
                        lambda *a, **k: grid_run.GridResult(failed={"r1": "RuntimeError: x"}))
    args = ["ablate", "--budget", "smoke", "--shard", "1/1", "--runs-dir",
            str(tmp_path / "runs"), "--reports-dir", str(tmp_path / "reports")]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 1, out.output
    assert "1 failed" in out.output and "FAILED r1" in out.output
    monkeypatch.setattr(grid_run, "run_grid", lambda *a, **k: grid_run.GridResult())
    assert CliRunner().invoke(app, args).exit_code == 0


# --- 7. edited metadata: one line, never a traceback; a FIFO or absurd sizes never hang --------

def test_a_non_integer_n_is_one_line_everywhere(cache_dir: Path):
    path = build(cache_dir)
    _edit_attrs(path / "train/items/zarr.json", n="eight")
    assert [str(p) for p in verify_store(path)] == [
        "train/items: attribute n is 'eight', not an item count in 0..10000000"]
    assert describe(path).items["train"] is None
    with pytest.raises(UserError, match="train/items .*attribute n is 'eight'"):
        reader.read_items(cache_dir, "toy", "train")


def test_a_list_fingerprint_is_one_line_everywhere(cache_dir: Path):
    path = build(cache_dir)
    _edit_attrs(path / "train/experts/e/zarr.json", fingerprint=[1, 2])
    assert any("fingerprint is a list" in str(p) for p in verify_store(path))
    assert describe(path).experts("train")["e"].state == "damaged"
    with pytest.raises(UserError, match="train/experts/e .*fingerprint is a list"):
        reader.read_vectors(cache_dir, "toy", "train", ["e"], "last")


_BOUNDED = textwrap.dedent("""
    import sys
    from pathlib import Path
    from musketeers.cache import reader
    from musketeers.cache.errors import UserError
    from musketeers.cache.verify import verify_store
    from musketeers.cli.main import app
    from typer.testing import CliRunner

    cache_dir = Path(sys.argv[1])
    print([str(p) for p in verify_store(cache_dir / "toy.zarr")])
    try:
        reader.read_vectors(cache_dir, "toy", "train", ["e"], "last")
    except UserError as exc:
        print("refused:", exc)
    print(CliRunner().invoke(app, ["cache", "info", "--cache-dir", str(cache_dir)]).output)
""")


def _bounded(cache_dir: Path) -> str:
    """The checks, in a process of their own: one that blocks fails the test, not the suite."""
    out = subprocess.run([sys.executable, "-c", _BOUNDED, str(cache_dir)], capture_output=True,
                         text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("where", ["train/experts/e/last/zarr.json", "train/experts/e/done/c/0"])
def test_a_fifo_in_a_store_is_reported_not_read(cache_dir: Path, where: str):
    import os

    path = build(cache_dir)
    (path / where).unlink()
    os.mkfifo(path / where)
    out = _bounded(cache_dir)
    assert f"{where}: not a regular file" in out
    assert "refused:" in out and "is not a regular file" in out.split("refused:")[1]
    assert "remove it" in out.splitlines()[-1] or "remove it" in out


def test_absurd_sizes_are_refused_before_anything_iterates(cache_dir: Path):
    path = build(cache_dir)
    _edit_attrs(path / "train/items/zarr.json", n=10**12)
    for meta in (path / "train/items").glob("*/zarr.json"):
        spec = json.loads(meta.read_text())
        spec["shape"] = [10**12]
        meta.write_text(json.dumps(spec))
    spec = json.loads((path / "val/experts/e/last/zarr.json").read_text())
    spec["shape"][0] = 10**12
    (path / "val/experts/e/last/zarr.json").write_text(json.dumps(spec))
    out = _bounded(cache_dir)
    assert "train/items: attribute n is 1000000000000" in out
    assert "val/experts/e: array last has shape (1000000000000, 3), beyond" in out


def test_the_reader_still_reads_a_sound_store(cache_dir: Path):
    """The checks above refuse what is damaged, not what is whole."""
    path = build(cache_dir)
    assert not verify_store(path) and not describe(path).unsealed
    items = reader.read_items(cache_dir, "toy", "val")
    vectors = reader.read_vectors(cache_dir, "toy", "val", ["e"], "last")[0]
    assert len(items) == 8 and np.isfinite(vectors).all() and vectors[0, 0] == 100.0
    shutil.rmtree(path)
