"""What names a table cell: a run's group key, and the runs that match one.

A cell is the runs that share every group field but the seed. The channel is one of them, so
a grid that varies ``--channel`` keeps its channels apart. A run whose config predates
channels (no ``channel`` field) read the pooled vectors, and its key says so.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from musketeers.cache.tokens import POOLED
from musketeers.config import DEFAULT_TOKEN_LAYER
from musketeers.method.methods import ignored
from musketeers.tasks.variants import task_family

GROUP_FIELDS = ("task", "method", "team", "pooling", "channel", "token_layer", "token_positions",
                "latents", "warmup_permute_share")
# a run's warm-up share of rows asked another question (0: none, and every run before the field)
SHARE = "warmup_permute_share"


def channel_fields(config: dict[str, Any]) -> dict[str, Any]:
    """``pooling``, ``channel``, ``token_layer`` and ``token_positions`` as a cell names them.
    The pooling names only the pooled channel's vectors, the token layer and positions only a
    token channel's states; what a run did not read is None, so that two runs reading the
    same thing share a cell (a run from before positions had none)."""
    channel = config.get("channel") or POOLED
    if channel == POOLED:
        return {"pooling": config.get("pooling"), "channel": POOLED, "token_layer": None,
                "token_positions": None}
    layer = config.get("token_layer")
    return {"pooling": None, "channel": channel,
            "token_layer": DEFAULT_TOKEN_LAYER if layer is None else layer,
            "token_positions": bool(config.get("token_positions"))}


def group_key(config: dict[str, Any]) -> dict[str, Any]:
    """The fields that define a table cell; seeds of one key are averaged. A task variant
    (``arithmetic:easy@direct``) fills its base task's column; ``Cell.variants`` names it."""
    key = {k: config.get(k) for k in GROUP_FIELDS} | channel_fields(config)
    key[SHARE] = float(config.get(SHARE) or 0.0)
    if isinstance(key["task"], str):
        key["task"] = task_family(key["task"])
    for k in ignored(key["method"]):
        if k in key:
            key[k] = None
    return key


class Keyed(Protocol):
    @property
    def key(self) -> dict[str, Any]: ...


R = TypeVar("R", bound=Keyed)


def select(runs: list[R], **key: Any) -> list[R]:
    """Runs whose group key matches every given field (None matches a dropped field). The
    warm-up's share matches 0 unless given: a cell never mixes warm-ups on permuted rows into
    one that does not name them."""
    key = {SHARE: 0.0, **key}
    out = []
    for run in runs:
        rk = run.key
        if all(rk.get(k) == (None if k in ignored(rk["method"]) else v)
               for k, v in key.items()):
            out.append(run)
    return out
