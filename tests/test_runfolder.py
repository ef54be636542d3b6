"""A run folder under hostile use: a second writer, another store on resume, damaged
checkpoints, a run killed before its first checkpoint, --resume --steps, a full disk."""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from typer.testing import CliRunner

from musketeers.cache.errors import UserError
from musketeers.cache.store import Lock, lock_path
from musketeers.checks.planted import planted_config, write_planted_store
from musketeers.config import read_run_config
from musketeers.run import checkpoint as ckpt
from musketeers.run.trainer import train

pytestmark = pytest.mark.usefixtures("one_thread")

TIMING = {"time_s", "phase_s"}  # wall-clock: differs run to run


@pytest.fixture(scope="module")
def full_run(planted_store, tmp_path_factory) -> list[dict]:
    """The metrics of an uninterrupted 4-step run, for the resumed runs to match."""
    run = tmp_path_factory.mktemp("full") / "run"
    train(small(planted_store, run), plot=False)
    return metrics(run)


def small(store: Path, run: Path, steps: int = 4, **kw):
    values = dict(prompts_per_micro=2, group_size=2, grad_accum=1, save_every=1, inner_iters=1,
                  threads=1)
    values.update(kw)
    return planted_config("perceiver", 0, steps, store, run, **values)


def metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def test_a_second_training_of_a_locked_run_folder_is_refused(planted_store, tmp_path):
    run = tmp_path / "run"
    # what a training in another process holds (flock conflicts across open files, so one
    # process can stand in for two)
    with Lock(lock_path(run)):
        with pytest.raises(UserError, match=r"being trained by another process \(PID \d+\)"):
            train(small(planted_store, run), plot=False)
    assert not run.exists()
    train(small(planted_store, run, steps=1), plot=False)  # released: it trains
    assert not (tmp_path / "run.lock").exists()


def test_eval_refuses_a_store_replaced_after_training(planted_store, tmp_path):
    """As --resume does: a run is never scored on another store than the one it trained on."""
    from musketeers.run.evaluate import evaluate

    store = tmp_path / "stores"
    shutil.copytree(planted_store, store)
    run = tmp_path / "run"
    train(small(store, run, steps=1), plot=False)
    shutil.rmtree(store)
    write_planted_store(store, n_train=64, n_val=16, seed=1)
    with pytest.raises(UserError, match=f"not the one {run} trained on .*expert noise-a"):
        evaluate(run, limit=4)
    assert not (run / "eval.json").exists()


def test_resume_refuses_another_store_and_accepts_a_moved_one(planted_store, tmp_path):
    run = tmp_path / "run"
    train(small(planted_store, run), stop_after=2, plot=False)
    recorded = json.loads((run / "fingerprints.json").read_text())
    assert recorded["items"] and set(recorded["experts"]) == {"noise-a", "oracle", "noise-b"}
    other = tmp_path / "other"
    write_planted_store(other, n_train=64, n_val=16, seed=1)
    with pytest.raises(UserError, match=f"not the one {run} trained on .*expert noise-a.*"
                                        f"pass --cache-dir {planted_store}"):
        train(small(other, run), resume=True, plot=False)
    assert len(metrics(run)) == 2
    moved = tmp_path / "moved"
    shutil.copytree(planted_store, moved)
    train(small(moved, run), resume=True, plot=False)
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4]


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("name, damage", [("adapter.safetensors", _flip),
                                          ("state.safetensors", _truncate)])
def test_damaged_newest_checkpoint_falls_back_to_the_previous(planted_store, tmp_path, caplog,
                                                              full_run, name, damage):
    run = tmp_path / "run"
    train(small(planted_store, run), stop_after=3, plot=False)
    newest = ckpt.latest_checkpoint(run)
    assert newest.name == "step-000003"
    damage(newest / name)
    with caplog.at_level(logging.WARNING, logger="musketeers.train"):
        train(small(planted_store, run), resume=True, plot=False)
    assert "step-000003 is damaged" in caplog.text and "newest intact" in caplog.text
    assert name in ckpt.verify_checkpoint(run / "checkpoints" / "damaged-step-000003")
    assert (run / "checkpoints" / "damaged-step-000003").is_dir()
    assert metrics(run) == full_run  # resumed from step 2, bit for bit


def test_a_step_damaged_twice_is_set_aside_twice(planted_store, tmp_path):
    run = tmp_path / "run"
    train(small(planted_store, run), stop_after=3, plot=False)
    for _ in range(2):  # the second time, damaged-step-000003 is already there
        _flip(ckpt.latest_checkpoint(run) / "adapter.safetensors")
        train(small(planted_store, run), resume=True, stop_after=3, plot=False)
    aside = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("dam"))
    assert aside == ["damaged-step-000003", "damaged-step-000003.2"]
    assert ckpt.latest_checkpoint(run).name == "step-000003"


def test_no_intact_checkpoint_is_refused_with_the_way_out(planted_store, tmp_path):
    run = tmp_path / "run"
    train(small(planted_store, run), stop_after=2, plot=False)
    for folder in ckpt.list_checkpoints(run):
        _flip(folder / "adapter.safetensors")
    with pytest.raises(UserError, match="no intact checkpoint .*move that folder away"):
        train(small(planted_store, run), resume=True, plot=False)


