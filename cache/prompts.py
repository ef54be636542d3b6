"""One prompt renderer for the experts (precompute) and the policy (rollouts, evaluation).

An expert's pooled vector and the policy's completion must be conditioned on the same prompt
text, so both paths call :func:`render_prompt`; a second formatter would let the two drift
(one folding the system turn, the other dropping it) without any test noticing.

The rendering, in order of preference:

1. the tokenizer's chat template, (system, user) turns and the generation prompt;
2. when that template refuses a system role (it raises jinja's ``TemplateError``, as
   Gemma-2's ``raise_exception('System role not supported')`` does), the system text folded
   into the user turn: ``"{system}\\n\\n{question}"``;
3. without a template, the plain text ``"{system}\\n\\n{question}"`` with the tokenizer's own
   special tokens (Gemma needs its ``<bos>``).

Templated text already holds its special tokens, so it is tokenized without adding them again.
"""

from __future__ import annotations

from typing import Any

from jinja2.exceptions import TemplateError


def prompt_parts(item: Any) -> tuple[str | None, str]:
    """(system, question) of an Item, a ``{"system", "question"}`` mapping or a bare question."""
    if isinstance(item, str):
        return None, item
    if isinstance(item, dict):
        return item.get("system"), item["question"]
    return getattr(item, "system", None), item.question


ORACLE_SUFFIX = "\n\nThe answer is {answer}."


def oracle_view(item: Any) -> dict[str, Any]:
    """What an oracle expert reads: ``item``'s question followed by its gold answer.

    The positive control of "can expert help be seen": if a policy reading these vectors does
    not beat one that does not, the setup cannot detect help, whatever the real experts hold.
    """
    system, question = prompt_parts(item)
    answer = item.get("answer") if isinstance(item, dict) else getattr(item, "answer", None)
    if answer is None:
        return {"system": system, "question": question}
    return {"system": system, "question": question + ORACLE_SUFFIX.format(answer=answer)}


def folded(system: str | None, question: str) -> str:
    """The system text and the question as one turn (no template, or no system role)."""
    return f"{system}\n\n{question}" if system else question


def has_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_text(tokenizer: Any, item: Any) -> str:
    """The prompt text of ``item`` as :func:`render_prompt` tokenizes it."""
    system, question = prompt_parts(item)
    if not has_template(tokenizer):
        return folded(system, question)
    user = {"role": "user", "content": question}
    if system:
        try:
            return tokenizer.apply_chat_template(
                [{"role": "system", "content": system}, user],
                tokenize=False, add_generation_prompt=True)
        except TemplateError:  # the template refuses a system role: fold it into the user turn
            user = {"role": "user", "content": folded(system, question)}
    return tokenizer.apply_chat_template([user], tokenize=False, add_generation_prompt=True)


def render_prompt(tokenizer: Any, item: Any) -> list[int]:
    """Token ids of ``item``'s prompt, the same for every expert and the policy (see above)."""
    text = render_text(tokenizer, item)
    return tokenizer(text, add_special_tokens=not has_template(tokenizer))["input_ids"]


def generation_prompt_len(tokenizer: Any) -> int:
    """Tokens the chat template appends for ``add_generation_prompt`` (0 without a template):
    where the policy's context tokens go by default (before the assistant header)."""
    if not has_template(tokenizer):
        return 0
    messages = [{"role": "user", "content": "1"}]
    ids = [tokenizer(tokenizer.apply_chat_template(messages, tokenize=False,
                                                   add_generation_prompt=gen),
                     add_special_tokens=False)["input_ids"] for gen in (False, True)]
    without, with_gen = ids
    return len(with_gen) - len(without) if with_gen[: len(without)] == without else 0


__all__ = ["render_prompt", "render_text", "prompt_parts", "generation_prompt_len", "oracle_view"]
