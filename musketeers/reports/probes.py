"""Information before training: do an expert's pooled vectors carry what an answer needs?

A null result from training means little if C never had item information to give. This fits
cross-validated linear probes (scikit-learn's ridge classifier on standardised inputs, its
penalty chosen inside each training fold by efficient leave-one-out; closed form, so a whole
team's probes take seconds where iterative logistic fits took minutes per expert) on
each expert's cached vectors, under each pooling, to predict properties of the item:

* ``answer_sign``, ``answer_last_digit``, ``answer_magnitude`` (the gold's first number:
  sign, last digit, and log10 bucket), on items whose gold holds a number;
* ``source``: the item's dataset;
* ``policy_right``: whether the untrained policy answered the item right, read from an
  evaluation's ``eval_samples.jsonl`` (optional).

Each probe's accuracy is printed against the majority-class baseline with a 95 % Wilson
interval, and beside it the share of items whose vectors are identical to another's (first-
token pooling gives every item the same vector: no probe can beat the majority there).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from musketeers.cache.errors import UserError
from musketeers.cache.items import Item
from musketeers.cache.progress import progress

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
TARGETS = ("answer_sign", "answer_last_digit", "answer_magnitude", "source", "policy_right")


@dataclass
class ProbeResult:
    expert: str
    pooling: str
    target: str
    n: int
    accuracy: float
    majority: float
    low: float  # 95 % Wilson interval of the accuracy
    high: float
    identical: float  # share of items whose vector equals another item's

    @property
    def beats_majority(self) -> bool:
        """The interval lies wholly above the majority-class accuracy."""
        return self.low > self.majority


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion k / n (clamped to [0, 1]: at k = 0 or n the
    bound is exact, and float dust must not print as "-0")."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _gold_number(item: Item) -> float | None:
    m = _NUMBER.search(item.answer or "")
    return float(m.group()) if m else None


def labels(items: list[Item], policy_right: dict[str, bool] | None = None
           ) -> dict[str, list[object | None]]:
    """Per target, one label per item (None where the item has none)."""
    numbers = [_gold_number(it) for it in items]
    out: dict[str, list[object | None]] = {
        "answer_sign": [None if x is None else int(np.sign(x)) for x in numbers],
        "answer_last_digit": [None if x is None or x != int(x) else int(abs(x)) % 10
                              for x in numbers],
        "answer_magnitude": [None if x is None else min(int(math.log10(abs(x) + 1)), 4)
                             for x in numbers],
        "source": [it.source for it in items],
    }
    if policy_right is not None:
        out["policy_right"] = [policy_right.get(it.id) for it in items]
    return out


def read_policy_right(samples: Path) -> dict[str, bool]:
    """Item id → whether the evaluated policy scored 1 on it, from ``eval_samples.jsonl``."""
    right: dict[str, bool] = {}
    try:
        lines = samples.read_text("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {samples}: {exc}; pass an eval_samples.jsonl written "
                        "by `musketeers eval`") from None
    for n, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
            right[str(row["id"])] = float(row["score"]) >= 1.0
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{samples}:{n} is not an eval sample row (id, score); pass an "
                            "eval_samples.jsonl written by `musketeers eval`") from None
    return right


def identical_share(x: np.ndarray) -> float:
    """Share of rows equal to at least one other row."""
    _, inverse, counts = np.unique(x, axis=0, return_inverse=True, return_counts=True)
    return float((counts[inverse.reshape(-1)] > 1).mean())


def probe(x: np.ndarray, y: list[object | None], folds: int = 5, seed: int = 0
          ) -> tuple[int, float, float] | None:
    """(n, cross-validated accuracy, majority accuracy) of a linear probe of ``y`` on ``x``;
    None when fewer than two classes (or too few items per class) have labels."""
    from sklearn.linear_model import RidgeClassifierCV
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    keep = [i for i, v in enumerate(y) if v is not None]
    ys = np.array([str(y[i]) for i in keep])
    counts = Counter(ys.tolist())
    # classes with fewer items than folds cannot be stratified: they join the majority test
    common = {c for c, k in counts.items() if k >= folds}
    keep = [i for i, v in zip(keep, ys, strict=True) if v in common]
    ys = np.array([str(y[i]) for i in keep])
    if len(set(ys.tolist())) < 2:
        return None
    model = make_pipeline(StandardScaler(), RidgeClassifierCV(alphas=(1.0, 10.0, 100.0, 1e3, 1e4)))
    cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    pred = cross_val_predict(model, x[keep], ys, cv=cv)
    majority = Counter(ys.tolist()).most_common(1)[0][1] / len(ys)
    return len(ys), float((pred == ys).mean()), majority


def run_probes(vectors: dict[tuple[str, str], np.ndarray], items: list[Item],
               policy_right: dict[str, bool] | None = None) -> list[ProbeResult]:
    """Every (expert, pooling) → vectors [N, d] probed for every target."""
    targets = labels(items, policy_right)
    results = []
    with progress("probes", total=len(vectors), unit="vectors") as bar:
        for (expert, pooling), x in vectors.items():
            same = identical_share(x)
            for target, y in targets.items():
                fit = probe(x, y)
                if fit is None:
                    continue
                n, acc, majority = fit
                low, high = wilson(round(acc * n), n)
                results.append(ProbeResult(expert, pooling, target, n, acc, majority, low,
                                           high, same))
            bar.advance(1)
    return results
