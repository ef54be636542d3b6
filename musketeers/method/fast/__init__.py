"""Decoding speed-ups: what changes how fast the policy decodes and scores, never what.

``fast_decode`` is the one call the policy makes to decode: the CUDA-graphed fixed-shape loop
(``decode_graph``) where asked and possible, else the eager loop with the CPU's frozen linears
prepacked for oneDNN (``prepack``). Each is checked against the plain path in the tests.
What many rows share runs once where the passes are laid out: the common head in
``Policy._shared_prefill``, a prefix's KV cache in ``teacher_forced.shared_prefix_logprobs``.
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import partial
from typing import Any

import torch
from torch import Tensor

from musketeers.method.fast.decode_graph import decode_fixed, why_not_graphed
from musketeers.method.fast.prepack import prepacked_linears
from musketeers.method.sampling import decode


def fast_decode(model: torch.nn.Module, logits: Tensor, cache, mask: Tensor, *,
                graphs: bool, prepack: bool, **sampling: Any) -> Tensor:
    """``sampling.decode(model, logits, cache, mask, **sampling)``'s tokens, decoded by the
    fastest loop this device and model allow: ``graphs`` asks for CUDA graphs (on CUDA, where
    ``why_not_graphed`` finds no reason against), ``prepack`` for prepacked frozen weights
    (on CPU, when not graphed)."""
    graphed = (graphs and logits.device.type == "cuda"
               and why_not_graphed(model, cache) is None)
    loop = partial(decode_fixed, graph=True) if graphed else decode
    packed = (prepacked_linears(model, logits.shape[0]) if prepack and not graphed
              else nullcontext())
    with packed:
        return loop(model, logits, cache, mask, **sampling)
