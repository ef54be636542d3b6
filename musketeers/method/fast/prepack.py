"""Frozen linear layers run from oneDNN-prepacked weights while a CPU decodes.

A decode step multiplies a few dozen rows by every weight matrix of the model. At that shape
``F.linear`` (MKL sgemm) reorders the weight on every call and runs at 18–47 % of what oneDNN
reaches with the weight reordered once (docs/benchmarks-history.md, "the decode's small
matmuls"). Only frozen weights are packed: LoRA's A and B change at every update and their
rank-r products are small. The packed op has no backward, so a layer computes as before
whenever autograd records, and the swap is undone when the decode ends.

The packed copies are dropped then too: they are a second copy of every frozen weight (1.84
GiB for Qwen2.5-Coder-0.5B in float32) that the log-prob passes and the backward never read,
and reordering them again costs about 3 CPU-seconds a decode, against the ~14 s a pocket
step's decode gains from them (BENCHMARKS.md, "Memory of the pocket step").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def why_not_prepacked(model: nn.Module) -> str | None:
    """None when this model's frozen linears can run prepacked here, else the reason."""
    weight = next(model.parameters(), None)
    if weight is None or weight.device.type != "cpu":
        return "not on the CPU"
    if not (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return "this torch has no oneDNN linear ops"
    if weight.dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "this CPU has no native bfloat16 for oneDNN"
    if weight.dtype not in (torch.float32, torch.bfloat16):
        return f"oneDNN packs float32 and bfloat16, not {weight.dtype}"
    return None


def frozen_linears(model: nn.Module) -> list[nn.Linear]:
    """The plain ``nn.Linear`` layers whose weight no optimizer moves (LoRA's base layers,
    the LM head); ``modules()`` yields a layer two names share once."""
    return [m for m in model.modules()
            if type(m) is nn.Linear and not m.weight.requires_grad]


def _packed_weight(layer: nn.Linear, rows: int) -> Tensor:
    """The layer's weight in oneDNN's blocked layout, kept on the layer while the weight is
    the same tensor at the same version (once per decode; ``prepacked_linears`` drops it)."""
    w = layer.weight
    key = (w.data_ptr(), w._version, w.dtype)
    held = getattr(layer, "_prepacked", None)
    if held is None or held[0] != key:
        with torch.no_grad():
            held = (key, torch.ops.mkldnn._reorder_linear_weight(w.detach(), rows))
        layer._prepacked = held
    return held[1]


def _forward(layer: nn.Linear, packed: Tensor, x: Tensor) -> Tensor:
    if torch.is_grad_enabled() and x.requires_grad:  # the layer's own weight is frozen
        return F.linear(x, layer.weight, layer.bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, layer.bias, "none", [], "")


@contextmanager
def prepacked_linears(model: nn.Module, rows: int) -> Iterator[int]:
    """Run ``model``'s frozen linears from prepacked weights inside the block; yields how
    many layers were swapped (0 where ``why_not_prepacked`` gives a reason). ``rows`` is
    the batch the reorder is tuned for."""
    layers = [] if why_not_prepacked(model) else frozen_linears(model)
    for layer in layers:
        layer.forward = partial(_forward, layer, _packed_weight(layer, max(rows, 1)))
    try:
        yield len(layers)
    finally:
        for layer in layers:
            del layer.forward  # the class's forward again
            layer.__dict__.pop("_prepacked", None)  # one copy of the weights outside decodes
