"""Published artefacts carry no machine's paths: a path under the folder the grid ran from
becomes relative to it, any other absolute path is dropped (a config or fingerprint field) or
cut to its last part (an error line). A published run then reads the same on every clone."""

from __future__ import annotations

import json
import os
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from musketeers.cache.store import TASK_FILE
from musketeers.config import TrainConfig

# the config fields that hold paths (TrainConfig's ``path`` metadata)
PATH_FIELDS = tuple(f.name for f in fields(TrainConfig) if f.metadata.get("path"))
_ABSOLUTE = re.compile(r"(?<![\w.~:/])/[^\s'\"(),;:]+")


def relative(path: str, root: Path) -> str | None:
    """An absolute ``path`` relative to ``root`` when it lies under it, else None."""
    try:
        return Path(path).resolve().relative_to(Path(root).resolve()).as_posix() or "."
    except ValueError:
        return None


def _portable_fields(data: dict[str, Any], keys: tuple[str, ...], root: Path) -> bool:
    """Make ``data``'s absolute paths under ``keys`` relative to ``root``, drop the others;
    whether any was."""
    changed = False
    for key in keys:
        value = data.get(key)
        if isinstance(value, str) and os.path.isabs(value):
            changed = True
            rel = relative(value, root)
            if rel is None:
                del data[key]
            else:
                data[key] = rel
    return changed


def portable_task(task: str, root: Path) -> str:
    """A task file's absolute path relative to ``root``, or its file name when it lies
    elsewhere (the run's fingerprints keep the file's hash); level and prompt kept."""
    m = TASK_FILE.fullmatch(task)
    if m is None or not os.path.isabs(m["path"]):
        return task
    return (relative(m["path"], root) or Path(m["path"]).name) + m["suffix"]


def portable_config(text: str, root: Path) -> str:
    """A run's config.yaml with its path fields relative to ``root`` (or dropped), a task
    file's path too; a file that is no mapping is left as it is."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if not isinstance(data, dict):
        return text
    task = data.get("task")
    moved = isinstance(task, str) and portable_task(task, root) != task
    if moved:
        data["task"] = portable_task(task, root)
    if not _portable_fields(data, PATH_FIELDS, root) and not moved:
        return text
    return yaml.safe_dump(data, sort_keys=False)


def portable_fingerprints(text: str, root: Path) -> str:
    """fingerprints.json with its ``cache_dir`` relative to ``root`` (or dropped); a file
    that is no JSON mapping is left as it is."""
    try:
        data = json.loads(text)
    except ValueError:
        return text
    if not isinstance(data, dict) or not _portable_fields(data, ("cache_dir",), root):
        return text
    return json.dumps(data, indent=1, sort_keys=True)


def portable_error(text: str, root: Path) -> str:
    """error.txt's one-line error (not its traceback, which names the machine's files), every
    absolute path in it relative to ``root`` or cut to its last part."""
    line = text.splitlines()[0] if text.strip() else ""

    def one(m: re.Match[str]) -> str:
        rel = relative(m.group(0), root)
        return rel if rel is not None else Path(m.group(0)).name

    return _ABSOLUTE.sub(one, line) + "\n"


REWRITES = {"config.yaml": portable_config, "fingerprints.json": portable_fingerprints,
            "error.txt": portable_error}


def has_absolute_path(text: str) -> bool:
    """Whether ``text`` holds something that reads as an absolute path."""
    return _ABSOLUTE.search(text) is not None
