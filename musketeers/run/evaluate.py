"""Greedy validation metrics of a trained run, with or without its context tokens C.

Over the cached ``val`` split, one greedy completion per prompt: ``exact`` is the share of
completions scoring 1 (the answer is right), ``score`` the mean task score (Reasoning Gym
gives partial credit: gold ``5``, answer ``15`` scores 0.5), so the two name different
quantities and are never both called "accuracy".
``no_context`` drops C from the prompt: π_θ(y | x) against π_θ(y | [x ‖ C]), the paper's
Figure 5 comparison. Written to ``RUN_DIR/eval.json`` / ``eval_no_context.json``, with every
completion beside it (``eval_samples.jsonl`` / ``eval_no_context_samples.jsonl``: question,
gold answer, completion, extracted answer, score), so a low score can be read, not guessed:
``answered`` is the share of completions with an ``<answer>…</answer>`` to grade at all,
``truncated`` the share cut off at ``max_new_tokens`` before an end-of-turn token.
``by_source`` breaks items, exact and score down by each item's source dataset: a mix's total
can hide that one dataset carries every gain. ``gold_nll`` is each item's NLL (nats) of its
gold completion, teacher-forced under the same prompt and C: a C the policy reads lowers it
long before a greedy answer flips, so with and without C it says whether C is read at all.

Under ``torchrun`` the ranks take turns at the length batches and rank 0 gathers every
completion and writes the files: the same batches, so the same completions as one process.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from pathlib import Path
from typing import Any

import torch

from musketeers.cache.devices import dtype_name
from musketeers.cache.errors import UserError
from musketeers.cache.progress import progress
from musketeers.config import read_run_config, resume_command
from musketeers.method import methods
from musketeers.method.context import adapter_context
from musketeers.method.methods import Method
from musketeers.method.rollout import policy_score
from musketeers.method.warmup import gold_completion
from musketeers.run import checkpoint as ckpt
from musketeers.run import runfolder
from musketeers.run.build import PolicyFactory, build_components
from musketeers.run.runlog import by_source, eval_files
from musketeers.runtime.distributed import World
from musketeers.runtime.machine import cpu_facts
from musketeers.tasks import extract_answer


def evaluate(run_dir: Path, *, limit: int | None = None, no_context: bool = False,
             batch_size: int = 64, policy_factory: PolicyFactory | None = None,
             unverified: bool = False) -> dict[str, Any]:
    """Score the last checkpoint of ``run_dir`` on the val split; returns what it writes.
    ``unverified`` (``--unverified``) scores a checkpoint that has no manifest signed by this
    user (musketeers.run.checkpoint)."""
    run_dir = Path(run_dir)
    if limit is not None and limit < 1:
        raise UserError(f"--limit must be >= 1, got {limit}")
    cfg = read_run_config(run_dir)
    again = f"musketeers eval {shlex.quote(str(run_dir))}" + (" --no-context" * no_context)
    method = methods.get(cfg.method)  # resolved once: every part of the evaluation reads it
    world = World.from_env(cfg.device)
    with world.failures(again):
        world.on_rank0(lambda: _check_before(cfg, method, run_dir, again, unverified))
        return _evaluate(cfg, method, run_dir, world, again, limit=limit,
                         no_context=no_context, batch_size=batch_size,
                         policy_factory=policy_factory, unverified=unverified)


def _check_before(cfg, method: Method, run_dir: Path, again: str, unverified: bool) -> None:
    """What is refused before any model loads."""
    _intact_last(run_dir, unverified)
    runfolder.check_config(cfg, run_dir)  # a config.yaml edited since training is not its run
    # as --resume does: never score on a replaced store
    runfolder.check_store(cfg, run_dir, runfolder.store_fingerprints(cfg, method))
    # a folder it cannot write is refused now, not after the whole evaluation has run
    runfolder.check_writable(run_dir, again)


def _evaluate(cfg, method: Method, run_dir: Path, world: World, again: str, *, limit: int | None,
              no_context: bool, batch_size: int, policy_factory: PolicyFactory | None,
              unverified: bool) -> dict[str, Any]:
    data, policy, adapter = build_components(cfg, "val", limit=limit or cfg.eval_limit,
                                             policy_factory=policy_factory, method=method)
    last = load_newest(run_dir, policy.model, adapter, unverified=unverified)
    if adapter is not None:
        adapter.eval()  # hard routing: argmax instead of Gumbel sampling
    samples = greedy_samples(cfg, data, policy, None if no_context else adapter, world,
                             batch_size, f"eval {run_dir.name}", gold_nll=True)
    if world.rank:
        return world.broadcast(None)
    n = max(len(samples), 1)
    result = {
        "exact": sum(s["score"] >= 1.0 for s in samples) / n,
        "score": sum(s["score"] for s in samples) / n,
        "n": len(samples),
        "completion_len": sum(s["tokens"] for s in samples) / n,
        "answered": sum(s["answer"] is not None for s in samples) / n,
        # under lenient extraction "answered" counts last lines too: this is the tag alone
        "tagged": sum(extract_answer(s["completion"], "strict") is not None
                      for s in samples) / n,
        "truncated": sum(not s["ended"] for s in samples) / n,
        "by_source": by_source(samples),
        "gold_nll": sum(s["gold_nll"] for s in samples) / n,
        "context": not no_context and adapter is not None,
        "method": cfg.method,
        "extraction": cfg.extraction,
        "checkpoint": last.name,
        "dtype": dtype_name(policy.dtype),  # as resolved on the machine that evaluated
        "machine": cpu_facts(),  # which may not be the one that trained
        "limit": limit or cfg.eval_limit,  # the size asked: a grid publishes only its own
    }
    write_eval(run_dir, result, samples, no_context, again)
    return world.broadcast(result)


def greedy_samples(cfg, data, policy, adapter: torch.nn.Module | None, world: World,
                   batch_size: int, label: str, gold_nll: bool = False
                   ) -> list[dict[str, Any]]:
    """One greedy completion per item of ``data``, with C from ``adapter`` (None: no C), in
    the split's order: its text, extracted answer and score, and with ``gold_nll`` the
    gold's NLL (``gold_nll_per_item``: an evaluation's, not a headroom table's). Under
    torchrun the ranks take turns at the length batches; rank 0 gets every sample, the others
    an empty list."""
    prompts = policy.encode_prompts(data.items)
    by_sample: dict[int, dict[str, Any]] = {}
    mine = longest_first_batches(prompts, batch_size)[world.rank::world.world]
    with progress(label, total=sum(len(r) for r in mine), unit="items") as bar, \
            torch.no_grad():
        for rows in mine:
            items, vectors, router = data.batch(rows)
            context, _ = adapter_context(adapter, vectors, router, cfg.device)
            asked = [prompts[i] for i in rows.tolist()]
            comps = policy.generate(asked, context, group_size=1,
                                    max_new_tokens=cfg.max_new_tokens, greedy=True)
            nll = (gold_nll_per_item(policy, asked, context, items) if gold_nll
                   else [None] * len(items))
            for i, it, c, g in zip(rows.tolist(), items, comps, nll, strict=True):
                text = policy.decode(c)
                by_sample[i] = {"id": it.id, "source": it.source, "question": it.question,
                                "gold": it.answer, "completion": text, "tokens": len(c),
                                "ended": bool(c) and c[-1] in policy.eos_ids,
                                "answer": extract_answer(text, cfg.extraction),
                                "score": policy_score(it, text, cfg.extraction),
                                **({} if g is None else {"gold_nll": g})}
            bar.advance(len(items))
    for part in world.all_gather(by_sample if world.rank else {})[1:]:
        by_sample.update(part)
    if world.rank:
        return []
    return [by_sample[i] for i in range(len(data))]  # the split's order, whatever the batches


def gold_nll_per_item(policy, prompts: list[list[int]], context: torch.Tensor | None,
                      items: list) -> list[float]:
    """Each item's NLL (nats, summed over its tokens) of the completion its scorer grades as
    right (``warmup.gold_completion``: the warm-up's objective), teacher-forced under its
    prompt and C."""
    golds = [gold_completion(policy, it.answer or "") for it in items]
    logp, mask = policy.completion_logprobs(prompts, context, golds)
    return [round(v, 4) for v in (-(logp * mask).sum(dim=1)).tolist()]


def write_eval(run_dir: Path, result: dict[str, Any], samples: list[dict[str, Any]],
               no_context: bool, again: str) -> None:
    """Samples, then the result, each to a temporary file renamed into place: a full disk
    leaves the earlier evaluation's files whole, never an empty or torn one. The result
    records the samples' sha256 (``samples_sha256``) and is written last, so it commits the
    pair: a kill between the two leaves a result that disagrees with its samples, which the
    grid re-evaluates and never publishes (``grid.status.eval_sound``)."""
    result_file, samples_file = eval_files(context=not no_context)
    lines = "".join(json.dumps(s) + "\n" for s in samples)
    result["samples_sha256"] = hashlib.sha256(lines.encode()).hexdigest()
    with runfolder.write_errors(run_dir, again):
        for name, text in ((samples_file, lines), (result_file, json.dumps(result, indent=2))):
            tmp = run_dir / f"{name}.tmp"
            try:
                tmp.write_text(text)
                os.replace(tmp, run_dir / name)
            finally:
                tmp.unlink(missing_ok=True)


def _intact_last(run_dir: Path, unverified: bool = False) -> Path:
    """The newest checkpoint, refused when absent or damaged."""
    last = ckpt.latest_checkpoint(run_dir)
    if last is None:
        raise UserError(f"{run_dir} has no checkpoint yet; continue its training with: "
                        f"{resume_command(run_dir)}")
    damage = ckpt.verify_checkpoint(last, unverified, flag="--unverified")
    if damage is not None and last.exists():  # scoring damaged weights: a number nobody trained
        raise UserError(f"checkpoint {last} is damaged ({damage}); rewrite it from the newest "
                        f"intact one with: {resume_command(run_dir)}")
    return last


def load_newest(run_dir: Path, model: torch.nn.Module, adapter: torch.nn.Module | None,
                tries: int = 5, unverified: bool = False) -> Path:
    """Load the newest checkpoint's weights. A training still running prunes old checkpoints
    as it saves new ones: one that vanishes while it is read is replaced by the newer one."""
    for _ in range(tries):
        last = _intact_last(run_dir, unverified)
        try:
            ckpt.load_weights(last, model, adapter)
            return last
        except Exception as exc:  # noqa: BLE001 - a file gone mid-read: pruned, unless it is there
            if not last.exists():
                continue
            if isinstance(exc, ckpt.DamagedCheckpoint):
                raise UserError(f"checkpoint {last} is damaged ({exc}); rewrite it from the "
                                f"newest intact one with: {resume_command(run_dir)}"
                                ) from None
            raise
    raise UserError(f"{run_dir}'s checkpoints kept being replaced while they were read; "
                    f"evaluate it once training has ended: musketeers eval "
                    f"{shlex.quote(str(run_dir))}")


def longest_first_batches(prompts: list[list[int]], batch_size: int) -> list[torch.Tensor]:
    """Row indices in batches of ``batch_size`` rows, the prompts sorted longest first (a fixed
    size: greedy decoding's rows run to their own ends, no cost model to minimise).

    A batch is left-padded to its longest prompt and the prefill computes every pad column:
    in split order, algorithmic:easy@direct's prompts (mean 131 tokens, up to 269) padded a
    batch of 64 to ~2× its real tokens. Greedy decoding gives each row what it would give
    alone, so grouping by length changes no completion, only the padding.
    """
    order = sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), i))
    return [torch.tensor(order[k: k + batch_size]) for k in range(0, len(order), batch_size)]
