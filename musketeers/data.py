"""What a run reads from the feature cache: a split's items and pooled vectors, read once.

The whole split's pooled vectors go into memory as one tensor per expert (N × d_i floats: a
16,000-item split of a 896-d expert is 57 MB), so a training step indexes rows in memory and
never touches a Zarr chunk. ``hard_routing`` also reads the router embeddings; ``output_collab``
reads the experts' cached hints and puts them into the prompt as text (paper Eq. 12).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from musketeers.cache import reader
from musketeers.cache.items import Item
from musketeers.config import TrainConfig

HINTS_HEADER = "[Expert Hints]"


@dataclass
class SplitData:
    """A split of the cache in memory: rows line up across every field."""

    items: list[Item]
    expert_names: list[str]
    vectors: list[torch.Tensor]  # [N, d_i] per expert; empty for methods without C
    router: torch.Tensor | None  # [N, 384] for hard_routing

    def __len__(self) -> int:
        return len(self.items)

    @property
    def expert_dims(self) -> list[int]:
        return [int(v.shape[1]) for v in self.vectors]

    def batch(self, idx: torch.Tensor
              ) -> tuple[list[Item], list[torch.Tensor], torch.Tensor | None]:
        """The rows ``idx`` of every field."""
        items = [self.items[i] for i in idx.tolist()]
        vectors = [v[idx] for v in self.vectors]
        router = self.router[idx] if self.router is not None else None
        return items, vectors, router


def with_hints(item: Item, hints: list[str], expert_names: list[str]) -> Item:
    """Eq. 12's output-level collaboration: the experts' answers as a text block in the prompt."""
    lines = [f"- {name}: {hint.strip()}" for name, hint in zip(expert_names, hints, strict=True)]
    block = "\n".join([HINTS_HEADER, *lines])
    return replace(item, question=f"{item.question}\n\n{block}")


def load_split(cfg: TrainConfig, split: str, expert_names: list[str],
               limit: int | None = None) -> SplitData:
    """Read ``split`` of ``cfg.task`` for the run's method, once.

    ``single`` reads only the items: it needs no expert at all, so it trains on any store.
    A store missing an expert of the team raises the reader's UserError naming the
    ``musketeers precompute`` command that fills it.
    """
    names = [] if cfg.method == "single" else list(expert_names)
    # the experts' arrays first: a missing store's error then names the team's experts
    hints = arrays = None
    if cfg.method == "output_collab":
        hints = reader.read_hints(cfg.cache_dir, cfg.task, split, names)
    elif names:
        arrays = reader.read_vectors(cfg.cache_dir, cfg.task, split, names, cfg.pooling,
                                     seed=cfg.seed)
    items = reader.read_items(cfg.cache_dir, cfg.task, split)
    n = len(items) if limit is None else min(limit, len(items))
    items = items[:n]
    vectors: list[torch.Tensor] = []
    router = None
    if hints is not None:
        items = [with_hints(it, hints[i], names) for i, it in enumerate(items)]
    elif arrays is not None:
        vectors = [torch.from_numpy(a[:n]).float().contiguous() for a in arrays]
        if cfg.method == "hard_routing":
            router = torch.from_numpy(reader.read_router(cfg.cache_dir, cfg.task, split)[:n])
            router = router.float().contiguous()
    return SplitData(items=items, expert_names=names, vectors=vectors, router=router)
