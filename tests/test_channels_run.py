"""A run on a token channel: SplitData slices TokenRows per batch, shuffled_experts permutes
token rows, training and evaluation run on a store holding token states, and a resumed run
keeps its channel."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from musketeers.cache import from_memory, layout, reader
from musketeers.cache.errors import UserError
from musketeers.cache.tokens import TokenRows, from_arrays
from musketeers.checks.planted import EXPERTS, planted_config, write_planted_store
from musketeers.method import methods
from musketeers.method.adapter import ExpertTokens
from musketeers.method.methods import derangement
from musketeers.run import data as data_mod
from musketeers.run.build import expert_names_for
from musketeers.run.data import load_split
from tests.test_trainer import metrics

pytestmark = pytest.mark.usefixtures("one_thread")


class Recorder(TokenRows):
    """TokenRows that remembers which rows were read (never the whole split at once)."""

    reads: list[list[int]]

    def rows(self, idx):
        self.reads.append([int(i) for i in idx])
        return super().rows(idx)


def token_reader(extra: int):
    """A reader of token rows built from the store's pooled vectors: row i holds its pooled
    vector first, then ``i % (extra + 1)`` noise tokens (``extra`` = 0: exactly one token)."""
    made: list[Recorder] = []

    def read(cache_dir, task, split, experts, channel, layer):
        assert channel in ("tokens", "answer") and layer == -1
        out = []
        for e, vec in enumerate(reader.read_vectors(cache_dir, task, split, experts, "last")):
            rng = np.random.default_rng(e)
            rows = [np.concatenate([v[None], rng.normal(size=(i % (extra + 1), len(v)))])
                    for i, v in enumerate(vec)]
            t = from_arrays(rows)
            rec = Recorder(t.offsets, t.flat)
            object.__setattr__(rec, "reads", [])
            made.append(rec)
            out.append(rec)
        return out

    read.made = made
    return read


ONE, RAGGED = -1, 0  # token layers of the store below: -1 is the planted experts' layer 1


@pytest.fixture(scope="module")
def token_store(tmp_path_factory) -> Path:
    """The planted store with token states of every expert: at layer 1 (read as -1) each row's
    one token is its pooled vector, at layer 0 the pooled vector then ``i % 4`` noise tokens."""
    cache = tmp_path_factory.mktemp("channels") / "stores"
    root = zarr.open_group(write_planted_store(cache, n_train=64, n_val=16), mode="r+")
    for split in ("train", "val"):
        for e, name in enumerate(EXPERTS):
            g = layout.find_expert(root, split, name)
            vec = g["last"][:]
            rng = np.random.default_rng(e)
            ragged = [np.concatenate([v[None], rng.normal(size=(i % 4, len(v)))])
                      for i, v in enumerate(vec)]
            fp = layout.fingerprint(g)
            from_memory.write_token_unit(g, "tokens", 1, [v[None] for v in vec], fp)
            from_memory.write_token_unit(g, "tokens", 0, ragged, fp)
    return cache


def small(method: str, store: Path, run: Path, steps: int = 2, **kw):
    values = dict(prompts_per_micro=4, group_size=4, grad_accum=2, save_every=1, beta=0.04,
                  eval_limit=8)
    values.update(kw)
    return planted_config(method, 0, steps, store, run, **values)


def split_of(cfg, split: str = "train"):
    """``split`` as a run of ``cfg`` reads it: its method resolved once, its team's experts."""
    method = methods.get(cfg.method)
    return load_split(cfg, split, expert_names_for(cfg, method), method=method)


