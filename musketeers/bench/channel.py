"""Can C carry an item's answer into the policy at all? The channel, trained by supervision.

The positive control of RL (the oracle team) asks whether GRPO finds expert help that
exists. This asks the question under it: with the policy frozen, can the adapter alone be
trained to make the policy say the gold answer through C? The adapter is fitted by teacher
forcing (maximise log π(gold completion | [x ‖ C])) on the train split, by the same
warm-up a training run takes (``musketeers.method.warmup``), then the policy
answers validation items greedily with C, with C built from another item's vectors (a
derangement: the item information removed) and without C. If C from the item's own vectors
beats both, the channel carries item information and what RL lacks is signal, not capacity.

    python -m musketeers.bench.channel --task arithmetic:easier@direct --team oracle \\
        --cache-dir stores/pocket --steps 150

``--permute-targets`` asks each item another item's question and keeps its answer and states
(``musketeers.bench.permuted``): reading C is then the only way to score, and the answers are
reported by the target's length, beside the constant answer. ``--permute-share F`` does so for
a share F of the train rows only (a run's ``warmup_permute_share``), and grades the real
validation task. ``--channel`` takes a comma
list (``pooled,tokens,answer``): one fresh adapter per channel, one policy for all.
``--save`` keeps the results per item; ``--against`` pairs a run with such a file item by
item (two configurations, e.g. with and without ``--token-positions``, on the same items).
"""

from __future__ import annotations

import argparse
import json
import logging
import time

import numpy as np
import torch

from musketeers.bench import permuted
from musketeers.config import resolve_config
from musketeers.method import methods
from musketeers.method.asked import permute_targets
from musketeers.method.context import adapter_context
from musketeers.method.methods import derangement
from musketeers.method.rollout import policy_score
from musketeers.method.warmup import warm_up_adapter
from musketeers.reports.c_read import items_interval
from musketeers.run.build import build_components
from musketeers.run.evaluate import gold_nll_per_item

log = logging.getLogger("musketeers.channel")


def greedy_exact(cfg, policy, adapter, data, n: int, mode: str) -> list[bool]:
    """Greedy exact, item by item, on the first ``n`` items: C from each item's vectors
    (``own``), from another item's (``shuffled``), or no C (``none``)."""
    rows = torch.arange(min(n, len(data)))
    # C's rows: the item's own, or another's; read per slice, so a token channel's states
    # are padded per 32 items, never for the whole evaluation at once
    source = derangement(len(rows), 0) if mode == "shuffled" else rows
    right: list[bool] = []
    for lo in range(0, len(rows), 32):
        items, _, _ = data.batch(rows[lo:lo + 32])
        ctx = None
        if mode != "none":
            _, vectors, _ = data.batch(source[lo:lo + 32])
            with torch.no_grad():
                ctx, _ = adapter_context(adapter, vectors, None, cfg.device)
        comps = policy.generate(policy.encode_prompts(items), ctx, group_size=1,
                                max_new_tokens=cfg.max_new_tokens, greedy=True)
        right += [policy_score(it, policy.decode(c), cfg.extraction) >= 1.0
                  for it, c in zip(items, comps, strict=True)]
    return right


def gold_nll_items(cfg, policy, adapter, data, n: int, mode: str) -> list[float]:
    """Each of the first ``n`` items' NLL (nats) of its gold completion, teacher-forced
    (``evaluate.gold_nll_per_item``), with C as ``greedy_exact`` builds it. Far more sensitive
    than exact: C that moves the gold's probability is read, even where the greedy answer
    does not change yet."""
    rows = torch.arange(min(n, len(data)))
    source = derangement(len(rows), 0) if mode == "shuffled" else rows
    out: list[float] = []
    for lo in range(0, len(rows), 16):
        items, _, _ = data.batch(rows[lo:lo + 16])
        with torch.no_grad():
            ctx = None
            if mode != "none":
                _, vectors, _ = data.batch(source[lo:lo + 16])
                ctx, _ = adapter_context(adapter, vectors, None, cfg.device)
            out += gold_nll_per_item(policy, policy.encode_prompts(items), ctx, items)
    return out


