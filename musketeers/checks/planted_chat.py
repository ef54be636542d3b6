"""The planted check's ``chat`` variant: multi-token answers, β > 0 and a chat template.

The plain check (musketeers.checks.planted) keeps its policy minimal: one token per answer, β = 0,
no template. That leaves three paths of every real run unproven by it: prompts rendered by a
chat template with C placed before the generation prompt (``context_position``'s default),
completions of several tokens sampled, stopped at EOS, decoded and graded by the normal
extractor, and the reference policy (LoRA off, C = 0) entering the loss through the KL term.
This variant runs them all on the same store, task and criteria:

- the tokenizer is word-level with a whitespace pre-tokenizer: ``<answer>``, ``</answer>``,
  each digit, the chat-role tokens and [PAD]/[UNK]/[EOS] are separate tokens (every prompt
  word is [UNK]: the prompt carries no information by design), and a jinja ``chat_template``
  with system/user/assistant turns and ``add_generation_prompt`` renders every prompt;
- an answer is ``<answer> 7 </answer> [EOS]``, four sampled tokens, decoded with spaces
  (``<answer> 7 </answer>``) and found by ``extract_answer`` (" 7 " → "7" after its strip);
- β = 0.01, so reference log-probs are computed and the KL term is in the loss (KL to the
  reference reaches 0.1-0.7 nats a token). Why not the paper's 0.04: θ_ref answers a uniform
  digit, so the KL pulls the answer back towards chance, and at 0.04 it held the reward of
  seeds 1, 2 and 4 at 0.28-0.29, under the check's 0.30 in 50 steps; at 0.01 seeds 0-4 all
  pass (``musketeers.checks.planted.MARGINS``).

Why a warm-up. A random policy almost never samples the exact four-token format (the chance
of ``<answer> d </answer> [EOS]`` in a 20-word vocabulary is ~1e-5), so every reward is 0,
every group has zero variance and GRPO has nothing to learn from. A real instruct policy knows
the format and not the answer; ``warm_up`` gives the tiny random llama exactly that before
LoRA is attached: a few dozen seeded AdamW steps of next-token loss on the rendered planted
prompts followed by ``<answer> d </answer> [EOS]`` with d uniform at random, so the base
policy answers in format with a ~uniform digit (reward at chance, 0.1). The digit it is
taught is noise independent of the item, so nothing about the answer leaks into θ_ref.
"""

from __future__ import annotations

from typing import Any

import torch

from musketeers.checks.tiny_llama import tiny_llama
from musketeers.config import TrainConfig

POLICY = "musketeers.checks.planted_chat:planted_chat_policy"
ROLES = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
OPEN, CLOSE = "<answer>", "</answer>"
DIGITS = tuple(str(d) for d in range(10))
SPECIALS = ("[PAD]", "[UNK]", "[EOS]")
# Tokens are separated by spaces so that the whitespace pre-tokenizer sees each one; the
# generation prompt is the single token <|assistant|>, the place C goes before.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
MAX_NEW_TOKENS = 5  # the four answer tokens and one spare: a format slip is truncated, not cut
WARMUP_STEPS = 60  # 40 left digits from 5% to 19% on seed 0; 60 gives 6-12.5%, ~2 s
BETA = 0.01  # > 0 for the KL path; why not 0.04: the module docstring
CHAT_STEPS = 80  # GRPO steps the check's margins (musketeers.checks.planted.MARGINS) are sized for
WARMUP_LR = 3e-3
WARMUP_BATCH = 32


def chat_tokenizer():
    """Word-level tokenizer, whitespace-split, with the role tokens as special tokens (so
    ``decode(skip_special_tokens=True)`` drops them, as a real chat tokenizer does)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + ROLES + (OPEN, CLOSE) + DIGITS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                  eos_token="[EOS]", additional_special_tokens=list(ROLES))
    out.chat_template = CHAT_TEMPLATE
    return out


def render(tokenizer: Any, item: Any) -> list[int]:
    """The prompt ids ``Policy.encode_prompts`` gives ``item`` (system + user turns, then
    the generation prompt), for the warm-up, which runs before there is a Policy."""
    messages = [{"role": "system", "content": item.system},
                {"role": "user", "content": item.question}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def warm_up(model: torch.nn.Module, tokenizer: Any, seed: int, *, steps: int = WARMUP_STEPS,
            lr: float = WARMUP_LR, batch: int = WARMUP_BATCH) -> list[float]:
    """Teach ``model`` the answer format with a uniformly random digit (module docstring).

    Next-token loss on the completion tokens only; every prompt is rendered from a planted
    train item. Seeded by ``seed`` alone (its own generator), so every build of the policy,
    training's and ``musketeers eval``'s, starts from the same θ_ref. Returns the losses."""
    from musketeers.tasks import build_items

    dev = next(model.parameters()).device
    prompts = [render(tokenizer, it) for it in build_items("planted", "train", limit=batch)]
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (OPEN, CLOSE, *DIGITS)}
    g = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(steps):
        digits = torch.randint(10, (len(prompts),), generator=g).tolist()
        rows = [p + [ids[OPEN], ids[DIGITS[d]], ids[CLOSE], tokenizer.eos_token_id]
                for p, d in zip(prompts, digits, strict=True)]
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full_like(input_ids, -100)  # the loss reads completion tokens only
        for i, (p, r) in enumerate(zip(prompts, rows, strict=True)):
            input_ids[i, : len(r)] = torch.tensor(r)
            labels[i, len(p): len(r)] = torch.tensor(r[len(p):])
        mask = torch.arange(width) < torch.tensor([len(r) for r in rows]).unsqueeze(1)
        out = model(input_ids=input_ids.to(dev), attention_mask=mask.long().to(dev),
                    labels=labels.to(dev))
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()
        losses.append(float(out.loss.detach()))
    model.eval()
    model.zero_grad(set_to_none=True)
    return losses


def planted_chat_policy(cfg: TrainConfig):
    """The plain check's tiny llama on the chat tokenizer, warmed up to the answer format,
    then wrapped in the project's Policy (LoRA attached after the warm-up)."""
    from musketeers.method.policy import Policy

    tokenizer = chat_tokenizer()
    model = tiny_llama(cfg, tokenizer)
    warm_up(model, tokenizer, cfg.seed)
    return Policy(model, tokenizer, lora_r=cfg.lora_r, context_position=cfg.context_position)


def chat_overrides() -> dict[str, Any]:
    """What the chat variant changes in ``planted_config``."""
    return dict(policy=POLICY, max_new_tokens=MAX_NEW_TOKENS, beta=BETA)
