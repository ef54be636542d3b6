"""Frozen linears from oneDNN-prepacked weights during a CPU decode: same numbers, swap undone,
LoRA and autograd untouched, a changed weight repacked."""

import pytest
import torch
from torch import nn

from musketeers.method.fast import prepack
from musketeers.method.fast.prepack import frozen_linears, prepacked_linears, why_not_prepacked
from tests.test_policy import PROMPTS, make_policy

pytestmark = pytest.mark.skipif(why_not_prepacked(nn.Linear(2, 2)) is not None,
                                reason=f"{why_not_prepacked(nn.Linear(2, 2))}")


def frozen_mlp() -> nn.Sequential:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(48, 96), nn.GELU(), nn.Linear(96, 40, bias=False))
    return net.requires_grad_(False)


def test_a_packed_linear_computes_what_f_linear_computes_and_the_swap_is_undone():
    net, x = frozen_mlp(), torch.randn(32, 48)
    want = net(x)
    with torch.no_grad(), prepacked_linears(net, rows=32) as n:
        assert n == 2 and all("forward" in m.__dict__ for m in net if isinstance(m, nn.Linear))
        got = net(x)
        got_3d = net(x.view(4, 8, 48))  # decode passes [rows, 1, hidden]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_3d.view(32, 40), want, rtol=1e-4, atol=1e-5)
    assert not any("forward" in m.__dict__ for m in net)  # the class's forward again


def test_a_weight_changed_in_place_is_repacked_not_served_stale():
    net, x = frozen_mlp(), torch.randn(8, 48)
    with torch.no_grad(), prepacked_linears(net, rows=8):
        net(x)
        assert "_prepacked" in net[0].__dict__
    assert not any("_prepacked" in m.__dict__ for m in net)  # no second copy after it
    with torch.no_grad():
        net[0].weight.mul_(-1.0)
        want = net(x)
        with prepacked_linears(net, rows=8):
            got = net(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_trainable_layers_stay_stock_and_gradients_flow_through_frozen_ones():
    net = frozen_mlp()
    net[2].weight.requires_grad_(True)  # as LoRA's A and B are
    assert frozen_linears(net) == [net[0]]
    x = torch.randn(4, 48, requires_grad=True)
    net(x).sum().backward()
    want = x.grad.clone()
    x.grad = None
    with prepacked_linears(net, rows=4):
        net(x).sum().backward()  # the packed op has no backward: autograd gets F.linear
    torch.testing.assert_close(x.grad, want)


def test_a_model_oneDNN_cannot_pack_is_left_alone():
    net = frozen_mlp().to(torch.float16)
    assert "float16" in why_not_prepacked(net)
    with prepacked_linears(net, rows=4) as n:
        assert n == 0 and not any("forward" in m.__dict__ for m in net)


def test_the_policy_decodes_the_same_tokens_prepacked_and_through_the_packed_op(monkeypatch):
    calls = []
    real = prepack._forward
    monkeypatch.setattr(prepack, "_forward", lambda *a: calls.append(1) or real(*a))
    pol = make_policy("qwen2")
    ids = pol.encode_prompts(PROMPTS)
    outs = {}
    for on in (False, True):
        pol.prepack_decode = on
        with torch.no_grad():
            outs[on] = pol.generate(ids, None, group_size=2, max_new_tokens=12, greedy=True)
    assert calls, "the packed forward never ran"
    assert outs[True] == outs[False]
    base = {id(m.base_layer) for m in pol.model.modules() if hasattr(m, "base_layer")}
    assert base <= {id(m) for m in frozen_linears(pol.model)}
    assert not any("lora_" in n for n, m in pol.model.named_modules()
                   if m in frozen_linears(pol.model))