def paired_nll(a: list[float], b: list[float]) -> dict[str, float]:
    """Mean of a − b (nats an item), paired by item, with its 95 % t interval over items and
    MDE (``reports.c_read.items_interval``, on one row)."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    low, high, least = items_interval(d[None, :])
    return {"diff": float(d.mean()), "low": low, "high": high, "mde": least}


def paired(a: list[bool], b: list[bool]) -> dict[str, float]:
    """a − b in points, paired by item, with its standard error over the items."""
    d = torch.tensor(a, dtype=torch.float64) - torch.tensor(b, dtype=torch.float64)
    return {"diff": 100 * d.mean().item(), "se": 100 * (d.std() / len(d) ** 0.5).item()}


def measure(cfg, eval_items: int, permute: bool, policy=None,
            train_items: int | None = None) -> tuple[dict, object]:
    """Warm up a fresh adapter on ``cfg``'s channel (on the first ``train_items`` train rows;
    None: all), then grade greedy answers on the first ``eval_items`` validation items with C
    from their own states, another item's and none.
    ``permute``: every split asks each row another row's question (``permuted``); the
    answers are also reported by the target's length, beside the constant answer.
    ``cfg.warmup_permute_share``: the warm-up permutes that share of the train rows only, the
    validation split stays real. Returns the results and the policy, which the next channel
    reuses."""
    reuse = policy is not None and cfg.warmup_policy_lr == 0  # a fitted LoRA is not reused
    method = methods.get(cfg.method)
    train, policy, adapter = build_components(
        cfg, "train", method=method, limit=train_items,
        policy_factory=(lambda _cfg: policy) if reuse else None)
    val, _, _ = build_components(cfg, "val", method=method, limit=eval_items,
                                 policy_factory=lambda _cfg: policy)
    if permute:
        train, val = permute_targets(train, cfg.seed), permute_targets(val, cfg.seed)
    t0 = time.perf_counter()
    rows = warm_up_adapter(cfg, policy, adapter, train)
    nll = [r["gold_nll"] for r in rows]
    log.info("warm-up: %d steps in %.0f s", len(rows), time.perf_counter() - t0)
    adapter.eval()
    out = {"task": cfg.task, "team": cfg.team, "experts": cfg.experts,
           "steps": cfg.adapter_warmup, "batch": cfg.adapter_warmup_batch,
           "lr": cfg.adapter_warmup_lr, "context_scale": cfg.context_scale,
           "eval_items": eval_items, "train_items": len(train),
           "standardize": cfg.standardize_experts, "pooling": cfg.pooling,
           "channel": cfg.channel, "token_layer": cfg.token_layer,
           "token_positions": cfg.token_positions,
           "warmup_policy_lr": cfg.warmup_policy_lr, "permute_targets": permute,
           "permute_share": cfg.warmup_permute_share,
           # a rerun on another thread count trains another adapter: kept to tell runs apart
           "seed": cfg.seed, "cache_dir": str(cfg.cache_dir), "threads": torch.get_num_threads(),
           "nll_first10": sum(nll[:10]) / 10, "nll_last10": sum(nll[-10:]) / 10}
    right = {m: greedy_exact(cfg, policy, adapter, val, eval_items, m)
             for m in ("own", "shuffled", "none")}
    graded = val.items[:len(right["own"])]
    const = permuted.constant_answer(train.items)
    right["constant"] = [policy_score(it, f"<answer>{const}</answer>", cfg.extraction) >= 1.0
                         for it in graded]
    out |= {f"exact_{m}": 100 * sum(r) / len(r) for m, r in right.items()}
    out |= {f"own_minus_{m}": paired(right["own"], right[m]) for m in ("shuffled", "none")}
    out |= {"constant_answer": const, "by_length": permuted.by_length(graded, right)}
    nll = {m: gold_nll_items(cfg, policy, adapter, val, eval_items, m)
           for m in ("own", "shuffled", "none")}
    out |= {f"val_nll_{m}": sum(v) / len(v) for m, v in nll.items()}
    out |= {f"val_nll_own_minus_{m}": paired_nll(nll["own"], nll[m])
            for m in ("shuffled", "none")}
    # kept per item, so that another configuration's run can be paired with this one
    out["per_item"] = {"question": [it.question for it in graded],
                       "length": [permuted.answer_length(it.answer or "") for it in graded],
                       "exact_own": right["own"], "nll_own": nll["own"][:len(graded)]}
    return out, policy


def against(now: dict, then: dict) -> dict[str, object]:
    """This run's own-C results minus a saved run's (``--against``), paired by item: exact
    in points (all targets, and targets of 2+ digits) and the gold's NLL, each with its 95 %
    t interval over items and MDE. The two must have graded the same items in the same
    order (same task, store, seed and ``--eval-items``), else ValueError."""
    a, b = now["per_item"], then["per_item"]
    if a["question"] != b["question"]:
        raise ValueError("the saved run graded other items; rerun it with the same --task, "
                         "--cache-dir, --seed and --eval-items")

    def diff(x: list, y: list) -> dict[str, float] | None:
        if len(x) < 2:  # no interval (e.g. no target of 2+ digits)
            return None
        d = 100 * (np.asarray(x, dtype=float) - np.asarray(y, dtype=float))
        low, high, least = items_interval(d[None, :])
        return {"n": len(d), "diff": float(d.mean()), "low": low, "high": high, "mde": least}

    long = [i for i, k in enumerate(a["length"]) if k >= 2]
    return {"exact_own": diff(a["exact_own"], b["exact_own"]),
            "exact_own_2plus_digits": diff([a["exact_own"][i] for i in long],
                                           [b["exact_own"][i] for i in long]),
            "nll_own": paired_nll(a["nll_own"], b["nll_own"])}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="arithmetic:easier@direct")
    ap.add_argument("--team", default="oracle")
    ap.add_argument("--experts", default=None,
                    help="comma-separated experts instead of --team (e.g. the oracle alone)")
    ap.add_argument("--cache-dir", default="stores")
    ap.add_argument("--policy", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--context-scale", default="embedding")
    ap.add_argument("--pooling", default="last", help="the experts' pooling (as train's)")
    ap.add_argument("--channel", default="pooled",
                    help="pooled, tokens or answer (as train's); a comma list runs each")
    ap.add_argument("--token-layer", type=int, default=-1, help="a token channel's layer")
    ap.add_argument("--token-positions", action="store_true",
                    help="add each expert token's position code (token_positions)")
    ap.add_argument("--standardize", action="store_true",
                    help="centre and scale the expert vectors first (standardize_experts)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--eval-items", type=int, default=200)
    ap.add_argument("--train-items", type=int, default=None,
                    help="warm up on the first N train rows only (default: the whole split): "
                         "does the read generalise from more items or is it learnt per item?")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup-policy-lr", type=float, default=0.0,
                    help="fit the policy's LoRA beside φ at this lr (warmup_policy_lr; 0: frozen)")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="a greedy answer's new tokens (default: the pocket budget's)")
    ap.add_argument("--permute-targets", action="store_true",
                    help="ask each item another item's question, keep its answer and states: "
                         "C is the only way to score (musketeers.bench.permuted)")
    ap.add_argument("--permute-share", type=float, default=0.0,
                    help="permute a share (0-1) of the train rows only (warmup_permute_share), "
                         "grade the real validation task: does C read there stay read here?")
    ap.add_argument("--save", default=None, help="write the results (per item too) as JSON")
    ap.add_argument("--against", default=None,
                    help="a --save file of another configuration on the same items: print "
                         "this run's own-C exact and gold NLL minus its, paired by item")
    args = ap.parse_args(argv)
    if not 0.0 <= args.permute_share <= 1.0:
        ap.error(f"--permute-share {args.permute_share} is a share of rows; give one in [0, 1]")
    if args.train_items is not None and args.train_items < 2:
        ap.error(f"--train-items {args.train_items}: give at least 2 rows (a permutation "
                 "needs two), or leave it out for the whole split")
    if args.permute_share and args.permute_targets:
        ap.error("--permute-targets already permutes every row; drop --permute-share")
    saved = {}
    if args.against:  # checked before any training: a bad file must not cost the run
        try:
            saved = {r["channel"]: r for r in json.loads(open(args.against, encoding="utf-8")
                                                         .read()) if "per_item" in r}
        except (OSError, ValueError, TypeError, KeyError) as exc:
            ap.error(f"--against {args.against} is not a --save file ({exc}); rerun the other "
                     "configuration with --save")
        if missing := [c for c in args.channel.split(",") if c not in saved]:
            ap.error(f"--against {args.against} holds no channel {', '.join(missing)}; pass "
                     "the --save file of a run on the same channels")
    unpaired = []
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    team = ({"experts": args.experts.split(",")} if args.experts else {"team": args.team})
    results, policy = [], None
    for channel in args.channel.split(","):
        cfg = resolve_config(overrides=dict(
            task=args.task, **team, cache_dir=args.cache_dir, policy=args.policy,
            budget="pocket", extraction="lenient", context_scale=args.context_scale,
            dtype=args.dtype, seed=args.seed, run_dir="runs/channel",
            standardize_experts=args.standardize, pooling=args.pooling, channel=channel,
            token_layer=args.token_layer, token_positions=args.token_positions,
            adapter_warmup=args.steps,
            adapter_warmup_lr=args.lr, adapter_warmup_batch=args.batch,
            warmup_policy_lr=args.warmup_policy_lr, warmup_permute_share=args.permute_share,
            **({} if args.max_new_tokens is None else {"max_new_tokens": args.max_new_tokens})))
        out, policy = measure(cfg, args.eval_items, args.permute_targets, policy,
                              args.train_items)
        if saved:  # the saved run of the same channel; a mismatch is said, the run kept
            try:
                out["against"] = against(out, saved[channel])
            except ValueError as exc:
                unpaired.append(f"--against, channel {channel}: {exc}")
        print(json.dumps({k: v for k, v in out.items() if k != "per_item"}))
        results.append(out)
    if args.save:
        with open(args.save, "w", encoding="utf-8") as f:
            json.dump(results, f)
    if args.permute_targets:
        conditions = ["own", "shuffled", "none", "constant"]
        for out in results:
            print("\n".join(["", *permuted.length_table(out["channel"], out["by_length"],
                                                        conditions)]))
    if unpaired:
        raise SystemExit("; ".join(unpaired))
    return results


if __name__ == "__main__":
    main()
