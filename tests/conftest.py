"""Shared test setup: offline everywhere, a private models dir, small helpers."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ[_var] = "1"
# the checkpoints' signing key: one per test session, never the user's own
os.environ["MUSKETEERS_MANIFEST_KEY"] = str(Path(tempfile.mkdtemp()) / "manifest.key")
# the token chunks the reader has checked: one memory per test session, never the user's own
os.environ["MUSKETEERS_VERIFIED_DIR"] = tempfile.mkdtemp()

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
SHARED_GSM8K = REPO.parent / "shared" / "data" / "gsm8k"


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    """An empty feature-cache root."""
    d = tmp_path / "stores"
    d.mkdir()
    return d


def tiny_specs() -> list:
    """Tiny seeded random experts (built once into the models dir, reused across test runs)."""
    from musketeers.cache.experts import TINY_EXPERTS

    return list(TINY_EXPERTS)


@pytest.fixture(scope="session")
def tiny() -> list:
    return tiny_specs()


def make_items(n: int, seed: int = 0) -> list:
    """Hand-made items of varied lengths (no task generator needed)."""
    import random

    from musketeers.cache.items import Item

    rng = random.Random(seed)
    items = []
    for i in range(n):
        words = " ".join(rng.choice(["add", "seven", "to", "the", "sum", "of", "9", "and", "x"])
                         for _ in range(rng.randint(1, 40)))
        items.append(Item(id=f"q{i}", question=f"Q{i}: {words}?", system="Think first.",
                          answer=str(i), entry="{}", source="hand"))
    return items


@pytest.fixture(scope="module")
def planted_store(tmp_path_factory) -> Path:
    """A small planted-expert store (64 train, 16 val items), one per test module."""
    from musketeers.checks.planted import write_planted_store

    root = tmp_path_factory.mktemp("planted") / "stores"
    write_planted_store(root, n_train=64, n_val=16)
    return root


@pytest.fixture
def one_thread():
    """One torch thread: tiny models gain nothing from threads on a shared 2-core CPU."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
