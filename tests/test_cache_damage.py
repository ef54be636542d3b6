"""Damaged store metadata and lost chunk files: reported by ``cache verify`` in one line each,
refused by the reader with the precompute command that repairs it, repaired by that command."""

from __future__ import annotations

import json
import re
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import make_items, tiny_specs

from musketeers.cache import reader
from musketeers.cache import store as st
from musketeers.cache.damage import Check, read_check
from musketeers.cache.errors import UserError
from musketeers.cache.precompute import PrecomputeConfig, precompute_task
from musketeers.cache.verify import verify_store
from musketeers.cli import main as cli_main

CFG = PrecomputeConfig(chunk_rows=4, router=False)
EXPERT = "train/experts/tiny-gpt2"


def junk(path: Path) -> None:
    path.write_text("{not json")


def kill_while_creating(store: Path) -> None:
    """The group as ``prepare_group`` leaves it when killed before its arrays exist."""
    g = store / EXPERT
    shutil.rmtree(g)
    g.mkdir()
    (g / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": '
                                 '{"complete": false, "fingerprint": null}}')


def empty_folder(store: Path) -> None:
    shutil.rmtree(store)
    store.mkdir()


def lose_flag_and_chunk(store: Path) -> None:
    """A chunk deleted together with its done flag, in a unit still marked complete."""
    (store / EXPERT / "done/c/1").unlink()
    (store / EXPERT / "last/c/1/0").unlink()


def halve_rows(store: Path) -> None:
    meta = store / EXPERT / "last/zarr.json"
    spec = json.loads(meta.read_text())
    spec["shape"][0] //= 2
    meta.write_text(json.dumps(spec))


# (damage, whether repairing needs --force, what verify says)
DAMAGES = {
    "lost chunk": (lambda s: (s / EXPERT / "last/c/1/0").unlink(), False,
                   f"{EXPERT}/last: missing chunk 1, rows 4:8"),
    "lost array": (lambda s: shutil.rmtree(s / EXPERT / "last"), False,
                   f"{EXPERT}: missing array last"),
    "corrupt array zarr.json": (lambda s: junk(s / EXPERT / "last/zarr.json"), False,
                                f"{EXPERT}: array last has unreadable metadata"),
    "corrupt group zarr.json": (lambda s: junk(s / EXPERT / "zarr.json"), False,
                                f"{EXPERT}: unreadable metadata"),
    "group killed while created": (kill_while_creating, False,
                                   f"{EXPERT}: unfinished (killed while being created)"),
    "corrupt items array": (lambda s: junk(s / "train/items/question/zarr.json"), False,
                            "train/items: array question has unreadable metadata"),
    "corrupt split zarr.json": (lambda s: junk(s / "train/zarr.json"), False,
                                "train: unreadable metadata"),
    "corrupt root zarr.json": (lambda s: junk(s / "zarr.json"), True, "not a readable store"),
    "empty store folder": (empty_folder, False, "empty store folder"),
    "flag lost with its chunk": (lose_flag_and_chunk, False,
                                 f"{EXPERT}: marked complete but chunks [1] are not done"),
    "rows edited 10 -> 5": (halve_rows, False,
                            f"{EXPERT}: array last has shape (5, 48), expected (10, 48)"),
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    cache_dir = tmp_path_factory.mktemp("pristine")
    precompute_task(cache_dir, "toy", {}, {"train": make_items(10)}, [tiny_specs()[1]], CFG)
    return cache_dir


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["musketeers", *args])
    with pytest.raises(SystemExit) as exc:
        cli_main.main()
    out = capsys.readouterr()
    return exc.value.code, out.out + out.err


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damage_reported_refused_repaired(damage, pristine, tmp_path, monkeypatch, capsys):
    cache_dir = tmp_path / "stores"
    shutil.copytree(pristine, cache_dir)
    path = st.store_path(cache_dir, "toy")
    want = reader.read_vectors(cache_dir, "toy", "train", ["tiny-gpt2"], "last")[0]
    hurt, needs_force, says = DAMAGES[damage]
    hurt(path)

    problems = [str(p) for p in verify_store(path)]
    assert len(problems) == 1 and says in problems[0] and "\n" not in problems[0], problems
    code, out = run_cli(monkeypatch, capsys, "cache", "verify", "toy", "--cache-dir",
                        str(cache_dir))
    assert code == 1 and "Traceback" not in out and "repair: musketeers precompute" in out
    code, out = run_cli(monkeypatch, capsys, "cache", "info", "toy", "--cache-dir",
                        str(cache_dir))
    assert code == 0 and "Traceback" not in out

    with pytest.raises(UserError) as err:  # what training reads, items included
        reader.read_vectors(cache_dir, "toy", "train", ["tiny-gpt2"], "last")
        reader.read_items(cache_dir, "toy", "train")
    message = str(err.value)
    fix = f"musketeers precompute --task toy --experts tiny-gpt2 --cache-dir {cache_dir}"
    assert "\n" not in message and fix in message
    # The item count it was built with, so a repair never builds the task's full item set.
    assert ("--limit 10" in message) == (damage != "empty store folder")
    assert message.endswith("--force") == needs_force

    if needs_force:
        with pytest.raises(UserError, match=re.escape("--force")):
            precompute_task(cache_dir, "toy", {}, {"train": make_items(10)}, [tiny_specs()[1]],
                            CFG)
    cfg = PrecomputeConfig(chunk_rows=4, router=False, force=needs_force)
    precompute_task(cache_dir, "toy", {}, {"train": make_items(10)}, [tiny_specs()[1]], cfg)
    assert verify_store(path) == []
    np.testing.assert_array_equal(
        reader.read_vectors(cache_dir, "toy", "train", ["tiny-gpt2"], "last")[0], want)
    assert len(reader.read_items(cache_dir, "toy", "train")) == 10


