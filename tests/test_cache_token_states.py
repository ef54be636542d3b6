"""Token channels in the store: ``precompute --token-states`` keeps every prompt token's hidden
state (and with ``--hints`` every answer token's) at chosen layers, equal to a live forward of
the model, resumable, checked by ``cache verify`` and the reader, shown by ``cache info``; hints
carry their scores, and ``cache info`` each expert's own accuracy."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from conftest import make_items, tiny_specs
from typer.testing import CliRunner

from musketeers.cache import from_memory, layout, reader, token_layout
from musketeers.cache import precompute as pc
from musketeers.cache import store as st
from musketeers.cache.errors import UserError
from musketeers.cache.experts import load_expert
from musketeers.cache.items import items_fingerprint
from musketeers.cache.precompute import PrecomputeConfig, precompute_task
from musketeers.cache.prompts import render_prompt
from musketeers.cache.verify import inspect_store
from musketeers.cli.precompute import human_size

TASK = "toy"
SPEC = tiny_specs()[0]  # tiny-llama: 2 layers, d 64
HINT_TOKENS = 5


def scorer(item, hint: str) -> float:
    """A deterministic stand-in for a task's reward: depends on the item and the hint."""
    return float((len(hint) + int(item.answer)) % 3 == 0)


def config(**kw) -> PrecomputeConfig:
    # batch_tokens 64: prompts of ~50 tokens run one at a time, as a live single forward does
    base = dict(chunk_rows=4, batch_tokens=64, router=False, token_layers=(1,),
                hint_tokens=HINT_TOKENS)
    return PrecomputeConfig(**{**base, **kw})


def build(cache_dir: Path, items: list, **kw) -> Path:
    return precompute_task(cache_dir, TASK, {"t": 1}, {"train": items}, [SPEC], config(**kw))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, list]:
    """One store of 7 items (2 row chunks) with prompt and answer states at layers 1 and -1
    (= 2), and scored hints; tests that damage it work on a copy."""
    cache = tmp_path_factory.mktemp("tokens") / "stores"
    cache.mkdir()
    items = make_items(7)
    build(cache, items, hints=True, token_layers=(1, -1), scorer=scorer)
    return cache, items


def copy_of(built, tmp_path: Path) -> Path:
    shutil.copytree(built[0], tmp_path / "stores")
    return tmp_path / "stores"


def unit(cache: Path, channel: str = "tokens", layer: int = 1) -> zarr.Group:
    g = zarr.open_group(st.store_path(cache, TASK), mode="r+")[f"train/experts/{SPEC.name}"]
    return token_layout.token_unit(g, channel, layer)


def test_prompt_token_states_equal_a_live_forward_at_that_layer(built):
    cache, items = built
    model, tok = load_expert(SPEC, "cpu", torch.float32)
    for layer, asked in ((1, 1), (2, -1)):
        rows = reader.read_token_rows(cache, TASK, "train", [SPEC.name], "tokens", asked)[0]
        assert len(rows) == len(items) and rows.dim == 64
        got = rows.rows(range(len(items)))
        for i, item in enumerate(items):
            ids = torch.tensor([render_prompt(tok, item)])
            with torch.no_grad():
                want = model(ids, output_hidden_states=True).hidden_states[layer][0].numpy()
            assert got[i].shape == want.shape, f"row {i}: one state per prompt token"
            np.testing.assert_allclose(got[i], want, atol=2e-5, rtol=1e-4,
                                       err_msg=f"layer {layer} row {i}")


def test_answer_states_are_one_per_generated_token_and_equal_a_live_forward(built):
    cache, items = built
    model, tok = load_expert(SPEC, "cpu", torch.float32)
    rows = reader.read_token_rows(cache, TASK, "train", [SPEC.name], "answer", 1)[0]
    hints = reader.read_hints(cache, TASK, "train", [SPEC.name])
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    for i, item in enumerate(items):
        prompt = render_prompt(tok, item)
        ids = torch.tensor([prompt])
        with torch.no_grad():
            new = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=HINT_TOKENS,
                                 pad_token_id=tok.pad_token_id)[0, len(prompt):].tolist()
        n = next((j + 1 for j, t in enumerate(new) if t in eos), len(new))
        assert tok.decode(new, skip_special_tokens=True) == hints[i][0]  # the same answer
        assert rows.lengths()[i] == n, f"row {i}: one state per generated token"
        # the state that produced answer token j sits at the position before it
        full = torch.tensor([prompt + new[:n]])
        with torch.no_grad():
            hs = model(full, output_hidden_states=True).hidden_states[1][0].numpy()
        want = hs[len(prompt) - 1:len(prompt) - 1 + n]
        np.testing.assert_allclose(rows.rows([i])[0], want, atol=1e-4, rtol=1e-3)