def test_split_keeps_token_rows_and_reads_each_batch(planted_store, tmp_path, monkeypatch):
    read = token_reader(extra=3)
    monkeypatch.setattr(reader, "read_token_rows", read)
    cfg = small("perceiver", planted_store, tmp_path / "r", channel="tokens")
    data = split_of(cfg)
    assert data.vectors == [] and len(data.tokens) == 3
    assert all(rec.reads == [] for rec in read.made)  # nothing read until a batch asks
    items, inputs, _ = data.batch(torch.tensor([5, 2, 7]))
    assert [it.id for it in items] == [data.items[i].id for i in (5, 2, 7)]
    assert all(rec.reads == [[5, 2, 7]] for rec in read.made)
    x = inputs[0]
    assert isinstance(x, ExpertTokens)
    assert x.mask.sum(1).tolist() == [5 % 4 + 1, 2 % 4 + 1, 7 % 4 + 1]
    assert (x.states[~x.mask] == 0).all()
    pooled = reader.read_vectors(cfg.cache_dir, cfg.task, "train", data.expert_names, "last")
    np.testing.assert_array_equal(x.states[:, 0].numpy(), pooled[0][[5, 2, 7]])
    sample = data.standardizer_sample(0)
    assert sample[0].shape[0] == sum(i % 4 + 1 for i in range(len(data)))  # 64 rows: the cap
    monkeypatch.setattr(data_mod, "STANDARDIZER_ROWS", 8)
    assert len(read.made[0].reads[-1]) == len(data)
    data.standardizer_sample(0)
    assert len(read.made[0].reads[-1]) == 8  # a bounded sample, not the split


def test_shuffled_experts_reads_another_rows_tokens(token_store, tmp_path):
    cfg = small("shuffled_experts", token_store, tmp_path / "r", channel="tokens",
                token_layer=RAGGED)
    data = split_of(cfg)
    perm = derangement(len(data), cfg.seed)
    assert data.token_rows.tolist() == perm.tolist()
    pooled = split_of(replace(cfg, channel="pooled"))
    rows = torch.arange(10)
    _, tok, _ = data.batch(rows)
    _, vec, _ = pooled.batch(rows)
    for t, v in zip(tok, vec, strict=True):  # the pooled control's rows, token for token
        torch.testing.assert_close(t.states[:, 0], v, rtol=0, atol=0)
        assert t.mask.sum(1).tolist() == [int(p) % 4 + 1 for p in perm[rows]]
    assert (perm[rows] != rows).all()


def test_a_store_without_the_channel_names_the_precompute_that_adds_it(planted_store, tmp_path):
    cfg = small("perceiver", planted_store, tmp_path / "r", channel="tokens", token_layer=1)
    with pytest.raises(UserError, match=r"no channel 'tokens'.*run: musketeers precompute .*"
                                        r"--token-states=1"):
        split_of(cfg)


def test_zero_context_reads_pooled_vectors_on_any_channel(planted_store, tmp_path):
    cfg = small("zero_context", planted_store, tmp_path / "r", channel="tokens")  # none stored
    data = split_of(cfg)
    assert data.tokens == [] and len(data.vectors) == 3


def test_one_token_channel_trains_exactly_as_pooled(token_store, tmp_path):
    from musketeers.run.trainer import train

    train(small("perceiver", token_store, tmp_path / "pooled"), plot=False)
    train(small("perceiver", token_store, tmp_path / "tokens", channel="tokens",
                token_layer=ONE), plot=False)
    a, b = metrics(tmp_path / "pooled"), metrics(tmp_path / "tokens")
    assert len(a) == 2 and a == b


def test_ragged_tokens_train_evaluate_and_resume_keeps_the_channel(token_store, tmp_path):
    from musketeers.config import read_run_config
    from musketeers.run.evaluate import evaluate
    from musketeers.run.trainer import train

    run = tmp_path / "run"
    cfg = small("perceiver", token_store, run, channel="tokens", token_layer=RAGGED,
                standardize_experts=True, adapter_warmup=2)
    train(cfg, stop_after=1, plot=False)
    assert read_run_config(run).channel == "tokens"  # the run records its channel
    for r in metrics(run):
        assert sum(r["utilisation"].values()) == pytest.approx(1.0, abs=1e-5)
        assert 0.0 <= r["entropy"] <= np.log(3) + 1e-6
    with pytest.raises(UserError, match=r"trained on --channel tokens --token-layer 0; "
                                        r"--resume keeps it: pass --channel tokens"):
        train(replace(cfg, channel="pooled"), resume=True, plot=False)
    with pytest.raises(UserError, match="--token-layer 0"):
        train(replace(cfg, token_layer=ONE), resume=True, plot=False)
    train(read_run_config(run), resume=True, plot=False)
    assert [r["step"] for r in metrics(run)] == [1, 2]
    result = evaluate(run, limit=4)
    assert result["n"] == 4 and 0.0 <= result["exact"] <= 1.0


