"""What a run reads from the feature cache: a split's items and pooled vectors, read once.

The whole split's pooled vectors go into memory as one tensor per expert (N × d_i floats: a
16,000-item split of a 896-d expert is 57 MB), so a training step indexes rows in memory and
never touches a Zarr chunk. ``hard_routing`` also reads the router embeddings; ``output_collab``
reads the experts' cached hints and puts them into the prompt as text (paper Eq. 12).

A token channel (``--channel tokens|answer``) is a hundred times larger (every token of every
item), so it is never loaded whole: the split keeps each expert's ``TokenRows`` (the store's
arrays, opened lazily) and each batch reads and pads only its own rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from musketeers.cache import reader
from musketeers.cache.items import Item
from musketeers.cache.tokens import POOLED, TokenRows
from musketeers.config import TrainConfig
from musketeers.method import methods
from musketeers.method.expert_tokens import ExpertInput, ExpertTokens
from musketeers.method.methods import Method
from musketeers.runtime.seeds import derived_seed
from musketeers.tasks import read_checked_items

HINTS_HEADER = "[Expert Hints]"
# train rows whose token states fit standardize_experts' per-dimension statistics: a bounded
# sample (each row holds ~100 tokens: thousands of states per dimension), so fitting never
# reads a whole split's tokens
STANDARDIZER_ROWS = 64


@dataclass
class SplitData:
    """A split of the cache in memory: rows line up across every field."""

    items: list[Item]
    expert_names: list[str]
    vectors: list[torch.Tensor]  # [N, d_i] per expert (channel pooled); empty for methods without C
    router: torch.Tensor | None  # [N, 384] for hard_routing
    # a token channel: each expert's rows in the store, read per batch, and the store row each
    # of this split's rows reads (the val split's scored rows, shuffled_experts' derangement)
    tokens: list[TokenRows] = field(default_factory=list)
    token_rows: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.items)

    def standardizer_sample(self, seed: int = 0) -> list[torch.Tensor]:
        """What ``standardize_experts`` fits on, [M, d_i] per expert: the pooled vectors of the
        whole split, or the real token states of at most STANDARDIZER_ROWS seeded rows."""
        if not self.tokens:
            return self.vectors
        rng = np.random.default_rng(seed)
        n = len(self)
        pick = np.sort(rng.choice(n, size=min(n, STANDARDIZER_ROWS), replace=False))
        rows = self._store_rows(torch.from_numpy(pick))
        return [torch.from_numpy(np.concatenate(t.rows(rows))) for t in self.tokens]

    def _store_rows(self, idx: torch.Tensor) -> list[int]:
        assert self.token_rows is not None
        return self.token_rows[idx.numpy()].tolist()

    def constant_experts(self) -> list[str]:
        """Experts whose pooled vector is the same for every item. A chat expert's first token
        is its template's first token, and causal attention gives it the same state whatever
        follows (first_token pooling); such a vector carries the expert's identity, not what it
        makes of the prompt, and the report says so beside the cell."""
        if not self.vectors:  # hints (output_collab) or a token channel: no pooled vector
            return []
        return [name for name, v in zip(self.expert_names, self.vectors, strict=True)
                if len(v) > 1 and bool((v == v[0]).all())]

    @property
    def expert_dims(self) -> list[int]:
        if self.tokens:
            return [t.dim for t in self.tokens]
        return [int(v.shape[1]) for v in self.vectors]

    def batch(self, idx: torch.Tensor
              ) -> tuple[list[Item], list[ExpertInput], torch.Tensor | None]:
        """The rows ``idx`` of every field; a token channel's rows read from the store now,
        padded to the batch's longest (``ExpertTokens``)."""
        items = [self.items[i] for i in idx.tolist()]
        vectors: list[ExpertInput] = [v[idx] for v in self.vectors]
        if self.tokens:
            rows = self._store_rows(idx)
            vectors = [ExpertTokens(*map(torch.from_numpy, t.padded(rows))) for t in self.tokens]
        router = self.router[idx] if self.router is not None else None
        return items, vectors, router


_EPOCH_TAG = 0xE90C