def test_hint_scores_are_recorded_and_info_prints_each_experts_accuracy(built):
    cache, items = built
    g = zarr.open_group(st.store_path(cache, TASK), mode="r")[f"train/experts/{SPEC.name}"]
    hints = [h[0] for h in reader.read_hints(cache, TASK, "train", [SPEC.name])]
    scores = g[layout.HINT_SCORES][:]
    assert scores.tolist() == [scorer(it, h) for it, h in zip(items, hints, strict=True)]
    assert 0 < scores.mean() < 1  # a mixed split, so the printed figure is not a default
    out = info(cache)
    assert f"{100 * scores.mean():.1f}%" in out


def info(cache: Path) -> str:
    from musketeers.cli.main import app

    result = CliRunner().invoke(app, ["cache", "info", TASK, "--cache-dir", str(cache)],
                                terminal_width=240)
    assert result.exit_code == 0, result.output
    return result.output


def test_info_shows_each_token_unit_with_its_size_on_disk(built):
    cache, _ = built
    out = info(cache)
    path = st.store_path(cache, TASK) / "train/experts" / SPEC.name / "tokens/L1"
    line = next(r for r in out.splitlines() if "tokens" in r and "│ 1 " in r)
    assert human_size(st.disk_size(path)) in line
    assert str(int(unit(cache).__getitem__("lengths")[:].sum())) in line
    assert sum("answer" in r for r in out.splitlines()) == 2  # layers 1 and 2


def test_verify_finds_a_changed_token_chunk_and_the_reader_refuses_it(built, tmp_path):
    cache = copy_of(built, tmp_path)
    path = st.store_path(cache, TASK)
    assert inspect_store(path) == ([], [])
    u = unit(cache)
    flat = u["flat"]["1"]
    flat[:] = flat[:] * 2  # a valid chunk (its crc holds), other values
    problems, _ = inspect_store(path)
    assert [p.where for p in problems] == [f"{u.path}/flat/1"]
    assert "swapped or edited" in problems[0].message
    with pytest.raises(UserError, match="damaged.*cache verify") as err:
        reader.read_token_rows(cache, TASK, "train", [SPEC.name], "tokens", 1)
    assert "\n" not in str(err.value)
    # the other layer's unit is sound and still read
    assert reader.read_token_rows(cache, TASK, "train", [SPEC.name], "tokens", 2)


def test_a_lost_token_chunk_is_recomputed_by_the_next_precompute(built, tmp_path):
    cache = copy_of(built, tmp_path)
    want = unit(cache)["flat"]["0"][:]
    shutil.rmtree(st.store_path(cache, TASK) / f"{unit(cache).path}/flat/0")
    assert any("missing chunk 0" in p.message for p in inspect_store(st.store_path(cache, TASK))[0])
    build(cache, built[1], hints=True, token_layers=(1, -1), scorer=scorer)
    np.testing.assert_array_equal(unit(cache)["flat"]["0"][:], want)
    assert inspect_store(st.store_path(cache, TASK)) == ([], [])


def test_a_store_without_the_channel_names_the_command_that_adds_it(tmp_path):
    cache = tmp_path / "stores"
    items = make_items(5)
    sg = st.open_root(st.store_path(cache, TASK), TASK, {}, force=True).require_group("train")
    layout.write_items(sg, items, items_fingerprint(items), 4)
    from_memory.write_expert(sg, "e", {"last": np.ones((5, 3), np.float32)}, fingerprint={"e": 1},
                             n_layers=2, d=3, dtype="float32", chunk_rows=4)
    assert reader.read_vectors(cache, TASK, "train", ["e"], "last")[0].shape == (5, 3)
    with pytest.raises(UserError) as err:
        reader.read_token_rows(cache, TASK, "train", ["e"], "tokens", 12)
    msg = str(err.value)
    assert "\n" not in msg and "channel 'tokens'" in msg
    assert f"run: musketeers precompute --task {TASK} --experts e --cache-dir {cache}" in msg
    assert msg.endswith("--token-states=12")
    with pytest.raises(UserError, match=r"--token-states=-1 --hints$"):
        reader.read_token_rows(cache, TASK, "train", ["e"], "answer", -1)