def test_lost_chunk_recomputes_only_that_chunk(pristine, tmp_path):
    cache_dir = tmp_path / "stores"
    shutil.copytree(pristine, cache_dir)
    path = st.store_path(cache_dir, "toy")
    (path / EXPERT / "n_tokens/c/2").unlink()
    other = path / EXPERT / "last/c/0/0"
    mtime = other.stat().st_mtime_ns
    assert [str(p) for p in verify_store(path)] == [
        f"{EXPERT}/n_tokens: missing chunk 2, rows 8:10"]
    precompute_task(cache_dir, "toy", {}, {"train": make_items(10)}, [tiny_specs()[1]], CFG)
    assert verify_store(path) == [] and other.stat().st_mtime_ns == mtime


def test_a_chunk_swapped_for_another_valid_one_is_found_and_recomputed(pristine, tmp_path):
    cache_dir = tmp_path / "stores"
    shutil.copytree(pristine, cache_dir)
    path = st.store_path(cache_dir, "toy")
    want = reader.read_vectors(cache_dir, "toy", "train", ["tiny-gpt2"], "last")[0]
    a, b = path / EXPERT / "last/c/0/0", path / EXPERT / "last/c/1/0"
    first = a.read_bytes()
    a.write_bytes(b.read_bytes())  # a valid chunk file (its crc holds) with other rows
    b.write_bytes(first)
    assert sorted(str(p) for p in verify_store(path)) == [
        f"{EXPERT}: chunk {c} differs from the digest recorded when it was built (swapped or "
        "edited)" for c in (0, 1)]
    precompute_task(cache_dir, "toy", {}, {"train": make_items(10)}, [tiny_specs()[1]], CFG)
    assert verify_store(path) == []
    np.testing.assert_array_equal(
        reader.read_vectors(cache_dir, "toy", "train", ["tiny-gpt2"], "last")[0], want)


