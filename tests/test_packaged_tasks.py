"""The packaged tasks as data keep every store's fingerprint: the specs and first items of
each named task, computed by the code that held the families as Python tables, frozen here.

Stores under ``stores/`` and published reports were built from these specs: a packaged task
file that drifts (a weight written 1.0, a reordered dataset, a tuple config) refuses them all.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from musketeers.cache.items import items_fingerprint
from musketeers.tasks import build_items, task_spec
from musketeers.tasks.reasoning_gym_tasks import prebuild
from musketeers.tasks.variants import packaged_tasks

# sha256 of each task's spec as JSON with sorted keys, first 16 hex digits
SPECS = {
    "planted": "0c76a50bc1ae37c5",
    "arithmetic": "97ccd125c9473fa7",
    "arithmetic@default": "cb16f508b28e8a39",
    "arithmetic@simple": "996fc116a954d143",
    "arithmetic@direct": "dd780bccb05d31fd",
    "arithmetic@chain_of_draft": "0d73c9c2113982b7",
    "arithmetic:easy": "a7d38daa4ae6d8b3",
    "arithmetic:easy@default": "8c398a98138a826c",
    "arithmetic:easy@simple": "cd17ec058e23801d",
    "arithmetic:easy@direct": "649c6391da684a33",
    "arithmetic:easy@chain_of_draft": "dd015e567c0eb35f",
    "arithmetic:easier": "109ae21c6d3cbf51",
    "arithmetic:easier@default": "2ab055f04f5f7710",
    "arithmetic:easier@simple": "137a391edbe84008",
    "arithmetic:easier@direct": "e118f5bc75c3d870",
    "arithmetic:easier@chain_of_draft": "48e796b1a6ed0b57",
    "algorithmic": "0ea404dafff291c2",
    "algorithmic@default": "494bae4e88ada46e",
    "algorithmic@simple": "70b27be01db1f06f",
    "algorithmic@direct": "35f1b33fe0f75db2",
    "algorithmic@chain_of_draft": "7e0ac94b84808560",
    "algorithmic:easy": "0ce0fb8d7122ed8f",
    "algorithmic:easy@default": "af9ed1ae398bf47b",
    "algorithmic:easy@simple": "87c54b52e31a086b",
    "algorithmic:easy@direct": "fe2376af12275041",
    "algorithmic:easy@chain_of_draft": "a3b5c7d5640a608f",
    "algorithmic:easier": "c1ee32891a6e3970",
    "algorithmic:easier@default": "425cfa76e3b75190",
    "algorithmic:easier@simple": "408fa1895a33ac5a",
    "algorithmic:easier@direct": "6b805cc6d9fcfc0a",
    "algorithmic:easier@chain_of_draft": "f6c918a16e981fd2",
    "algorithmic:fair": "48f6690c9b942834",
    "algorithmic:fair@default": "6d89d271a9f2533c",
    "algorithmic:fair@simple": "6e662af8e33355d3",
    "algorithmic:fair@direct": "200b5547418de028",
    "algorithmic:fair@chain_of_draft": "7846b964c2ba730f",
    "logic": "d5c43bf539156af4",
    "logic@default": "ff9f17b949a639db",
    "logic@simple": "0d9269934e07ead4",
    "logic@direct": "15ce3e71c3e8fa35",
    "logic@chain_of_draft": "ec9e47d5f51727ea",
    "logic:easy": "080a6a942d5cf1c6",
    "logic:easy@default": "1cc39ad39962a7d0",
    "logic:easy@simple": "dbe01d6f14a92fcf",
    "logic:easy@direct": "ebf2c764549a50de",
    "logic:easy@chain_of_draft": "e362774599acc32f",
    "gsm8k": "b7bbdf92e6f159f5",
    "gsm8k@default": "79dc1bd792d5c346",
    "gsm8k@simple": "a0028d8d848d7921",
    "gsm8k@direct": "3e1ffa729944390e",
    "gsm8k@chain_of_draft": "4333ba56c6199728",
    "gsm_symbolic": "5929c2c5ecbad50f",
    "gsm_symbolic@default": "e8672632f910ef24",
    "gsm_symbolic@simple": "de313d9f81e2b6ce",
    "gsm_symbolic@direct": "1c9db3e9e5cc0c37",
    "gsm_symbolic@chain_of_draft": "6e542bdd3208fc16",
}
ITEMS = {
    "arithmetic": ("1295211113ecda0e", "448f4aeafcca6cdb"),
    "arithmetic:easy": ("d57dcd644f8f3f8c", "4748885ef5806dc3"),
    "arithmetic:easier": ("a9320e8d5a9f33c2", "9ad4d2040bbb4bf2"),
    "algorithmic": ("9eac4bd1ae6d99f0", "d4a14abe62df0d55"),
    "algorithmic:easy": ("42f05ee633d14a04", "0eaacffacb57358b"),
    "algorithmic:easier": ("865d23ab34169d7f", "b832c06d71c57618"),
    "logic": ("cc6f065c58dee099", "fec3f2769d72b50b"),
    "logic:easy": ("67a64a6afdacd305", "bbaf9a6044142c40"),
    "gsm_symbolic": ("a8845a3f0a0bab55", "2eaf8bfa3653f075"),
}


def _digest(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def test_every_packaged_variant_keeps_its_task_spec():
    assert sorted(packaged_tasks()) == sorted(SPECS)
    changed = [t for t in SPECS if _digest(task_spec(t)) != SPECS[t]]
    assert changed == []


@pytest.fixture(scope="module")
def first_items():
    prebuild([(t, s, 6) for t in ITEMS for s in ("train", "val")])
    return {t: tuple(items_fingerprint(build_items(t, s, 6))[:16] for s in ("train", "val"))
            for t in ITEMS}


def test_every_packaged_family_and_level_keeps_its_items(first_items):
    assert {t: v for t, v in first_items.items() if v != ITEMS[t]} == {}


SHORTCUT_SHARE = 0.10  # the most a constant answer or a copied input may score on a dataset


def shortcut_exact(task: str) -> dict[str, float]:
    from musketeers.tasks.forgeries import measure

    return {r.source: max(r.constant_exact, r.copy_exact)
            for r in measure(build_items(task, "val", 200))}


def test_the_fair_level_has_no_dataset_a_shortcut_answers():
    """The fair level keeps every dataset's shortcuts under the stated share; the easier level
    it replaces does not (one constant answers binary_alternation), so the check can fail."""
    fair = shortcut_exact("algorithmic:fair@direct")
    assert set(fair) == {"base_conversion", "rotate_matrix", "string_manipulation",
                         "spell_backward"}
    assert {s: v for s, v in fair.items() if v > SHORTCUT_SHARE} == {}
    easier = shortcut_exact("algorithmic:easier@direct")
    assert easier["binary_alternation"] > 0.4 and easier["isomorphic_strings"] > 0.4