def test_states_written_from_memory_read_back_lazily(tmp_path):
    cache = tmp_path / "stores"
    items = make_items(6)
    sg = st.open_root(st.store_path(cache, TASK), TASK, {}, force=True).require_group("train")
    layout.write_items(sg, items, items_fingerprint(items), 4)
    rng = np.random.default_rng(0)
    rows = [rng.normal(size=(t, 3)).astype(np.float32) for t in (2, 5, 1, 3, 4, 2)]
    from_memory.write_expert(sg, "e", {"last": np.ones((6, 3), np.float32)}, fingerprint={"e": 1},
                             n_layers=2, d=3, dtype="float32", chunk_rows=4,
                             token_states={("tokens", 2): rows})
    got = reader.read_token_rows(cache, TASK, "train", ["e"], "tokens", -1)[0]
    assert got.lengths().tolist() == [2, 5, 1, 3, 4, 2]
    for i in (5, 0, 3):  # rows of both chunks
        np.testing.assert_array_equal(got.rows([i])[0], rows[i])
    states, mask = got.padded([1, 4])
    np.testing.assert_array_equal(states[1, :4], rows[4])
    assert mask.sum(axis=1).tolist() == [5, 4]
    assert inspect_store(st.store_path(cache, TASK)) == ([], [])


def test_bfloat16_states_are_stored_as_bfloat16(tmp_path):
    u = zarr.open_group(tmp_path / "s.zarr", mode="w").require_group("e")
    u = token_layout.create_token_unit(u, "tokens", 1, 2, 4, "bfloat16", 4, {"f": 1})
    x = [np.array([[1.0, -2.5, 3.140625, 1e-3]], np.float32), np.zeros((0, 4), np.float32)]
    token_layout.write_chunk(u, 0, x)
    assert u["flat"]["0"].dtype == np.uint16  # two bytes per value
    got = token_layout.token_rows(u).rows([0, 1])
    want = torch.tensor(x[0]).bfloat16().float().numpy()
    np.testing.assert_array_equal(got[0], want)
    assert got[1].shape == (0, 4)


