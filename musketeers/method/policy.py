"""The policy π_θ: a causal LM with LoRA, conditioned on context tokens C (paper Eq. 3).

π_{θ,φ}(y | x) := π_θ(y | [x ‖ C]): C (m × d_policy, from the adapter) enters through
``inputs_embeds``. The reference policy of Eq. 4 is the same weights with the LoRA adapter
disabled and zero vectors in C's positions, so the token layout matches and no second copy
of the model is held.

Where C goes (``context_position``). x is the input; the chat template's generation prompt
("<|im_start|>assistant\n") is the opening of y's turn. The default puts C between the two,
``[x ‖ C ‖ assistant header]`` (``before_generation_prompt``); ``after_prompt`` puts it after
the header, ``before_prompt`` before everything. The paper initialises W_out near zero so that
C ≈ 0 leaves the initial policy as it was (Eq. 11); only the first and last placements keep
that promise. Measured on 8 arithmetic prompts, KL of the first completion token between
π(·|x) and π(·|[x ‖ 0]) in nats (``python -m musketeers.bench.zero_context --policy <name>``; the
SmolLM2 rows are checked by a test in tests/test_policy.py):

    policy                  m   after_prompt   before_generation_prompt   before_prompt
    SmolLM2-135M-Instruct   1       4.76              0.009                  0.017
    SmolLM2-135M-Instruct   8       4.34              0.052                  0.101
    Qwen2.5-Coder-0.5B      1       4.52              0.005                  0.017
    Qwen2.5-Coder-0.5B      8      11.25              0.028                  0.100

With m = 8 zeros after the header, Qwen2.5-Coder-0.5B ends 16 of 16 greedy completions at the
first token. Without a chat template the generation prompt is empty and the first two agree.

Layout of a batch (one row per sequence):

    [pad … pad | prompt ‖ C ‖ generation prompt] [completion | pad … pad]
     └──────── prefix, left-padded ───────────┘ └─ right-padded, from column P ─┘

Every prefix ends at the same column P, so completion token t of every row sits at column
P + t and its logits at column P + t - 1: one contiguous slice, which lets the LM head run
only over completion positions (``logits_to_keep``). Position ids count real tokens only
(cumsum of the mask - 1), the same rule ``generate`` uses, so log-probs of a padded batch
equal those of each sequence alone.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from peft import LoraConfig, get_peft_model
from torch import Tensor

from musketeers.cache.prompts import generation_prompt_len, render_prompt
from musketeers.method.fast import fast_decode
from musketeers.method.kv_cache import CACHE_KW, kv_cache
from musketeers.method.placement import CONTEXT_POSITIONS
from musketeers.method.teacher_forced import teacher_forced


def target_modules(model: torch.nn.Module, wanted: tuple[str, ...]) -> list[str] | None:
    """The requested LoRA targets when the architecture has them, else None: peft then picks
    its own per-architecture default (e.g. gpt2 → c_attn)."""
    leaves = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    return list(wanted) if all(t in leaves for t in wanted) else None


def contiguous_input(_module, args):
    """Hand the LM head a contiguous input (a forward pre-hook on the head).

    ``logits_to_keep`` slices the hidden states ([N, T, d] → [N, k, d], a strided view), and
    torch's matmul then runs the head as a bmm against the weight expanded and *copied* N
    times: [N, d, V] bf16, 2.6 s per call for SmolLM2 at N = 16 on a 2-core CPU, more than
    the whole prompt prefill. A contiguous copy of the small slice costs microseconds.
    """
    return (args[0].contiguous(), *args[1:])


def common_head(prompts: list[list[int]], limits: list[int]) -> int:
    """How many leading tokens all ``prompts`` share, at most ``limits[i]`` for prompt i (0 for
    fewer than two prompts: there is nothing to share)."""
    if len(prompts) < 2:
        return 0
    first, k, limit = prompts[0], 0, min(limits)
    while k < limit and all(p[k] == first[k] for p in prompts):
        k += 1
    return k


class PolicyInputs(NamedTuple):
    inputs_embeds: Tensor  # [N, P + T, d]
    attention_mask: Tensor  # [N, P + T] long
    position_ids: Tensor  # [N, P + T]
    prefix_len: int  # P: completions start at this column
    completion_ids: Tensor  # [N, T] (pad where mask is 0)
    completion_mask: Tensor  # [N, T]


class Policy:
    """LoRA-wrapped causal LM with context tokens spliced into its input embeddings.

    It lays out a batch, runs the shared prefill and samples; ``completion_logprobs`` scores
    given completions through the teacher-forced passes (``musketeers.method.teacher_forced``).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        lora_r: int = 8,
        lora_alpha: int = 16,
        lora_targets: tuple[str, ...] = ("q_proj", "v_proj"),
        context_position: str = "before_generation_prompt",
    ):
        if context_position not in CONTEXT_POSITIONS:
            raise ValueError(
                f"unknown context position {context_position!r}; "
                f"valid: {', '.join(CONTEXT_POSITIONS)}"
            )
        config = LoraConfig(
            r=lora_r,
            lora_alpha=lora_alpha,
            target_modules=target_modules(model, tuple(lora_targets)),
            lora_dropout=0.0,  # train and eval forwards must agree (old log-probs, ratio)
            task_type="CAUSAL_LM",
        )
        self.model = get_peft_model(model, config)
        head = self.model.get_output_embeddings()
        if head is not None:
            head.register_forward_pre_hook(contiguous_input)
        self.tokenizer = tokenizer
        self.context_position = context_position
        # False: every prompt's tokens run and completions pad to the batch's longest, the
        # baseline ``python -m musketeers.bench --only sharing`` measures sharing against
        self.share = True
        # on CUDA, with a model that allows it: ``fast.decode_graph.decode_fixed`` (CUDA graphs)
        self.decode_graphs = False
        # on CPU: the frozen weights of each decode step prepacked for oneDNN (``fast.prepack``)
        self.prepack_decode = True
        self.generation_prompt_len = generation_prompt_len(tokenizer)
        emb = self.model.get_input_embeddings()
        self.embed_dim: int = emb.embedding_dim
        self.dtype = emb.weight.dtype
        # the scale C is weighed against (frozen: LoRA never touches the embeddings)
        self.embedding_rms = float(emb.weight.detach().float().pow(2).mean().sqrt())
        self.pad_id: int = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        eos = model.generation_config.eos_token_id
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
            eos.append(tokenizer.eos_token_id)
        self.eos_ids: list[int] = eos

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    # ---- prompts -------------------------------------------------------------------------

    def encode_prompts(self, items_or_texts: list[Any]) -> list[list[int]]:
        """Token ids of each prompt (an Item, a ``{system, question}`` mapping or a bare
        question), rendered exactly as the experts saw it (``musketeers.cache.prompts``)."""
        return [render_prompt(self.tokenizer, it) for it in items_or_texts]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # ---- inputs --------------------------------------------------------------------------

    def build_inputs(
        self,
        prompt_ids: list[list[int]],
        context: Tensor | None,
        completion_ids: list[list[int]] | None = None,
    ) -> PolicyInputs:
        """Embeddings of [pad | prompt ‖ C | completion | pad] (C elsewhere in the prefix per
        ``context_position``).

        context is [N, m, d] (or None for no context tokens); it is cast to the policy's
        dtype differentiably, so gradients reach the adapter that produced it.
        """
        n = len(prompt_ids)
        m = 0 if context is None else context.shape[1]
        if context is not None and context.shape[0] != n:
            raise ValueError(f"context has {context.shape[0]} rows for {n} prompts")
        comps = completion_ids if completion_ids is not None else [[] for _ in range(n)]
        prefix_len = max(len(p) for p in prompt_ids) + m
        t = max((len(c) for c in comps), default=0)
        dev = self.device

        ids = torch.full((n, prefix_len + t), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n, prefix_len + t), dtype=torch.long)
        is_ctx = torch.zeros((n, prefix_len + t), dtype=torch.bool)
        for i, (p, c) in enumerate(zip(prompt_ids, comps, strict=True)):
            start = prefix_len - len(p) - m
            head = len(p) - self._tokens_after_context(len(p))  # prompt tokens before C
            ids[i, start : start + head] = torch.tensor(p[:head], dtype=torch.long)
            is_ctx[i, start + head : start + head + m] = True
            ids[i, start + head + m : prefix_len] = torch.tensor(p[head:], dtype=torch.long)
            mask[i, start:prefix_len] = 1
            ids[i, prefix_len : prefix_len + len(c)] = torch.tensor(c, dtype=torch.long)
            mask[i, prefix_len : prefix_len + len(c)] = 1
        ids, mask, is_ctx = ids.to(dev), mask.to(dev), is_ctx.to(dev)

        embeds = self.model.get_input_embeddings()(ids)
        if context is not None and m > 0:
            # masked_scatter fills C's positions row by row, in order: row i gets context[i]
            embeds = embeds.masked_scatter(is_ctx.unsqueeze(-1), context.to(dev, self.dtype))
        position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        return PolicyInputs(
            embeds, mask, position_ids, prefix_len, ids[:, prefix_len:], mask[:, prefix_len:]
        )

    def _tokens_after_context(self, prompt_len: int) -> int:
        if self.context_position == "after_prompt":
            return 0
        if self.context_position == "before_prompt":
            return prompt_len
        return min(self.generation_prompt_len, prompt_len)

    # ---- the shared prefill ----------------------------------------------------------

    def _shared_prefill(self, prompts: list[list[int]], context: Tensor | None, g: int):
        """One forward over B prefixes [x ‖ C], its KV cache repeated G times (group-major) so
        that B·G rows continue from it: the output (holding each prefix's last logits) and
        the prefix mask [B, P'].

        The head every prompt starts with (``_common_head``: a chat template's system turn,
        37 of the 73 tokens of a pocket arithmetic prompt) runs once, as one row, and its
        cache is repeated B times; the rest of each prefix follows it, padded on the left of
        the rest, so a row reads [head | pad … | x_rest ‖ C]. Position ids still count real
        tokens, so every token sees what it would alone. The 400 pocket validation prompts, in
        evaluation batches of 64 with m = 8, prefill 1.73× fewer tokens (arithmetic) and
        1.29× (algorithmic).
        """
        k = self._common_head(prompts)
        # the layout first (head, then each row's rest), then the passes that run it
        inp = self.build_inputs([p[k:] for p in prompts], context)
        head = None
        if k:
            ids = torch.tensor([prompts[0][:k]], dtype=torch.long, device=self.device)
            # only its KV cache is read: logits for one position, not for every head token
            head = kv_cache(self.model(inputs_embeds=self.model.get_input_embeddings()(ids),
                                       use_cache=True, logits_to_keep=1))
            head.batch_repeat_interleave(len(prompts))
        mask = torch.cat([inp.attention_mask.new_ones(len(prompts), k), inp.attention_mask], 1)
        out = self.model(inputs_embeds=inp.inputs_embeds, attention_mask=mask,
                         position_ids=inp.position_ids + k, use_cache=True, logits_to_keep=1,
                         **{CACHE_KW: head})
        if g > 1:
            kv_cache(out).batch_repeat_interleave(g)
        return out, mask

    def _common_head(self, prompts: list[list[int]]) -> int:
        """How many leading tokens all prompts share before C's slot, each row keeping at
        least one token of its own (so its prefix's last logits are its own)."""
        if not self.share:
            return 0
        return common_head(prompts, [min(len(p) - self._tokens_after_context(len(p)),
                                         len(p) - 1) for p in prompts])

    # ---- sampling ------------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: list[list[int]],
        context: Tensor | None,
        *,
        group_size: int,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        greedy: bool = False,
        generator: torch.Generator | list[torch.Generator] | None = None,
    ) -> list[list[int]]:
        """B·G completions (group-major: row b·G + g), all rows decoded together with the KV
        cache. Each is cut after its first eos (kept once); padding is stripped.

        Each group's prefix [x ‖ C] runs through the model once and its KV cache is shared by
        its G rows, and the head all B prompts share once for all of them
        (``_shared_prefill``); ``sampling.decode`` then samples from π itself:
        softmax(logits / temperature), no top-k, repetition penalty or other processors.
        Randomness comes from ``generator`` when given (the global RNG is then untouched;
        a list: one stream per prompt, see ``sampling.sample_tokens``), else from the global
        torch RNG (``torch.manual_seed``).
        """
        if max_new_tokens < 1:
            return [[] for _ in range(len(prompt_ids) * group_size)]
        pre, mask = self._shared_prefill(prompt_ids, context, group_size)
        out = fast_decode(
            self.model, pre.logits[:, -1].repeat_interleave(group_size, dim=0),
            kv_cache(pre), mask.repeat_interleave(group_size, dim=0),
            graphs=self.decode_graphs, prepack=self.prepack_decode,
            max_new_tokens=max_new_tokens, eos_ids=self.eos_ids, pad_id=self.pad_id,
            temperature=temperature, top_p=top_p, greedy=greedy, generator=generator)
        return [self._strip(row) for row in out.tolist()]

    def sample_texts(self, prompt_ids: list[list[int]], context: Tensor | None,
                     **kw: Any) -> tuple[list[list[int]], list[str]]:
        """``generate``'s completions (same arguments) with their decoded texts: a rollout's
        sampling in one call."""
        completions = self.generate(prompt_ids, context, **kw)
        return completions, [self.decode(c) for c in completions]

    def _strip(self, row: list[int]) -> list[int]:
        for i, tok in enumerate(row):
            if tok in self.eos_ids:
                return row[: i + 1]
        return row  # no eos: it ran to max_new_tokens, every token is real

    # ---- log-probs -----------------------------------------------------------------------

    def completion_logprobs(
        self,
        prompt_ids: list[list[int]],
        context: Tensor | None,
        completion_ids: list[list[int]],
        *,
        reference: bool = False,
        temperature: float = 1.0,
    ) -> tuple[Tensor, Tensor]:
        """log π(y_t | [x ‖ C], y_<t) for every completion token: (logp [N, T] float32,
        mask [N, T]). prompt_ids/context may have B rows for N = B·G completions (group-major).

        reference=True: π_ref of Eq. 4, i.e. LoRA disabled and zero vectors in C's
        positions (no gradient). Logits are divided by ``temperature`` to match sampling.
        """
        if reference:
            with torch.no_grad(), self.model.disable_adapter():
                zeros = None if context is None else torch.zeros_like(context)
                return teacher_forced(self, prompt_ids, zeros, completion_ids, temperature)
        return teacher_forced(self, prompt_ids, context, completion_ids, temperature)
