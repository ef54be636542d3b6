"""Where can an expert help? Per task, before any training, on the same validation items:

* the shortcuts' exact (the best constant answer, the copied input: ``tasks.forgeries``);
* the policy's own greedy exact, untrained (``run.evaluate.greedy_samples``, no C), and,
  where asked, after a grid's supervised warm-up as its Single arm gets it (``warmup_config``);
* each expert's own greedy exact: its stored hints' scores under the task's scorer
  (``precompute --hints``);
* each expert's linear-probe accuracy for the gold answer (as a class, and its last digit)
  on each channel the store holds (pooled ``last``; the token channels' mean over tokens);
* the **headroom**: the share of items one expert answers right where the policy is wrong,
  per expert and for any expert of the team; and the same against the warmed-up policy, the
  room that is left once the supervised warm-up every arm gets has taught what it can.

A real expert can only teach what it knows and the policy does not: a task without headroom
gives a null result that was certain before training.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from musketeers.cache.errors import UserError
from musketeers.cache.items import Item

ANY = "any expert"
POOLED_PROBE = "last"  # the pooling the pooled channel's probe reads (the method's default)
TARGETS = ("gold answer", "answer_last_digit")
POSITIVE_GRID = "musketeers/configs/ablations/pocket-positive.yaml"  # the standard warm-up's


@dataclass
class ProbeCell:
    """One expert's cross-validated probe of one target on one channel."""

    expert: str
    channel: str
    target: str
    n: int  # items whose class had enough members to be probed
    accuracy: float
    majority: float


@dataclass
class TaskHeadroom:
    """One task's row: every figure on the same ``items`` validation items."""

    task: str
    policy: str
    items: int
    constant_exact: float
    copy_exact: float
    policy_exact: float
    warmup_exact: float | None  # None: not measured
    expert_exact: dict[str, float]
    headroom: dict[str, float]  # per expert, and ANY
    probes: list[ProbeCell] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    policy_right: list[bool] = field(default_factory=list)
    expert_right: dict[str, list[bool]] = field(default_factory=dict)
    warmup_right: list[bool] | None = None  # the warmed-up policy's, item by item
    warmup_headroom: dict[str, float] | None = None  # per expert and ANY, against it

    def to_json(self) -> dict:
        return asdict(self)


def headroom(policy_right: Sequence[bool], expert_right: Sequence[bool]) -> float:
    """The share of items the expert answers right where the policy answers wrong."""
    if len(policy_right) != len(expert_right):
        raise ValueError(f"{len(policy_right)} policy items against {len(expert_right)} "
                         "expert items: headroom compares the same items")
    if not policy_right:
        return 0.0
    gains = sum(e and not p for p, e in zip(policy_right, expert_right, strict=True))
    return gains / len(policy_right)


def any_right(columns: Sequence[Sequence[bool]]) -> list[bool]:
    """Per item, whether at least one expert answers it right."""
    return [any(col) for col in zip(*columns, strict=True)] if columns else []


def team_headroom(policy_right: Sequence[bool], expert_right: dict[str, Sequence[bool]]
                  ) -> dict[str, float]:
    """Headroom per expert, and for ANY expert of the team."""
    out = {e: headroom(policy_right, right) for e, right in expert_right.items()}
    out[ANY] = headroom(policy_right, any_right(list(expert_right.values())))
    return out


def shortcut_exact(items: list[Item]) -> tuple[float, float]:
    """(constant exact, copy exact) over ``items``, each source dataset's own shortcut."""
    from musketeers.tasks.forgeries import measure

    reports = measure(items, forgeries=False)
    n = max(len(items), 1)
    return (sum(r.constant_exact * r.items for r in reports) / n,
            sum(r.copy_exact * r.items for r in reports) / n)


def expert_right(cache_dir: str | Path, task: str, experts: list[str], rows: list[int]
                 ) -> dict[str, list[bool]]:
    """Per expert, whether its stored greedy answer scores 1 on each of the store's ``rows``."""
    from musketeers.cache.reader import read_hint_scores

    scores = read_hint_scores(cache_dir, task, "val", experts)
    return {e: [bool(s[r] >= 1.0) for r in rows] for e, s in zip(experts, scores, strict=True)}


def channel_vectors(cache_dir: str | Path, task: str, experts: list[str], rows: list[int]
                    ) -> dict[tuple[str, str], np.ndarray]:
    """{(expert, channel): [len(rows), d]}: the pooled vectors, and each stored token channel
    (its last stored layer) as the mean of every row's token states."""
    from musketeers.cache import reader
    from musketeers.cache.store import store_path, stored_token_layers
    from musketeers.cache.token_layout import TOKEN_CHANNELS

    out = {(e, "pooled"): x[rows] for e, x in zip(
        experts, reader.read_vectors(cache_dir, task, "val", experts, POOLED_PROBE), strict=True)}
    layers = stored_token_layers(store_path(cache_dir, task))
    for channel in TOKEN_CHANNELS if layers else ():
        try:
            units = reader.read_token_rows(cache_dir, task, "val", experts, channel, layers[-1])
        except UserError:
            continue  # this channel is not stored for every expert: probed where it is
        for e, tokens in zip(experts, units, strict=True):
            out[e, f"{channel} L{layers[-1]}"] = np.stack(
                [r.astype(np.float32).mean(0) for r in tokens.rows(rows)])
    return out