def epoch_rows(n: int, seed: int, step: int, per_step: int) -> torch.Tensor:
    """The rows of update ``step``: positions [step·per_step, (step+1)·per_step) of an endless
    sequence of epochs, each a fresh permutation of the n rows seeded by (seed, epoch).

    Every row is drawn once per epoch (the paper's 500 steps × 32 prompts are one pass over
    its 16,000 items), and the rows of any step follow from (seed, step) alone: a resumed run
    draws the same rows with no sampler state to save.
    """
    start, stop = step * per_step, (step + 1) * per_step
    parts = []
    for epoch in range(start // n, (stop - 1) // n + 1):
        g = torch.Generator().manual_seed(derived_seed(seed, _EPOCH_TAG, epoch))
        perm = torch.randperm(n, generator=g)
        lo, hi = max(start - epoch * n, 0), min(stop - epoch * n, n)
        parts.append(perm[lo:hi])
    return torch.cat(parts)


def with_hints(item: Item, hints: list[str], expert_names: list[str]) -> Item:
    """Eq. 12's output-level collaboration: the experts' answers as a text block in the prompt."""
    lines = [f"- {name}: {hint.strip()}" for name, hint in zip(expert_names, hints, strict=True)]
    block = "\n".join([HINTS_HEADER, *lines])
    return replace(item, question=f"{item.question}\n\n{block}")


def scored_rows(items: list[Item]) -> list[int]:
    """The validation rows a result is measured on: each question once, and only with a gold
    answer. A repeated question would count one item twice in a paired comparison, and an item
    without gold scores 0 under every method."""
    seen: set[str] = set()
    rows = []
    for i, it in enumerate(items):
        if it.answer is not None and it.question not in seen:
            seen.add(it.question)
            rows.append(i)
    return rows


def load_split(cfg: TrainConfig, split: str, expert_names: list[str],
               *, method: Method, limit: int | None = None) -> SplitData:
    """Read ``split`` of ``cfg.task`` for the run's method, once: what the method's registry
    entry says it reads (``musketeers.method.methods``).

    A method that reads no expert (``single``) trains on any store. A store missing an expert
    of the team raises the reader's UserError naming the ``musketeers precompute`` command
    that fills it. The ``shuffled_experts`` control gets every row's vectors (or tokens) from
    another row (a seeded derangement, the same for every split of the run). A method that
    computes the same on every channel (``zero_context``) reads the pooled vectors.
    """
    names = list(expert_names) if method.uses_experts else []
    channel = methods.token_channel(method, cfg.channel) or POOLED
    # the experts' arrays first: a missing store's error then names the team's experts
    hints = arrays = None
    tokens: list[TokenRows] = []
    if "hints" in method.reads:
        hints = reader.read_hints(cfg.cache_dir, cfg.task, split, names)
    if "vectors" in method.reads and channel != POOLED:
        tokens = reader.read_token_rows(cfg.cache_dir, cfg.task, split, names, channel,
                                        cfg.token_layer)
    elif "vectors" in method.reads:
        arrays = reader.read_vectors(cfg.cache_dir, cfg.task, split, names, cfg.pooling,
                                     seed=cfg.seed)
    items = read_checked_items(cfg.cache_dir, cfg.task, split)
    rows = scored_rows(items) if split == "val" else list(range(len(items)))
    rows = rows if limit is None else rows[:limit]
    n = len(rows)
    items = [items[i] for i in rows]
    vectors: list[torch.Tensor] = []
    router = None
    if hints is not None:
        items = [with_hints(it, hints[r], names) for r, it in zip(rows, items, strict=True)]
    if arrays is not None:
        vectors = [torch.from_numpy(a[rows]).float().contiguous() for a in arrays]
    if (arrays is not None or tokens) and "router" in method.reads:
        router = torch.from_numpy(reader.read_router(cfg.cache_dir, cfg.task, split)[rows])
        router = router.float().contiguous()
    token_rows = np.asarray(rows, dtype=np.int64) if tokens else None
    if method.shuffle_vectors:
        perm = methods.derangement(n, cfg.seed)
        vectors = [v[perm] for v in vectors]
        router = router[perm] if router is not None else None
        token_rows = token_rows[perm.numpy()] if token_rows is not None else None
    return SplitData(items=items, expert_names=names, vectors=vectors, router=router,
                     tokens=tokens, token_rows=token_rows)
