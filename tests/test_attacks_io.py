"""What the tool reads and writes as attack surfaces: no file it reads runs code (checkpoints,
expert folders), nothing it writes leaves the folders it was given, and published reports
carry neither linked files nor terminal control sequences. Each attack that once worked."""

from __future__ import annotations

import json
import os
import pickle
import struct
from pathlib import Path

import pytest
import yaml

from musketeers.cache.errors import UserError
from musketeers.run import checkpoint as ckpt

pytestmark = pytest.mark.usefixtures("one_thread")


class _Payload:
    """A pickle that, when loaded, writes a marker file: code run by reading a file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "pwned"))


def _small(store: Path, run: Path, steps: int = 3):
    from musketeers.checks.planted import planted_config

    return planted_config("perceiver", 0, steps, store, run, prompts_per_micro=2, group_size=2,
                          grad_accum=1, save_every=1, inner_iters=1, threads=1)


def _resign_unkeyed(folder: Path) -> None:
    """What an attacker can do: recompute every file's sum (no key, so no valid signature)."""
    from musketeers.cache.experts import file_sha256

    sums = {f.relative_to(folder).as_posix(): file_sha256(f) for f in ckpt._files(folder)}
    (folder / ckpt.MANIFEST).write_text(json.dumps({"files": sums, "hmac": "0" * 64}))


@pytest.fixture(scope="module")
def trained(planted_store, tmp_path_factory) -> Path:
    """A 2-step run with checkpoints at steps 1 and 2 (copied by each test that edits it)."""
    from musketeers.run.trainer import train

    run = tmp_path_factory.mktemp("trained") / "run"
    train(_small(planted_store, run), stop_after=2, plot=False)
    return run


@pytest.fixture
def run(trained, tmp_path) -> Path:
    import shutil

    dest = tmp_path / "run"
    shutil.copytree(trained, dest)
    cfg = yaml.safe_load((dest / "config.yaml").read_text())
    cfg["run_dir"] = str(dest)
    (dest / "config.yaml").write_text(yaml.safe_dump(cfg))
    return dest


def _resume(store: Path, run: Path, **kw):
    from musketeers.run.trainer import train

    return train(_small(store, run), resume=True, plot=False, **kw)


# --- checkpoints: nothing read runs code --------------------------------------------------

def test_a_pickled_state_with_recomputed_sums_never_runs(planted_store, run, tmp_path):
    marker = tmp_path / "marker"
    for folder in ckpt.list_checkpoints(run):
        (folder / "state.pt").write_bytes(pickle.dumps(_Payload(marker)))
        _resign_unkeyed(folder)
    with pytest.raises(UserError) as err:
        _resume(planted_store, run)
    assert not marker.exists()
    assert "state.pt is a pickle" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UserError):  # not even when the user asks to skip the signature
        _resume(planted_store, run, unverified=True)
    assert not marker.exists()


def test_a_replaced_file_with_recomputed_sums_is_not_loaded(planted_store, run):
    newest = ckpt.latest_checkpoint(run)
    data = bytearray((newest / "adapter.safetensors").read_bytes())
    data[-1] ^= 0x01  # another weight, of the same shape
    (newest / "adapter.safetensors").write_bytes(bytes(data))
    _resign_unkeyed(newest)
    assert "not signed with your key" in ckpt.verify_checkpoint(newest)
    import shutil

    for folder in ckpt.list_checkpoints(run)[:-1]:
        shutil.rmtree(folder)
    with pytest.raises(UserError, match="not signed with your key.*--resume-unverified"):
        _resume(planted_store, run)


def test_a_checkpoint_without_manifest_loads_only_when_asked(planted_store, run, caplog):
    import logging

    for folder in ckpt.list_checkpoints(run):
        (folder / ckpt.MANIFEST).unlink()
    with pytest.raises(UserError, match=r"no manifest.json; .*pass --resume-unverified"):
        _resume(planted_store, run)
    with caplog.at_level(logging.WARNING, logger="musketeers.train"):
        summary = _resume(planted_store, run, unverified=True)
    assert "loading it unverified" in caplog.text
    assert summary["steps"] == 3  # resumed from step 2, not restarted


def test_the_damaged_newest_falls_back_with_a_warning_not_silently(planted_store, run, caplog):
    import logging

    newest = ckpt.latest_checkpoint(run)
    (newest / ckpt.MANIFEST).unlink()
    with caplog.at_level(logging.WARNING, logger="musketeers.train"):
        _resume(planted_store, run)
    assert "step-000002 is damaged" in caplog.text and "newest intact" in caplog.text
    assert (run / "checkpoints" / "damaged-step-000002").is_dir()


def _oversized_header(path: Path) -> None:
    path.write_bytes(struct.pack("<Q", 2**40) + b"{}")


