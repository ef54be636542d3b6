"""Frozen experts: what one is (ExpertSpec) and how any causal LM is loaded offline.

Contract (shared with musketeers.teams, which holds the named registry):
ExpertSpec.kind is one of
  "hub"    ref = hub id (``Qwen/Qwen2.5-Math-1.5B-Instruct``), loaded from the local HF cache only
  "dir"    ref = local folder that ``transformers`` loads
  "gguf"   ref = Python package shipping a GGUF file ``file`` (or an ``assemble()`` that writes it)
  "chunks" ref = comma-separated chunk packages whose ``data/partNN.bin`` concatenate to ``file``
  "random" ref = architecture (``gpt2``, ``llama``, ...), ``config`` = config overrides,
           ``tokenizer`` = spec name or folder of the tokenizer, weights seeded by ``seed``
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ExpertSpec:
    name: str
    kind: str
    ref: str
    file: str | None = None
    sha256: str | None = None
    tokenizer: str | None = None
    config: dict = field(default_factory=dict, hash=False)
    seed: int = 0
    description: str = ""
