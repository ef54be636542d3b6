"""Chosen-token log-probs with the LM head in chunks: the values and gradients of the full
logits, and no tensor over the whole batch's vocabulary."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from musketeers.method import chosen_logprobs as chosen
from musketeers.method import teacher_forced
from musketeers.method.sampling import token_logprobs
from tests.test_policy import COMPS, PROMPTS, V, ctx, make_policy


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-6, atol=1e-6 * float(b.detach().abs().max()))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("elements", [1, 3 * 1000, 10**9])  # 1 row, 3 rows, one chunk
def test_values_and_grads_equal_the_full_logits(temperature, elements):
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 1000, bias=True).requires_grad_(False)
    hidden = torch.randn(3, 5, 16, requires_grad=True)
    ids = torch.randint(0, 1000, (3, 5))
    weight = torch.randn(3, 5)  # a loss that weighs every position differently
    full = token_logprobs(head(hidden), ids, temperature)
    (g_full,) = torch.autograd.grad((full * weight).sum(), hidden)
    part = chosen.chosen_logprobs(hidden, head, ids, temperature, elements=elements)
    (g_part,) = torch.autograd.grad((part * weight).sum(), hidden)
    assert part.dtype == torch.float32
    assert close(part, full) and close(g_part, g_full)


def test_a_trainable_head_is_refused():
    head = torch.nn.Linear(4, 10)
    with pytest.raises(ValueError, match="frozen"):
        chosen.chosen_logprobs(torch.randn(1, 2, 4), head, torch.zeros(1, 2, dtype=torch.long),
                               1.0)


class LargestVocabTensor(TorchDispatchMode):
    """The most values any float tensor of logits' shape ([N, V] or [N, T, V]) held, forward
    and backward alike: the logits and everything computed from them (attention's 4-d
    scores, whose key length can equal V by chance, are not logits)."""

    def __init__(self, head: torch.nn.Linear):
        super().__init__()
        self.vocab, self.largest = head.out_features, 0
        self.weight = head.weight.untyped_storage().data_ptr()  # its views ([d, V]) are not

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if (isinstance(t, torch.Tensor) and t.is_floating_point() and 1 < t.dim() < 4
                    and t.shape[-1] == self.vocab
                    and t.untyped_storage().data_ptr() != self.weight):
                self.largest = max(self.largest, t.numel())
        return out


def policy_pass(pol, grad: bool, shared: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A batch's log-probs through the policy (shared prefixes or one row per completion) and
    the gradients of a weighted sum of them with respect to C and the LoRA weights."""
    c = ctx(pol).requires_grad_(grad)
    prompts = pol.encode_prompts(PROMPTS)
    if not shared:  # one row per completion: the ``joint_logits`` path
        prompts, c2 = [p for p in prompts for _ in range(2)], c.repeat_interleave(2, 0)
    else:
        c2 = c
    logp, mask = pol.completion_logprobs(prompts, c2, COMPS, temperature=0.9)
    if not grad:
        return logp, []
    lora = [p for n, p in pol.model.named_parameters() if "lora_" in n]
    w = torch.linspace(0.5, 1.5, logp.numel()).reshape(logp.shape)
    return logp, list(torch.autograd.grad((logp * w * mask).sum(), [c, *lora]))


@pytest.mark.parametrize("shared", [True, False])
def test_policy_logprobs_and_grads_equal_the_unchunked_pass(monkeypatch, shared):
    pol = make_policy(arch="qwen2", position="before_generation_prompt")
    monkeypatch.setattr(chosen, "CHUNK_ELEMENTS", 2 * V)  # two positions per chunk
    logp, grads = policy_pass(pol, grad=True, shared=shared)
    monkeypatch.setattr(teacher_forced, "chunked_head", lambda model: None)  # full logits
    logp_full, grads_full = policy_pass(pol, grad=True, shared=shared)
    assert close(logp, logp_full)
    assert all(close(a, b) for a, b in zip(grads, grads_full, strict=True))
    assert all(float(g.abs().max()) > 0 for g in grads_full)  # the comparison has something


@pytest.mark.parametrize("shared", [True, False])
def test_no_vocabulary_tensor_exceeds_one_chunk(monkeypatch, shared):
    pol = make_policy(arch="qwen2", position="before_generation_prompt")
    n_positions = sum(map(len, COMPS))
    monkeypatch.setattr(chosen, "CHUNK_ELEMENTS", 2 * V)
    head = pol.model.get_base_model().lm_head
    with LargestVocabTensor(head) as seen:
        policy_pass(pol, grad=True, shared=shared)
    # a prefix pass's single position per prompt is the only other vocabulary-wide output
    # (the common head's logits_to_keep=1, before ``hidden_out`` applies): at most one row
    assert seen.largest <= 2 * V
    # the same measure catches the unchunked pass: its logits span every position at once
    monkeypatch.setattr(teacher_forced, "chunked_head", lambda model: None)
    with LargestVocabTensor(head) as full:
        policy_pass(pol, grad=True, shared=shared)
    assert full.largest >= n_positions * V / 2


def test_a_model_that_transforms_its_logits_keeps_the_full_head():
    pol = make_policy(arch="qwen2")
    assert chosen.chunked_head(pol.model) is pol.model.get_base_model().lm_head
    pol.model.get_base_model().config.final_logit_softcapping = 30.0
    assert chosen.chunked_head(pol.model) is None


def test_the_head_is_itself_again_after_the_pass():
    pol = make_policy(arch="qwen2")
    head = chosen.chunked_head(pol.model)
    x = torch.randn(2, head.in_features)
    before = head(x)
    with chosen.hidden_out(head):
        assert torch.equal(head(x), x)
    assert torch.equal(head(x), before)