def test_run_killed_before_its_first_checkpoint_restarts_in_place(planted_store, tmp_path,
                                                                  caplog, full_run):
    run = tmp_path / "run"
    cfg = small(planted_store, run, save_every=3)
    train(cfg, stop_after=1, plot=False)  # one row logged, no checkpoint yet
    assert not ckpt.list_checkpoints(run) and len(metrics(run)) == 1
    with pytest.raises(UserError, match=r"pass --resume to continue it \(from step 0"):
        train(cfg, plot=False)
    with caplog.at_level(logging.WARNING, logger="musketeers.train"):
        train(cfg, resume=True, plot=False)
    assert "restarting it from step 0" in caplog.text
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4]
    with pytest.raises(UserError, match="nothing to resume"):
        train(small(planted_store, tmp_path / "empty"), resume=True, plot=False)


def test_resume_steps_stops_the_invocation_and_keeps_the_runs_length(planted_store, tmp_path,
                                                                     full_run):
    from musketeers.cli import main as cli_main

    run = tmp_path / "run"
    train(small(planted_store, run), stop_after=1, plot=False)
    result = CliRunner().invoke(cli_main.app, ["train", "--resume", "--run-dir", str(run),
                                               "--steps", "3"])
    assert result.exit_code == 0, result.output
    assert read_run_config(run).steps == 4 and len(metrics(run)) == 3
    assert json.loads((run / "summary.json").read_text())["status"] == "partial"
    with pytest.raises(UserError, match="keeps the run's 4 steps"):  # the API refuses too
        train(replace(small(planted_store, run), steps=3), resume=True, plot=False)
    train(small(planted_store, run), resume=True, plot=False)
    assert metrics(run) == full_run


@pytest.mark.parametrize("exc", [RuntimeError("[enforce fail at inline_container.cc:595] . "
                                              "unexpected pos 128 vs 96"),
                                 OSError(28, "No space left on device"),
                                 # what safetensors raises for the LoRA and adapter files
                                 SafetensorError("Error while serializing: IoError(Os { code: "
                                                 "28, kind: StorageFull })")])
def test_disk_full_during_a_save_names_the_resume_command(planted_store, tmp_path, monkeypatch,
                                                          exc):
    run = tmp_path / "run"
    real = ckpt._write_state
    calls = {"n": 0}

    def full_disk(state, path):
        calls["n"] += 1
        if calls["n"] == 2:
            raise exc
        real(state, path)

    monkeypatch.setattr(ckpt, "_write_state", full_disk)
    with pytest.raises(UserError) as err:
        train(small(planted_store, run), plot=False)
    message = str(err.value)
    assert message.startswith("disk full or unwritable") and "\n" not in message
    assert message.endswith(f"free space and run again with --resume: musketeers train "
                            f"--run-dir {run} --resume")
    monkeypatch.setattr(ckpt, "_write_state", real)
    train(small(planted_store, run), resume=True, plot=False)  # step 1's checkpoint was intact
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4]


def test_run_dir_that_is_a_file_is_refused_before_any_model_loads(planted_store, tmp_path):
    path = tmp_path / "run"
    path.write_text("not a folder")

    def no_policy(cfg):
        raise AssertionError("the policy was built before the run folder was checked")

    with pytest.raises(UserError, match="is a file; pass a folder with --run-dir"):
        train(small(planted_store, path), policy_factory=no_policy)


def test_cuda_rng_states_are_saved_and_restored(monkeypatch, tmp_path):
    """Hard routing draws on the adapter's device: the CUDA states go into the checkpoint
    (a mock CUDA RNG interface here: the machine has no GPU)."""
    from musketeers.run.state_file import read_state, write_state

    states = [torch.tensor([1, 2, 3], dtype=torch.uint8), torch.tensor([4], dtype=torch.uint8)]
    restored = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in states])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    generator = torch.Generator().manual_seed(0)
    write_state(ckpt.capture_rng(generator), tmp_path)
    ckpt.restore_rng(read_state(tmp_path), generator)
    assert len(restored) == 1 and all(torch.equal(a, b) for a, b in zip(restored[0], states,
                                                                        strict=True))
    # a CPU run never initialises CUDA, saves None, and its checkpoints restore nothing there
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    state = ckpt.capture_rng(generator)
    assert state["cuda"] is None
    ckpt.restore_rng(state, generator)
    del state["cuda"]  # a checkpoint from before CUDA states were saved
    ckpt.restore_rng(state, generator)
    assert len(restored) == 1


def test_a_grid_retrains_a_run_killed_before_its_first_checkpoint(planted_store, tmp_path):
    from musketeers.grid.run import _default_train_fn

    cfg = small(planted_store, tmp_path / "run", save_every=3)
    train(cfg, stop_after=1, plot=False)  # config.yaml and one row, no checkpoint
    _default_train_fn(cfg)
    assert [r["step"] for r in metrics(cfg.run_path())] == [1, 2, 3, 4]