def _incomplete_metadata(path: Path) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [2]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)


def _wrong_shapes(path: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    state = load_file(str(path))
    save_file({k: torch.zeros(*v.shape, 2) for k, v in state.items()}, str(path))


@pytest.mark.parametrize("damage", [_oversized_header, _incomplete_metadata, _wrong_shapes])
def test_a_malformed_adapter_is_one_line_on_resume_and_eval(planted_store, run, damage):
    """Even from a checkpoint the user vouches for (re-signed here with the key), a malformed
    or wrong-shaped adapter is named in one line, by resume and by eval alike."""
    import shutil

    from musketeers.run.evaluate import evaluate

    for folder in ckpt.list_checkpoints(run)[:-1]:
        shutil.rmtree(folder)
    newest = ckpt.latest_checkpoint(run)
    damage(newest / "adapter.safetensors")
    ckpt.write_manifest(newest)
    with pytest.raises(UserError) as err:
        evaluate(run, limit=2)
    assert "adapter.safetensors" in str(err.value)
    assert "\n" not in str(err.value) and "--resume" in str(err.value)
    with pytest.raises(UserError, match="no intact checkpoint.*adapter.safetensors") as err:
        _resume(planted_store, run)
    assert "\n" not in str(err.value)


def test_the_manifest_key_is_private_and_kept_outside_runs(tmp_path, monkeypatch):
    from musketeers.run import signing

    key = tmp_path / "conf" / "manifest.key"
    monkeypatch.setenv(signing.ENV, str(key))
    mac = signing.sign({"a": "1"})
    assert key.stat().st_mode & 0o777 == 0o600
    assert signing.signed({"a": "1"}, mac) and not signing.signed({"a": "2"}, mac)
    monkeypatch.setenv(signing.ENV, str(tmp_path / "other.key"))
    assert not signing.signed({"a": "1"}, mac)  # another user's key


# --- expert folders -------------------------------------------------------------------------

def test_an_expert_folder_with_pickled_weights_is_refused(tmp_path):
    from musketeers.cache.experts import ExpertSpec, check_expert

    folder = tmp_path / "expert"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    marker = tmp_path / "marker"
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(UserError, match="pytorch_model.bin is a pickled weights file") as err:
        check_expert(ExpertSpec("x", "dir", str(folder)))
    assert "safetensors" in str(err.value) and not marker.exists()


# --- names that become paths ----------------------------------------------------------------

def _grid(tmp_path: Path, **top) -> Path:
    path = tmp_path / "g.yaml"
    runs = top.pop("runs", [{"task": "arithmetic", "method": "single"}])
    path.write_text(yaml.safe_dump({"budget": "t", "seeds": [0], "runs": runs, **top}))
    return path


@pytest.mark.parametrize("top", [{"name": "../../escape"}, {"name": ".hidden"},
                                 {"runs": [{"task": "arithmetic", "method": "perceiver",
                                            "team": "default",
                                            "pooling": "../../../escape"}]},
                                 {"runs": [{"task": "arithmetic", "method": "perceiver",
                                            "team": "a/../../b"}]},
                                 {"budget": "../up"}])
def test_a_grid_name_or_value_with_path_segments_is_refused_before_any_write(tmp_path, top,
                                                                             monkeypatch):
    from musketeers.design.gridspec import load_grid

    monkeypatch.chdir(tmp_path)
    path = _grid(tmp_path, **top)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(UserError, match="cannot name a folder") as err:
        load_grid(path)
    assert "\n" not in str(err.value)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("field,value", [("pooling", "../../x"), ("team", "../t"),
                                         ("task", "../../x")])
def test_a_default_run_folder_never_leaves_runs(field, value):
    from musketeers.config import TrainConfig

    with pytest.raises(UserError, match="cannot name a folder"):
        TrainConfig(**{"task": "arithmetic", field: value}).run_path()


def test_a_run_folder_symlinked_out_of_runs_dir_is_refused(tmp_path):
    from musketeers.design.gridspec import load_grid
    from musketeers.grid.fake import fake_evaluate, fake_train
    from musketeers.grid.run import run_grid

    grid = load_grid(_grid(tmp_path))
    runs, outside = tmp_path / "runs", tmp_path / "outside"
    runs.mkdir()
    outside.mkdir()
    (runs / grid.runs[0].name).symlink_to(outside)
    with pytest.raises(UserError, match="lies outside"):
        run_grid(grid, runs, train_fn=lambda cfg: fake_train(cfg), eval_fn=fake_evaluate,
                 config_fn=lambda fields: fields)
    assert list(outside.iterdir()) == []


# --- --run-dir ------------------------------------------------------------------------------

def test_run_dir_refuses_the_working_folder_foreign_files_and_stores(tmp_path, monkeypatch):
    from musketeers.run.runfolder import check_run_dir

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with pytest.raises(UserError, match="is the working folder"):
        check_run_dir(Path("."))
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "summary.json").write_text("precious")
    with pytest.raises(UserError, match="holds files and no run"):
        check_run_dir(foreign)
    store = tmp_path / "stores" / "arithmetic.zarr"
    store.mkdir(parents=True)
    (store / "zarr.json").write_text("{}")
    with pytest.raises(UserError, match="inside the store"):
        check_run_dir(store / "train" / "new")
    check_run_dir(tmp_path / "fresh")  # a new folder is a run folder
    (tmp_path / "empty").mkdir()
    check_run_dir(tmp_path / "empty")
    assert (foreign / "summary.json").read_text() == "precious"


