"""Independent random streams, each named by integer keys."""

from __future__ import annotations

import numpy as np


def derived_seed(*keys: int) -> int:
    """A 63-bit seed from integer keys (run seed, stream tag, step, ...): independent streams
    that depend on nothing but their keys, so resuming or logging more changes none of them."""
    return int(np.random.SeedSequence([k & 0xFFFFFFFF for k in keys]).generate_state(2,
               np.uint64)[0] >> 1)
