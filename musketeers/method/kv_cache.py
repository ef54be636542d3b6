"""A forward's KV cache under the installed transformers' name for it.

transformers 5.2x renamed a forward's ``past_key_values`` (argument and output) to ``cache``:
the old name warns on every forward (a log line per decoded token) and goes in 5.40, and the
new one is unknown to the 5.x releases before it. Every KV-cache hand-off (the policy's
prefill, the decode loops, the teacher-forced passes) goes by this name.
"""

from __future__ import annotations

from transformers.modeling_outputs import CausalLMOutputWithPast

CACHE_KW = ("cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__
            else "past_key_values")


def kv_cache(out):
    """The KV cache a forward returned, under the installed transformers' name for it."""
    return getattr(out, CACHE_KW)