def probe_cells(vectors: dict[tuple[str, str], np.ndarray], items: list[Item]
                ) -> list[ProbeCell]:
    """Every (expert, channel)'s probes of the gold answer (as a class) and its last digit."""
    from musketeers.reports.probes import labels, probe

    targets = {"gold answer": [it.answer for it in items],
               "answer_last_digit": labels(items)["answer_last_digit"]}
    cells = []
    for (expert, channel), x in vectors.items():
        for target, y in targets.items():
            fit = probe(x, y)
            if fit is not None:
                cells.append(ProbeCell(expert, channel, target, *fit))
    return cells


def warmup_config(grid: str | Path, task: str, policy: str, cache_dir: str | Path,
                  device: str = "cpu"):
    """The TrainConfig of ``grid``'s Single arm (its first seed), moved to ``task`` and
    ``policy``: the supervised warm-up every arm of that grid gets, with no GRPO step after
    it. A grid whose Single arm has no warm-up is a UserError."""
    from musketeers.config import resolve_config
    from musketeers.design.gridspec import load_grid

    singles = [r for r in load_grid(grid).runs if r.fields.get("method") == "single"]
    if not singles:
        raise UserError(f"grid {grid} has no Single arm to copy the warm-up from; pass a grid "
                        "with method single, e.g. " + POSITIVE_GRID)
    fields = {**singles[0].fields, "task": task, "policy": policy, "cache_dir": str(cache_dir),
              "device": device, "team": None, "experts": None, "team_file": None}
    cfg = resolve_config(None, fields)
    if cfg.adapter_warmup <= 0 or cfg.warmup_policy_lr <= 0:
        raise UserError(f"grid {grid}: its Single arm has no supervised warm-up "
                        "(adapter_warmup and warmup_policy_lr > 0); pass a grid that has one")
    return cfg


def warmed_right(cfg, model, val, *, batch_size: int = 64) -> list[bool]:
    """``model``'s greedy right/wrong on ``val`` after ``cfg``'s supervised warm-up on the
    train split (``method.warmup``; no C, the LoRA alone). ``model`` is trained in place."""
    from musketeers.method import methods
    from musketeers.method.warmup import warm_up_adapter
    from musketeers.run.data import load_split
    from musketeers.run.evaluate import greedy_samples
    from musketeers.runtime.distributed import World

    train = load_split(cfg, "train", [], method=methods.get("single"))
    warm_up_adapter(cfg, model, None, train)
    samples = greedy_samples(cfg, val, model, None, World.from_env(cfg.device), batch_size,
                             f"headroom {cfg.task} after warm-up")
    return [s["score"] >= 1.0 for s in samples]


def measure_task(task: str, policy: str, experts: list[str], cache_dir: str | Path,
                 limit: int | None, *, device: str = "cpu", batch_size: int = 64,
                 policy_factory=None, warmup=None) -> TaskHeadroom:
    """``task``'s row: the store's validation items the policy's evaluation scores (each
    question once, with a gold answer; the first ``limit``), every figure on those items.
    ``warmup``: a ``warmup_config`` whose warm-up the policy gets for the warmed columns
    (None: not measured)."""
    from musketeers.config import TrainConfig
    from musketeers.method import methods
    from musketeers.run.build import build_components
    from musketeers.run.data import scored_rows
    from musketeers.run.evaluate import greedy_samples
    from musketeers.runtime.distributed import World
    from musketeers.tasks import read_checked_items

    # the store's parts first: a missing one is named before any model loads
    stored = read_checked_items(cache_dir, task, "val")
    rows = scored_rows(stored)[:limit]
    right = expert_right(cache_dir, task, experts, rows)
    vectors = channel_vectors(cache_dir, task, experts, rows)
    items = [stored[r] for r in rows]
    if warmup is not None:
        read_checked_items(cache_dir, task, "train")  # the warm-up's items, before any model
    # with a warm-up, both of the policy's columns are graded as that grid grades
    cfg = (replace(warmup, experts=list(experts)) if warmup is not None else
           TrainConfig(task=task, policy=policy, method="single", cache_dir=str(cache_dir),
                       device=device, team=None, experts=list(experts)))
    data, model, _ = build_components(cfg, "val", method=methods.get(cfg.method), limit=limit,
                                      policy_factory=policy_factory)
    if [it.id for it in data.items] != [it.id for it in items]:
        raise RuntimeError(f"{task}: the policy's items are not the experts' items")
    samples = greedy_samples(cfg, data, model, None, World.from_env(device), batch_size,
                             f"headroom {task}")
    policy_right = [s["score"] >= 1.0 for s in samples]
    # the same policy, warmed up after its untrained column: one load, the same items
    warmed = None if warmup is None else warmed_right(cfg, model, data, batch_size=batch_size)
    constant, copy = shortcut_exact(items)
    n = max(len(items), 1)
    return TaskHeadroom(
        task=task, policy=policy, items=len(items), constant_exact=constant, copy_exact=copy,
        policy_exact=sum(policy_right) / n,
        warmup_exact=None if warmed is None else sum(warmed) / n,
        expert_exact={e: sum(r) / n for e, r in right.items()},
        headroom=team_headroom(policy_right, right), probes=probe_cells(vectors, items),
        ids=[it.id for it in items], policy_right=policy_right, expert_right=right,
        warmup_right=warmed,
        warmup_headroom=None if warmed is None else team_headroom(warmed, right))