def test_token_states_resume_after_a_kill_without_recomputing_finished_chunks(tmp_path,
                                                                              monkeypatch):
    items = make_items(10)  # 3 row chunks
    whole = tmp_path / "whole"
    whole.mkdir()
    build(whole, items)
    killed = tmp_path / "killed"
    killed.mkdir()
    real, calls = pc.compute_rows, []

    def dies_on_third_chunk(*args, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the process killed mid-run
        return real(*args, **kw)

    monkeypatch.setattr(pc, "compute_rows", dies_on_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        build(killed, items)
    assert layout.done_flags(unit(killed)).tolist() == [1, 1, 0]
    assert not token_layout.is_complete(unit(killed))
    calls.clear()
    monkeypatch.setattr(pc, "compute_rows", lambda *a, **kw: (calls.append(1), real(*a, **kw))[1])
    build(killed, items)
    assert len(calls) == 1  # only the unfinished chunk
    a, b = unit(whole), unit(killed)
    assert a.attrs["sha256"] == b.attrs["sha256"] and token_layout.is_complete(b)
    for c in range(3):
        np.testing.assert_array_equal(a["flat"][str(c)][:], b["flat"][str(c)][:])


def test_token_states_added_to_a_complete_store_keep_its_pooled_chunks(tmp_path):
    cache = tmp_path / "stores"
    cache.mkdir()
    items = make_items(5)
    build(cache, items, token_layers=())
    g = zarr.open_group(st.store_path(cache, TASK), mode="r")[f"train/experts/{SPEC.name}"]
    sealed = g.attrs["sha256"]
    assert unit(cache) is None
    build(cache, items, token_layers=(1,))
    g = zarr.open_group(st.store_path(cache, TASK), mode="r")[f"train/experts/{SPEC.name}"]
    assert g.attrs["sha256"] == sealed and token_layout.is_complete(unit(cache))
    assert reader.read_token_rows(cache, TASK, "train", [SPEC.name], "tokens", 1)[0].lengths() \
        .tolist() == g["n_tokens"][:].tolist()


def test_unscored_hints_are_scored_from_their_text_without_generating(tmp_path, monkeypatch):
    cache = tmp_path / "stores"
    cache.mkdir()
    items = make_items(5)
    build(cache, items, hints=True, token_layers=())
    monkeypatch.setattr(pc, "compute_hints", lambda *a, **kw: pytest.fail("generated again"))
    build(cache, items, hints=True, token_layers=(), scorer=scorer)
    hints = [h[0] for h in reader.read_hints(cache, TASK, "train", [SPEC.name])]
    g = zarr.open_group(st.store_path(cache, TASK), mode="r")[f"train/experts/{SPEC.name}"]
    assert g[layout.HINT_SCORES][:].tolist() == [scorer(it, h) for it, h in zip(items, hints,
                                                                                 strict=True)]
    assert inspect_store(st.store_path(cache, TASK)) == ([], [])


def test_a_layer_the_expert_lacks_is_one_line_naming_the_range(tmp_path):
    cache = tmp_path / "stores"
    cache.mkdir()
    with pytest.raises(UserError, match=r"--token-states 5: .* pass a layer in -3\.\.2$"):
        build(cache, make_items(3), token_layers=(5,))


def test_the_per_chunk_arrays_read_as_one_flat_array(tmp_path):
    g = zarr.open_group(tmp_path / "s.zarr", mode="w").require_group("e")
    u = token_layout.create_token_unit(g, "tokens", 1, 7, 3, "float32", 3, {"f": 1})
    rng = np.random.default_rng(0)
    rows = [rng.normal(size=(t, 3)).astype(np.float32) for t in (2, 0, 4, 1, 3, 0, 2)]
    for c in range(3):
        token_layout.write_chunk(u, c, rows[3 * c:3 * c + 3])
    got, flat = token_layout.token_rows(u), np.concatenate(rows)
    for lo in range(len(flat) + 1):  # slices within and across row chunks, empty ones too
        for hi in range(lo, len(flat) + 1):
            np.testing.assert_array_equal(got.flat[lo:hi], flat[lo:hi], err_msg=f"{lo}:{hi}")
    assert [len(r) for r in got.rows(range(7))] == [2, 0, 4, 1, 3, 0, 2]


def test_token_states_option_parses_layers_or_names_its_form():
    from musketeers.cli.precompute import parse_layers

    assert parse_layers("12, -1") == (12, -1) and parse_layers(None) == ()
    with pytest.raises(UserError, match=r"^--token-states 'x': .*--token-states=-1$"):
        parse_layers("x")


class CountingArray:
    """A ``flat/<c>`` zarr array that records each zarr chunk a read decodes."""

    def __init__(self, arr: zarr.Array, c: int, decoded: list[tuple[int, int]]):
        self.arr, self.c, self.decoded = arr, c, decoded
        self.shape, self.chunks = arr.shape, arr.chunks

    def __getitem__(self, key: slice) -> np.ndarray:
        lo, hi, _ = key.indices(self.shape[0])
        size = self.chunks[0]
        self.decoded += [(self.c, k) for k in range(lo // size, (hi - 1) // size + 1)] \
            if hi > lo else []
        return self.arr[key]


def test_a_batch_decodes_each_stored_chunk_it_covers_once(tmp_path, monkeypatch):
    monkeypatch.setattr(token_layout, "TOKEN_CHUNK", 4)  # 4 tokens a zarr chunk: rows share them
    g = zarr.open_group(tmp_path / "s.zarr", mode="w").require_group("e")
    u = token_layout.create_token_unit(g, "tokens", 1, 8, 3, "bfloat16", 4, {"f": 1})
    rng = np.random.default_rng(0)
    rows = [rng.normal(size=(t, 3)).astype(np.float32) for t in (1, 2, 0, 3, 2, 5, 1, 1)]
    for c in range(2):
        token_layout.write_chunk(u, c, rows[4 * c:4 * c + 4])
    got = token_layout.token_rows(u)
    decoded: list[tuple[int, int]] = []
    got.flat.arrays = [CountingArray(a, c, decoded) for c, a in enumerate(got.flat.arrays)]
    batch = [7, 0, 3, 1, 5, 2, 4, 0]  # both row chunks, across zarr chunks, an empty row, twice
    read = got.rows(batch)
    for i, r in zip(batch, read, strict=True):
        want = torch.tensor(rows[i]).bfloat16().float().numpy()
        np.testing.assert_array_equal(r, want, err_msg=f"row {i}")
    # row chunk 0 holds 6 tokens (zarr chunks 0, 1), row chunk 1 holds 9 (chunks 0, 1, 2)
    assert sorted(decoded) == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
    decoded.clear()
    got.rows([4])  # 2 tokens of row chunk 1's zarr chunk 0: that chunk alone
    assert decoded == [(1, 0)]


def test_a_checked_chunk_is_hashed_again_only_once_a_file_of_it_changes(built, tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv("MUSKETEERS_VERIFIED_DIR", str(tmp_path / "verified"))
    cache = copy_of(built, tmp_path)
    real, hashed = token_layout.chunk_digest, []
    monkeypatch.setattr(token_layout, "chunk_digest",
                        lambda u, c, rows=None: (hashed.append(c), real(u, c, rows))[1])

    def read():
        hashed.clear()
        return reader.read_token_rows(cache, TASK, "train", [SPEC.name], "tokens", 1)

    read()
    assert sorted(hashed) == [0, 1]  # 7 rows in row chunks of 4
    read()
    assert hashed == []  # a resume, or the next run on this store: nothing hashed again
    flat = unit(cache)["flat"]["1"]
    flat[:] = flat[:] * 2  # a valid chunk (its crc holds), other values
    with pytest.raises(UserError, match=r"chunk 1: swapped or edited"):
        read()
    assert hashed == [1]