def test_read_check_finds_lost_chunks_swapped_chunks_and_no_digests(pristine, tmp_path):
    """A reader's one pass over a unit: a whole unit passes with its 3 chunk digests compared
    (10 rows in chunks of 4); a swapped chunk, a unit without digests, a lost chunk file each
    found (``structure=False``: a hints unit, its expert checked already, digests only)."""
    path = st.store_path(shutil.copytree(pristine, tmp_path / "stores"), "toy")

    def check(structure: bool = True) -> Check:
        return read_check(zarr.open_group(path, mode="r")[EXPERT], structure=structure)

    assert check() == Check(None, 3, True)
    a, b = path / EXPERT / "last/c/0/0", path / EXPERT / "last/c/1/0"
    first = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(first)
    assert check().damage == ("chunks [0, 1] differ from the digests recorded when it was "
                              "built: swapped or edited")
    b.write_bytes(a.read_bytes())
    a.write_bytes(first)
    assert check(structure=False) == Check(None, 3, True)
    meta = path / EXPERT / "zarr.json"
    spec = json.loads(meta.read_text())
    del spec["attributes"]["sha256"]
    meta.write_text(json.dumps(spec))
    assert check() == Check(None, 3, False)
    (path / EXPERT / "n_tokens/c/2").unlink()
    assert check().damage == "array n_tokens lost chunk 2"


def test_stray_partial_file_is_cleaned_by_precompute(pristine, tmp_path):
    """A killed zarr write leaves ``zarr.<uuid>.partial``; precompute removes it."""
    cache_dir = tmp_path / "stores"
    shutil.copytree(pristine, cache_dir)
    path = st.store_path(cache_dir, "toy")
    stray = path / EXPERT / f"zarr.{'ab' * 16}.partial"
    stray.write_text("{")
    assert any("partial" in str(p) for p in verify_store(path))
    precompute_task(cache_dir, "toy", {}, {"train": make_items(10)}, [tiny_specs()[1]], CFG)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # zarr warns about the stray file on every listing
        assert not stray.exists() and verify_store(path) == []


def test_the_repair_command_works_when_pasted(pristine, tmp_path, monkeypatch, capsys):
    """Built with --chunk-rows 4 in a folder with a space: the printed command, pasted, carries
    both and repairs the store (without them it was refused as built from other inputs)."""
    import shlex

    cache_dir = tmp_path / "my stores"
    shutil.copytree(pristine, cache_dir)
    path = st.store_path(cache_dir, "toy")
    (path / EXPERT / "last/c/1/0").unlink()
    with pytest.raises(UserError) as err:
        reader.read_vectors(cache_dir, "toy", "train", ["tiny-gpt2"], "last")
    verify, fix = re.search(r"run `(.*)` then: (.*)$", str(err.value)).groups()
    code, out = run_cli(monkeypatch, capsys, *shlex.split(verify)[1:])
    assert code == 1 and "missing chunk 1" in out
    args = shlex.split(fix)
    assert args[args.index("--cache-dir") + 1] == str(cache_dir)
    assert "--chunk-rows" in args and "--dtype" in args
    from musketeers.run import features

    def same_items(task, **kw):  # "toy" is no packaged task: its items are the test's
        from musketeers.cache.experts import TINY_EXPERTS
        from musketeers.cache.precompute import PrecomputeConfig

        cfg = PrecomputeConfig(chunk_rows=kw["chunk_rows"], batch_tokens=kw["batch_tokens"],
                               router=False)
        assert kw["cache_dir"] == cache_dir and kw["limit"] == 10
        precompute_task(kw["cache_dir"], task, {}, {"train": make_items(10)},
                        [s for s in TINY_EXPERTS if s.name in kw["experts"]], cfg)

    monkeypatch.setattr(features, "precompute_features", same_items)
    from musketeers.tasks import admission

    # "toy" is no task of the registry: nothing to expand, no scorer to admit
    monkeypatch.setattr(features, "expand_tasks", lambda task: [task])
    monkeypatch.setattr(admission, "admit", lambda task, allow=False: [])
    code, out = run_cli(monkeypatch, capsys, *args[1:])
    assert code in (0, None), out
    assert verify_store(path) == []
