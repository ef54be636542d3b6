"""What Policy's passes share: the common head, rows of a KV cache, chunks by length."""

import itertools
import random

import torch
from transformers.cache_utils import DynamicCache

from musketeers.cache.batching import length_batches
from musketeers.method.policy import common_head
from musketeers.method.teacher_forced import cache_rows


def test_common_head_is_the_longest_shared_start_within_every_limit():
    a, b, c = [1, 2, 3, 4, 9], [1, 2, 3, 5], [1, 2, 3, 4, 8]
    assert common_head([a, b, c], [9, 9, 9]) == 3
    assert common_head([a, c], [9, 9]) == 4
    assert common_head([a, c], [9, 2]) == 2  # a limit caps it
    assert common_head([a], [9]) == 0  # one prompt shares nothing
    assert common_head([[7, 1], [1, 7]], [2, 2]) == 0


def _padded_tokens(chunks, lengths, fixed):
    return sum(len(ch) * max(lengths[i] for i in ch) + fixed for ch in chunks)


def _partitions(order):
    """Every split of ``order`` into consecutive runs."""
    for cuts in itertools.product([False, True], repeat=len(order) - 1):
        runs, cur = [], [order[0]]
        for cut, i in zip(cuts, order[1:], strict=True):
            if cut:
                runs.append(cur)
                cur = []
            cur.append(i)
        yield runs + [cur]


def test_length_chunks_cover_every_row_once_at_the_least_cost():
    rng = random.Random(0)
    for _ in range(30):
        lengths = [rng.randint(1, 32) for _ in range(rng.randint(1, 9))]
        fixed = rng.choice([0, 4, 32, 1000])
        chunks = length_batches(lengths, overhead=fixed)
        assert sorted(i for ch in chunks for i in ch) == list(range(len(lengths)))
        order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
        best = min(_padded_tokens(p, lengths, fixed) for p in _partitions(order))
        assert _padded_tokens(chunks, lengths, fixed) == best
    # costly forwards: one chunk; free ones: no padding at all
    assert length_batches([3, 9, 3, 9], overhead=1000) == [[1, 3, 0, 2]]
    assert length_batches([3, 9, 3, 9], overhead=0) == [[1, 3], [0, 2]]


def test_cache_rows_picks_rows_and_leaves_the_cache_and_its_gradient_path():
    keys = torch.randn(3, 2, 4, 5, requires_grad=True)
    cache = DynamicCache()
    cache.update(keys * 1.0, keys * 2.0, 0)
    part = cache_rows(cache, torch.tensor([2, 0, 2]))
    assert cache.layers[0].keys.shape[0] == 3  # the original keeps its batch
    assert torch.equal(part.layers[0].keys, torch.stack([keys[2], keys[0], keys[2]]))
    part.layers[0].keys.sum().backward()
    assert keys.grad[:, 0, 0, 0].tolist() == [1.0, 0.0, 2.0]  # row 2 picked twice