def test_a_pooled_run_refuses_to_resume_on_tokens(planted_store, tmp_path):
    from musketeers.run.trainer import train

    run = tmp_path / "run"
    cfg = small("perceiver", planted_store, run)
    train(cfg, stop_after=1, plot=False)
    with pytest.raises(UserError, match=r"trained on --channel pooled; --resume keeps it: pass "
                                        r"--channel pooled, or start a new --run-dir for "
                                        r"--channel answer$"):
        train(replace(cfg, channel="answer"), resume=True, plot=False)


@pytest.fixture(scope="module")
def fixture_tokens(tmp_path_factory) -> Path:
    """The committed tiny-roster logic store (it has a router) with ragged token states at
    each expert's last layer."""
    import shutil

    fixtures = Path(__file__).resolve().parent / "fixtures"
    cache = tmp_path_factory.mktemp("fixture-tokens")
    shutil.copytree(fixtures / "logic.zarr", cache / "logic.zarr")
    root = zarr.open_group(cache / "logic.zarr", mode="r+")
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for name in TINY:
            g = layout.find_expert(root, split, name)
            n, d = g["last"].shape
            rows = [rng.normal(size=(1 + i % 5, d)) for i in range(n)]
            from_memory.write_token_unit(g, "tokens", int(g.attrs["n_layers"]), rows,
                                         layout.fingerprint(g))
    return cache


TINY = ["tiny-llama", "tiny-gpt2", "tiny-qwen2"]


@pytest.mark.parametrize("method", ["no_cross_attn", "hard_routing", "shuffled_experts"])
def test_every_adapter_method_trains_on_tokens(fixture_tokens, tmp_path, method):
    from musketeers.config import resolve_config
    from musketeers.run.trainer import train

    cfg = resolve_config(None, dict(
        task="logic", team=None, experts=TINY, method=method, policy="tiny", budget="smoke",
        steps=1, max_new_tokens=2, cache_dir=str(fixture_tokens), channel="tokens",
        run_dir=str(tmp_path / method), dtype="float32", device="cpu", skip_no_signal=False))
    train(cfg, plot=False)
    (row,) = metrics(tmp_path / method)
    assert row["loss"] is not None and row["grad_norm"] >= 0
    assert ("utilisation" in row) == (method != "no_cross_attn")


def test_a_token_run_records_its_token_units_and_resume_refuses_other_ones(token_store, tmp_path):
    import shutil

    from musketeers.cache import token_layout
    from musketeers.cache.store import store_path
    from musketeers.run import runfolder

    cache = tmp_path / "stores"
    shutil.copytree(token_store, cache)
    run = tmp_path / "run"
    cfg = small("perceiver", cache, run, channel="tokens", token_layer=RAGGED)
    method = methods.get(cfg.method)
    names = expert_names_for(cfg, method)
    root = zarr.open_group(store_path(cache, cfg.task), mode="r+")
    units = {n: token_layout.token_unit(layout.find_expert(root, "train", n), "tokens", 0)
             for n in names}
    recorded = runfolder.store_fingerprints(cfg, method)
    assert recorded["tokens"] == {n: u.attrs["fingerprint"] for n, u in units.items()}
    assert all(recorded["tokens"].values())
    assert recorded["tokens"] != runfolder.store_fingerprints(
        replace(cfg, token_layer=ONE), method)["tokens"]  # another layer, another unit
    assert "tokens" not in runfolder.store_fingerprints(replace(cfg, channel="pooled"), method)
    runfolder.begin(cfg, run, recorded)
    assert runfolder.check_store(cfg, run, runfolder.store_fingerprints(cfg, method))
    # one expert's layer-0 states rebuilt from other inputs; its pooled unit is untouched
    g = layout.find_expert(root, "train", names[1])
    rows = token_layout.token_rows(units[names[1]]).rows(range(g["last"].shape[0]))
    from_memory.write_token_unit(g, "tokens", 0, rows, {"another": "expert"})
    assert runfolder.store_fingerprints(cfg, method)["experts"] == recorded["experts"]
    with pytest.raises(UserError, match=rf"\(expert {names[1]}'s token states differ\)"):
        runfolder.check_store(cfg, run, runfolder.store_fingerprints(cfg, method))
