"""Task files: a task as data, in Reasoning Gym's composite form.

A task file is what a Reasoning Gym user writes for ``CompositeConfig.from_yaml``::

    name: my_mix                 # optional; the file's stem otherwise
    title: My mix                # optional: its name in tables and claims; the name otherwise
    prompt: direct               # optional: one of Reasoning Gym's system prompt styles
    datasets:                    # CompositeConfig.datasets: DatasetSpec(name, weight, config)
      - {name: chain_sum, weight: 2, config: {min_terms: 2, max_terms: 3}}
      - {name: products}         # weight 1 and Reasoning Gym's defaults
    levels:                      # optional: named variants of the task (``FILE.yaml:easy``)
      easy:
        datasets: [...]

``size`` and ``seed`` (CompositeConfig's other fields) are accepted and replaced: the splits'
sizes and seeds are the split rule's (``reasoning_gym_tasks``), the same for every task.
The paper's families are such files (``musketeers/configs/tasks``). Everything is checked
here, before any item is generated or any store is opened: each problem is one UserError.
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import math
from dataclasses import MISSING, dataclass, field, fields
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from musketeers.cache.errors import UserError

log = logging.getLogger(__name__)

FILE_KEYS = ("name", "title", "prompt", "datasets", "levels", "size", "seed")
DATASET_KEYS = ("name", "weight", "config")
# registered by Reasoning Gym but not a generator one can run at its defaults
_NOT_DATASETS = frozenset({"composite"})


@dataclass(frozen=True)
class DatasetEntry:
    """One member of a task: Reasoning Gym's ``DatasetSpec`` (name, weight, config)."""

    name: str
    weight: float = 1
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskFile:
    """A checked task file: its datasets, its levels' datasets and its bytes' sha256."""

    name: str
    path: Path
    sha256: str
    datasets: tuple[DatasetEntry, ...]
    prompt: str | None = None
    title: str = ""
    levels: dict[str, tuple[DatasetEntry, ...]] = field(default_factory=dict)

    def members(self, level: str | None) -> tuple[DatasetEntry, ...]:
        return self.datasets if level is None else self.levels[level]


def packaged_dir() -> Path:
    return Path(str(resources.files("musketeers") / "configs" / "tasks"))


def packaged_files() -> dict[str, Path]:
    """The named tasks shipped with the package, by name (the file's stem): the paper's three
    families first, in its order (``--task all`` and every listing follow it), then the rest."""
    paper = ("arithmetic", "algorithmic", "logic")
    order = {name: i for i, name in enumerate(paper)}
    files = sorted(packaged_dir().glob("*.yaml"), key=lambda p: (order.get(p.stem, 9), p.stem))
    return {p.stem: p for p in files}


def rg_datasets() -> tuple[str, ...]:
    """Every dataset name of Reasoning Gym's registry that runs at its defaults."""
    from reasoning_gym.factory import DATASETS

    return tuple(sorted(set(DATASETS) - _NOT_DATASETS))


def check_dataset_name(name: Any, where: str) -> str:
    """``name`` if Reasoning Gym has a dataset of that name; UserError with the nearest ones."""
    valid = rg_datasets()
    if isinstance(name, str) and name in valid:
        return name
    near = difflib.get_close_matches(str(name), valid, n=3)
    hint = f"did you mean {', '.join(near)}?" if near else "none is near it;"
    raise UserError(f"{where}: unknown Reasoning Gym dataset {name!r}; {hint} "
                    "(`musketeers tasks list` names them all)")


def _config_keys(name: str) -> tuple[str, ...]:
    from reasoning_gym.factory import DATASETS

    return tuple(f.name for f in fields(DATASETS[name][1]))


BOUND_FACTOR = 10  # how far past Reasoning Gym's own largest setting a knob may go
BOUND_FLOOR = 1_000


def _numbers(value: Any) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [abs(value)] if math.isfinite(value) else []
    if isinstance(value, list | tuple):
        return [x for v in value for x in _numbers(v)]
    return []


@cache
def _bound(name: str, key: str) -> float:
    """The largest magnitude ``name``'s ``key`` may take: ``BOUND_FACTOR`` times the largest of
    its default and its curriculum's levels, and at least ``BOUND_FLOOR``. A knob beyond every
    setting Reasoning Gym uses (a grid side of 10**9) would make generation run without end."""
    from reasoning_gym.factory import CURRICULA, DATASETS

    seen: list[float] = []
    for f in fields(DATASETS[name][1]):
        if f.name == key and not isinstance(f.default, type(MISSING)):
            seen += _numbers(f.default)
    if name in CURRICULA:
        for attr in getattr(CURRICULA[name](), "_attributes", {}).values():
            if key in (getattr(attr, "field_name", None), getattr(attr, "lower_field_name", None),
                       getattr(attr, "upper_field_name", None)):
                seen += _numbers(getattr(attr, "levels", []))
    return max(BOUND_FLOOR, BOUND_FACTOR * max(seen, default=0.0))


