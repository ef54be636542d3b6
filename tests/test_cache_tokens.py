"""Ragged token rows: offsets slice a flat array lazily; padding and masks mark real tokens."""

from __future__ import annotations

import numpy as np
import pytest

from musketeers.cache.tokens import CHANNELS, TokenRows, from_arrays, offsets_from_lengths


class CountingFlat:
    """A flat array that records which slices were read (a zarr array stands here in a store)."""

    def __init__(self, values: np.ndarray):
        self.values, self.reads = values, []
        self.shape = values.shape

    def __getitem__(self, key: slice) -> np.ndarray:
        self.reads.append((key.start, key.stop))
        return self.values[key]


def _rows(lengths: list[int], d: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.normal(size=(t, d)).astype(np.float32) for t in lengths]


def test_channels_declared_once_with_pooled_default_first():
    assert CHANNELS == ("pooled", "tokens", "answer")


def test_rows_are_the_arrays_written_and_read_only_their_slices():
    rows = _rows([2, 5, 1, 3])
    whole = from_arrays(rows)
    flat = CountingFlat(np.asarray(whole.flat))
    tr = TokenRows(whole.offsets, flat)
    assert len(tr) == 4 and tr.dim == 3
    assert tr.lengths().tolist() == [2, 5, 1, 3]
    got = tr.rows([3, 1])
    np.testing.assert_array_equal(got[0], rows[3])
    np.testing.assert_array_equal(got[1], rows[1])
    assert flat.reads == [(8, 11), (2, 7)]


def test_padded_zero_pads_and_masks_real_tokens():
    rows = _rows([2, 4, 1])
    states, mask = from_arrays(rows).padded([0, 2, 1])
    assert states.shape == (3, 4, 3) and states.dtype == np.float32
    assert mask.tolist() == [[True, True, False, False], [True, False, False, False],
                             [True] * 4]
    np.testing.assert_array_equal(states[0, :2], rows[0])
    np.testing.assert_array_equal(states[2], rows[1])
    assert not states[0, 2:].any() and not states[1, 1:].any()


def test_padded_keeps_one_slot_when_every_row_is_empty():
    tr = TokenRows(np.array([0, 0, 0]), np.zeros((0, 2), np.float32))
    states, mask = tr.padded([0, 1])
    assert states.shape == (2, 1, 2) and not mask.any()


@pytest.mark.parametrize("offsets, total", [([1, 2], 2), ([0, 3, 2], 3), ([0, 2], 3)])
def test_inconsistent_offsets_are_refused(offsets, total):
    with pytest.raises(ValueError):
        TokenRows(np.array(offsets), np.zeros((total, 2), np.float32))


def test_offsets_accumulate_lengths_and_rows_out_of_range_raise():
    assert offsets_from_lengths([2, 0, 3]).tolist() == [0, 2, 2, 5]
    with pytest.raises(IndexError):
        from_arrays(_rows([1, 1])).rows([2])