# --- publishing -----------------------------------------------------------------------------

def test_a_hard_linked_artefact_is_not_published(tmp_path):
    from musketeers.grid.publish import publish_run

    secret = tmp_path / "secret.txt"
    secret.write_text("private key material")
    src, dest = tmp_path / "run", tmp_path / "published"
    src.mkdir()
    (src / "config.yaml").write_text("seed: 0\n")
    os.link(secret, src / "error.txt")
    publish_run(src, dest)
    assert (dest / "config.yaml").is_file() and not (dest / "error.txt").exists()


def test_a_published_run_folder_replaced_by_a_symlink_is_one_line(tmp_path):
    from musketeers.grid.publish import publish_run

    src, published, elsewhere = tmp_path / "run", tmp_path / "published", tmp_path / "else"
    src.mkdir()
    (src / "config.yaml").write_text("seed: 0\n")
    published.mkdir()
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("kept")
    (published / "run").symlink_to(elsewhere)
    with pytest.raises(UserError, match="is a symlink, not a run folder") as err:
        publish_run(src, published / "run")
    assert "\n" not in str(err.value) and (elsewhere / "keep.txt").read_text() == "kept"


# --- control sequences ----------------------------------------------------------------------

def test_terminal_control_sequences_never_reach_the_report(tmp_path):
    from musketeers.design.gridspec import load_grid
    from musketeers.grid.fake import fake_evaluate, fake_train
    from musketeers.grid.run import run_grid
    from musketeers.reports.report import write_report

    grid = load_grid(_grid(tmp_path))
    runs = tmp_path / "runs"
    run_grid(grid, runs, train_fn=fake_train, eval_fn=fake_evaluate,
             config_fn=lambda fields: fields)
    run = runs / grid.runs[0].name
    (run / "summary.json").unlink()
    (run / "error.txt").write_text("boom \x1b]0;owned\x07\x1b[2J\u202e gnp.exe\n")
    readme = write_report(grid, runs, tmp_path / "reports").read_text()
    assert "boom" in readme
    assert not any(c in readme for c in "\x1b\x07\u202e")
    assert "\\x1b" in readme


def test_error_lines_escape_control_characters():
    import subprocess
    import sys

    code = ("from musketeers.cache.errors import UserError\n"
            "import musketeers.cli.main as m\n"
            "def boom():\n    raise UserError('bad name \\x1b[31mred')\n"
            "m.app = boom\nm.main()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 2 and "\x1b" not in out.stderr and "\\x1b[31mred" in out.stderr


def test_a_value_the_config_refuses_stops_the_grid_before_any_write(tmp_path):
    from musketeers.config import resolve_config
    from musketeers.design.gridspec import load_grid
    from musketeers.grid.fake import fake_evaluate, fake_train
    from musketeers.grid.run import run_grid

    grid = load_grid(_grid(tmp_path, runs=[{"task": "arithmetic", "method": "perceiver",
                                            "team": "default", "pooling": "nowhere"}]))
    runs = tmp_path / "runs"
    with pytest.raises(UserError, match="unknown pooling 'nowhere'"):
        run_grid(grid, runs, train_fn=fake_train, eval_fn=fake_evaluate,
                 config_fn=lambda fields: resolve_config(overrides=fields))
    assert not runs.exists() or list(runs.rglob("*")) == []


def test_resume_unverified_is_a_train_option_that_resumes(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from musketeers.cli import main as cli_main
    from musketeers.config import resolve_config, save_config

    run = tmp_path / "r"
    run.mkdir()
    save_config(resolve_config(None, {"method": "perceiver", "run_dir": str(run)}),
                run / "config.yaml")
    calls = []
    monkeypatch.setattr("musketeers.run.trainer.train",
                        lambda cfg, **kw: calls.append(kw) or {})
    result = CliRunner().invoke(cli_main.app, ["train", "--resume-unverified", "--run-dir",
                                               str(run)])
    assert result.exit_code == 0, result.output
    assert calls == [{"resume": True, "stop_after": None, "unverified": True}]