def _check_config(name: str, config: Any, where: str) -> dict[str, Any]:
    """The config, its keys checked against the dataset's config dataclass and its values
    against that dataclass's own ``validate`` (Reasoning Gym's checks, not ours)."""
    from reasoning_gym.factory import DATASETS

    if config is None:
        return {}
    if not isinstance(config, dict):
        raise UserError(f"{where}: config must be a mapping of {name}'s settings, "
                        f"got {type(config).__name__}")
    keys = _config_keys(name)
    unknown = [k for k in config if k not in keys]
    if unknown:
        raise UserError(f"{where}: {name} has no config key {unknown[0]!r}; valid keys: "
                        f"{', '.join(keys)}")
    if "size" in config or "seed" in config:
        raise UserError(f"{where}: a dataset's size and seed are the split rule's, the same for "
                        "every task; drop them from its config")
    for key, value in config.items():
        bound = _bound(name, key)
        if isinstance(value, int | float) and not isinstance(value, bool) \
                and not abs(value) <= bound:  # NaN included
            raise UserError(f"{where}: {name}'s {key} {value!r} is beyond what it can generate "
                            f"in bounded time (|{key}| <= {bound:g}, {BOUND_FACTOR}x the most "
                            "Reasoning Gym's defaults and curriculum use); lower it")
    try:
        made = DATASETS[name][1](**config)
        if hasattr(made, "validate"):
            made.validate()
    except Exception as exc:  # noqa: BLE001 - any refusal of Reasoning Gym's is the file's fault
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise UserError(f"{where}: {name}'s config is invalid: {detail}") from None
    return dict(config)


def _weight(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value <= 0:
        raise UserError(f"{where}: weight must be a positive number, got {value!r}")
    return value


def parse_datasets(raw: Any, where: str) -> tuple[DatasetEntry, ...]:
    """A ``datasets:`` list, every member checked."""
    if not isinstance(raw, list) or not raw:
        raise UserError(f"{where}: datasets must be a non-empty list of "
                        "{name, weight, config} entries")
    out: list[DatasetEntry] = []
    for i, entry in enumerate(raw):
        at = f"{where}, datasets[{i}]"
        if isinstance(entry, str):  # a bare name: weight 1, defaults
            entry = {"name": entry}
        if not isinstance(entry, dict):
            raise UserError(f"{at}: expected a mapping with name, weight, config")
        unknown = [k for k in entry if k not in DATASET_KEYS]
        if unknown:
            raise UserError(f"{at}: unknown key {unknown[0]!r}; valid: {', '.join(DATASET_KEYS)}")
        name = check_dataset_name(entry.get("name"), at)
        out.append(DatasetEntry(name, _weight(entry.get("weight", 1), f"{at} ({name})"),
                                _check_config(name, entry.get("config"), f"{at} ({name})")))
    names = [d.name for d in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:  # Reasoning Gym's composite refuses them too
        raise UserError(f"{where}: dataset {dup!r} is listed twice")
    return tuple(out)


def _read(path: Path) -> bytes:
    try:
        if path.is_dir():
            raise UserError(f"task file {path} is a folder")
        return path.read_bytes()
    except OSError as exc:
        raise UserError(f"task file {path}: {exc.strerror or exc}") from None


@cache
def _load(path: Path, data: bytes) -> TaskFile:
    import yaml

    try:
        raw = yaml.safe_load(data.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"task file {path} is not YAML ({first})") from None
    if not isinstance(raw, dict):
        raise UserError(f"task file {path} must be a YAML mapping with a datasets list, "
                        f"got {type(raw).__name__}")
    where = f"task file {path}"
    unknown = [k for k in raw if k not in FILE_KEYS]
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r}; valid: {', '.join(FILE_KEYS)}")
    if "datasets" not in raw:
        raise UserError(f"{where}: no datasets list")
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise UserError(f"{where}: name must be a non-empty string")
    title = raw.get("title", name)
    if not isinstance(title, str) or not title:
        raise UserError(f"{where}: title must be a non-empty string")
    prompt = raw.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise UserError(f"{where}: prompt must be a prompt style's name")
    levels = raw.get("levels") or {}
    if not isinstance(levels, dict) or not all(isinstance(v, dict) for v in levels.values()):
        raise UserError(f"{where}: levels must map each level's name to {{datasets: [...]}}")
    if any(set(v) != {"datasets"} for v in levels.values()):
        raise UserError(f"{where}: a level holds one key, datasets")
    if "size" in raw or "seed" in raw:
        log.warning("%s: size and seed are replaced by the split rule's sizes and seeds", where)
    return TaskFile(
        name=name, title=title, path=path, sha256=hashlib.sha256(data).hexdigest(), prompt=prompt,
        datasets=parse_datasets(raw["datasets"], where),
        levels={str(lv): parse_datasets(v["datasets"], f"{where}, level {lv}")
                for lv, v in levels.items()},
    )


def load_task_file(path: str | Path) -> TaskFile:
    """The checked task file at ``path``, as its bytes read now (parsed once per content)."""
    path = Path(path)
    return _load(path, _read(path))


def packaged(name: str) -> TaskFile:
    """The packaged task ``name`` (musketeers/configs/tasks/NAME.yaml)."""
    return load_task_file(packaged_files()[name])
