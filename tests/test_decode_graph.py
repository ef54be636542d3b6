"""The fixed-shape decode a GPU replays as CUDA graphs samples what the eager loop samples."""

from functools import partial

import pytest
import torch
from test_policy import PROMPTS, ctx, make_policy

from musketeers.method import fast as decoding
from musketeers.method.fast.decode_graph import decode_fixed
from musketeers.method.kv_cache import kv_cache


def fixed(monkeypatch) -> None:
    """The policy samples with the fixed-shape loop, run eagerly: what a GPU captures."""
    monkeypatch.setattr(decoding, "decode", partial(decode_fixed, graph=False))


def streams() -> list[torch.Generator]:
    return [torch.Generator().manual_seed(s) for s in range(len(PROMPTS))]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_fixed_shape_decode_samples_what_decode_samples(arch, attention, monkeypatch):
    """Rows that end keep decoding padding, the mask spans the whole cache from the start and
    the uniforms are drawn up front: every row's tokens are still the eager loop's, sampled
    or greedy, with rows ending at several lengths."""
    pol = make_policy(arch)
    pol.model.config._attn_implementation = attention
    p, c = pol.encode_prompts(PROMPTS), ctx(pol)
    kw = dict(group_size=4, max_new_tokens=10)
    free = pol.generate(p, c, generator=streams(), **kw)
    pol.eos_ids = [free[0][1], free[5][2]]  # tokens the model does emit, early
    eager = pol.generate(p, c, generator=streams(), **kw)
    eager_greedy = pol.generate(p, c, greedy=True, **kw)
    fixed(monkeypatch)
    assert pol.generate(p, c, generator=streams(), **kw) == eager
    assert pol.generate(p, c, greedy=True, **kw) == eager_greedy
    assert len({len(r) for r in eager}) > 2  # rows ended at several lengths
    assert len({tuple(r) for r in eager}) > 6  # and sampled differently


def test_fixed_shape_decode_stops_once_every_row_has_ended(monkeypatch):
    """A batch whose rows all end at their first token stops within ``CHECK_EVERY`` steps,
    not at ``max_new_tokens``, and returns each row cut after its eos."""
    pol = make_policy("qwen2")
    p = pol.encode_prompts(PROMPTS)
    first = pol.generate(p, None, group_size=1, max_new_tokens=1, greedy=True)
    pol.eos_ids = sorted({r[0] for r in first})
    calls = []
    hook = pol.model.get_base_model().register_forward_pre_hook(lambda *_: calls.append(1))
    fixed(monkeypatch)
    out = pol.generate(p, None, group_size=2, max_new_tokens=64, greedy=True)
    hook.remove()
    assert out == [r for r in first for _ in range(2)]
    assert len(calls) < 16  # the prefill's forwards and at most CHECK_EVERY decode steps


def test_an_attention_without_a_4d_mask_is_refused():
    pol = make_policy("qwen2")
    out, mask = pol._shared_prefill(pol.encode_prompts(PROMPTS), None, 1)
    pol.model.config._attn_implementation = "flash_attention_2"  # builds its masks itself
    with pytest.raises(ValueError, match="run without --decode-graphs"):
        decode_fixed(pol.model, out.logits[:, -1], kv_cache(out), mask, max_new_tokens=4,
                     eos_ids=[1], pad_id=0, graph=False, greedy=True)


def test_a_cpu_policy_never_graphs_and_the_paper_budget_does_on_cuda(monkeypatch):
    """Graphs are a CUDA feature: on a CPU the flag leaves the eager loop (which drops ended
    rows, faster there) in charge, so the paper budget can set it for every device."""
    from musketeers.budgets import BUDGETS
    from musketeers.method.fast.decode_graph import why_not_graphed

    assert BUDGETS["paper"]["decode_graphs"] is True
    pol = make_policy("qwen2")
    pol.decode_graphs = True
    calls = []
    monkeypatch.setattr(decoding, "decode_fixed", lambda *a, **k: calls.append(1))
    pol.generate(pol.encode_prompts(PROMPTS), None, group_size=2, max_new_tokens=3)
    assert calls == []
    out, _ = pol._shared_prefill(pol.encode_prompts(PROMPTS), None, 1)
    assert why_not_graphed(pol.model, kv_cache(out)) is None
