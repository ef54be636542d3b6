"""The store as a thing on disk: where it lives, opening or rebuilding its root, the writer
lock, leftovers of killed writes, and the ``musketeers precompute`` command that fixes it.

What lives where inside a store, and when a part of it counts as finished, is ``layout``'s
(the one owner of paths, ``done`` flags and ``complete``); the Zarr primitives are ``zarrio``'s.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shlex
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zarr

from musketeers.cache import layout, token_layout
from musketeers.cache.errors import UserError
from musketeers.cache.layout import FORMAT_VERSION as FORMAT_VERSION  # re-exported
from musketeers.cache.layout import (  # re-exported: tests/test_store_format.py pins it here
    create_expert_arrays as create_expert_arrays,
)
from musketeers.cache.untrusted import safe_name
from musketeers.cache.zarrio import child_names, one_line

# a task named by a YAML task file: PATH.yaml, then its optional :LEVEL and @PROMPT
TASK_FILE = re.compile(r"(?P<path>.+\.ya?ml)(?P<suffix>(?::[^:@/]+)?(?:@[^@/]*)?)")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def store_name(task: str) -> str:
    """The name of ``task``'s store: the task itself, or for a task file its stem and a hash of
    its bytes, so that spelling the path another way finds the same store and an edited file
    never finds the old one."""
    m = TASK_FILE.fullmatch(task)
    if m is None:  # the name of a folder under --cache-dir: never a path out of it
        return safe_name(task, "task", "name a packaged task (musketeers tasks list) or a "
                         "task file PATH.yaml")
    path = Path(m["path"])
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"task file {path}: {exc.strerror or exc}") from None
    stem = _UNSAFE.sub("_", path.stem).strip("._") or "task"
    return f"{stem}-{hashlib.sha256(data).hexdigest()[:10]}{m['suffix']}"


def store_path(cache_dir: str | Path, task: str) -> Path:
    return Path(cache_dir) / f"{store_name(task)}.zarr"


def stored_task(path: Path) -> str:
    """The task a store was built for: its root's ``task`` (a task file's path, for a store
    named by the file's stem and hash), else the folder's name (a damaged root)."""
    try:
        task = zarr.open_group(str(path), mode="r").attrs.get("task")
    except Exception:  # noqa: BLE001 - an unreadable root says nothing
        task = None
    return task if isinstance(task, str) and task else path.name.removesuffix(".zarr")


def check_cache_dir(cache_dir: str | Path, create: bool = True) -> Path:
    """The cache root must be a writable directory (created if absent). ``create=False``
    only checks, so that option checks can run before anything is created."""
    root = Path(cache_dir)
    if root.exists() and not root.is_dir():
        raise UserError(f"cache dir {root} is a file; pass a directory with --cache-dir")
    if not create:
        probe = next((p for p in (root, *root.absolute().parents) if p.exists()), root)
        if not os.access(probe, os.W_OK | os.X_OK):
            raise UserError(f"cache dir {root} is not writable; pass another with --cache-dir")
        return root
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"cannot create cache dir {root} ({exc.strerror}); use --cache-dir"
        ) from exc
    if not os.access(root, os.W_OK | os.X_OK):
        raise UserError(f"cache dir {root} is not writable; pass another with --cache-dir")
    return root


def precompute_command(task: str, experts: str | None = None, cache_dir: str | Path | None = None,
                       force: bool = False, limit: int | None = None, hints: bool = False,
                       options: tuple[str, ...] = (), roster: str | None = None) -> str:
    """The one builder of every fix command: the ``musketeers precompute`` that fills (or, with
    ``force``, rebuilds) a store, runnable as printed (every path quoted): ``--cache-dir``
    unless it is the default ``stores``, the ``--limit`` the store holds (see ``store_limit``)
    so a repair never builds a task's full item set into a small store, and the ``options``
    its experts were computed with (``stored_options``) so a repair is not refused as built
    from other inputs."""
    cmd = f"musketeers precompute --task {shlex.quote(task)}"
    if experts:
        cmd += f" --experts {shlex.quote(experts)}"
    if roster is not None and roster != "pocket":
        cmd += f" --roster {shlex.quote(roster)}"
    if not is_default_cache(cache_dir):
        cmd += f" --cache-dir {shlex.quote(str(cache_dir))}"
    if limit is not None:
        cmd += f" --limit {limit}"
    cmd += "".join(f" {o}" for o in options)
    return cmd + (" --force" if force else "") + (" --hints" if hints else "")


def is_default_cache(cache_dir: str | Path | None) -> bool:
    return cache_dir is None or Path(cache_dir) == Path("stores")


def verify_command(task: str, cache_dir: str | Path | None = None) -> str:
    """``musketeers cache verify`` of one store, in its cache dir."""
    where = "" if is_default_cache(cache_dir) else f" --cache-dir {shlex.quote(str(cache_dir))}"
    return f"musketeers cache verify {shlex.quote(task)}{where}"


def build_options(chunk_rows: int, batch_tokens: int, dtype: str | None,
                  token_layers: tuple[int, ...] = ()) -> tuple[str, ...]:
    """Precompute options that enter an expert's fingerprint: ``--dtype``, and the chunking
    and batching where they are not the defaults; and the token states' layers, if any."""
    out = [f"--dtype {dtype}"] if dtype else []
    if chunk_rows != layout.CHUNK_ROWS:
        out.append(f"--chunk-rows {chunk_rows}")
    if batch_tokens != layout.BATCH_TOKENS:
        out.append(f"--batch-tokens {batch_tokens}")
    return tuple(out) + token_option(token_layers)


def token_option(layers: tuple[int, ...] | list[int]) -> tuple[str, ...]:
    """``--token-states`` for these layers ('=' keeps a negative layer a value), or ()."""
    return (f"--token-states={','.join(map(str, dict.fromkeys(layers)))}",) if layers else ()


def stored_token_layers(path: Path) -> tuple[int, ...]:
    """The layers (as asked for) of every token unit a store's experts hold."""
    asked: dict[int, None] = {}
    for name, experts in _listed_experts(path):
        try:
            for u in token_layout.token_units(experts[name]):
                if isinstance(k := u.attrs.get("asked"), int):
                    asked[k] = None
        except Exception:  # noqa: BLE001 - a damaged group says nothing
            continue
    return tuple(sorted(asked))


def _listed_experts(path: Path) -> Iterator[tuple[str, Any]]:
    """(name, its split's experts group) of every expert a split can still list: a damaged
    split says nothing, a damaged group is left to the caller."""
    for split in layout.SPLITS:
        try:
            experts = open_part(path, split, layout.EXPERTS)
            names = child_names(experts)
        except Exception:  # noqa: BLE001 - absent or damaged
            continue
        for name in names:
            yield name, experts


def stored_options(path: Path) -> tuple[str, ...]:
    """``build_options`` of the first expert whose fingerprint records them; () for none."""
    for name, experts in _listed_experts(path):
        try:
            fp = layout.fingerprint(experts[name]) or {}
        except Exception:  # noqa: BLE001 - a damaged group says nothing
            continue
        pooling = fp.get("pooling") if isinstance(fp, dict) else None
        if isinstance(pooling, dict):
            return build_options(int(pooling.get("chunk_rows", layout.CHUNK_ROWS)),
                                 int(pooling.get("batch_tokens", layout.BATCH_TOKENS)),
                                 fp.get("dtype"), stored_token_layers(path))
    return ()


def fix_command(cache_dir: str | Path, task: str, experts: str | None = None, force: bool = False,
                hints: bool = False, token_layer: int | None = None) -> str:
    """The command that repairs what a reader found (and adds ``token_layer``'s token states),
    in this cache dir, at the store's size, recomputing what the store holds as it was built."""
    path = store_path(cache_dir, task)
    stored, has_hints = stored_experts(path)
    experts, hints = experts or stored, hints or has_hints
    options = stored_options(path)
    if token_layer is not None:
        layers = (*stored_token_layers(path), token_layer)
        options = (*(o for o in options if not o.startswith("--token-states")),
                   *token_option(layers))
    return precompute_command(task, experts, cache_dir, force, store_limit(path), hints, options)


def open_part(path: Path, split: str, part: str) -> zarr.Group:
    """``<split>/<part>`` (``ITEMS``, ``EXPERTS`` or a unit path) opened by its path, so that
    an unreadable root or split ``zarr.json`` does not hide it from a repair command."""
    return zarr.open_group(path, path=f"{split}/{part}", mode="r")


def stored_experts(path: Path) -> tuple[str | None, bool]:
    """``--experts`` naming every expert a store holds, so a repair command recomputes what is
    there (without it precompute would add the default team), None if there are none; and
    whether it holds hints (a recomputed group must get them back: ``--hints``)."""
    args: dict[str, None] = {}
    hints = False
    for name, experts in _listed_experts(path):
        try:
            g = experts[name]
            hints = hints or layout.HINTS in child_names(g)
            args[layout.expert_arg(name, *layout.expert_ref(g))] = None
        except Exception:  # noqa: BLE001 - a damaged group is known by its name
            args[name] = None
    return ",".join(args) or None, hints


def store_limit(path: Path) -> int | None:
    """The ``--limit`` that rebuilds the store's items: the largest split (a split holds
    ``min(limit, size)`` items). Read split by split, so a damaged root does not hide it."""
    sizes = []
    for split in layout.SPLITS:
        try:
            n = layout.item_count(open_part(path, split, layout.ITEMS))
        except Exception:  # noqa: BLE001 - absent or damaged: that split says nothing
            continue
        if n is not None:
            sizes.append(n)
    return max(sizes) if sizes else None


def open_root(path: Path, task: str, task_spec: dict, force: bool = False,
              rebuild: str | None = None) -> zarr.Group:
    """Open or create a task's store; a different task spec, or a root whose metadata cannot
    be read, is refused unless ``force``. ``rebuild``: the command that rebuilds it."""
    rebuild = rebuild or precompute_command(task, force=True)
    if path.exists() and not any(p.suffix != ".partial" for p in path.iterdir()):
        shutil.rmtree(path)  # an empty folder (killed before the root was written) holds nothing
    if path.exists():
        try:
            root = zarr.open_group(path, mode="r+")
        except Exception as exc:  # noqa: BLE001 - truncated/overwritten/deleted root zarr.json
            if not force:
                raise UserError(f"store {path} has unreadable root metadata ({one_line(exc)}); "
                                f"rebuild: {rebuild}") from None
            shutil.rmtree(path)
            return open_root(path, task, task_spec, force, rebuild)
        attrs = root.attrs.asdict()
        if not attrs and not list(root.group_keys()):  # killed between create and attrs
            shutil.rmtree(path)
            return open_root(path, task, task_spec, force, rebuild)
        if layout.same_root(root, task_spec):
            return root
        if not force:
            raise UserError(
                f"store {path} was built with another format or task spec; rebuild: {rebuild}"
            )
        shutil.rmtree(path)
    root = zarr.open_group(path, mode="w", zarr_format=3)
    root.attrs.update(layout.root_attrs(task, task_spec))
    return root


def remove_partials(path: Path) -> int:
    """Delete the ``*.<uuid>.partial`` files a killed write leaves behind (zarr writes to one,
    then renames): a stray one in a group makes every later listing warn."""
    stray = [p for p in path.rglob("*.partial") if _PARTIAL.search(p.name)]
    for p in stray:
        p.unlink(missing_ok=True)
    return len(stray)


_PARTIAL = re.compile(r"\.[0-9a-f]{32}\.partial$")


@dataclass
class Lock:
    """Exclusive writer lock on a store (``<task>.zarr.lock``), released when the process dies.

    ``busy`` is the refusal when another process holds it (``{pid}`` is the holder's PID): a
    run folder reuses the lock with its own fix.
    """

    path: Path
    fd: int | None = None
    busy: str | None = None

    def __enter__(self) -> Lock:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(self.fd)
            self.fd = None
            if self.busy is not None:
                raise UserError(self.busy.format(pid=holder)) from None
            raise UserError(
                f"store {self.path.with_suffix('')} is being written by another precompute "
                f"(PID {holder}); wait for it to finish"
            ) from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)
        return self

    def acquire(self) -> None:
        self.__enter__()

    def release(self) -> None:
        self.__exit__()

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            # Unlinked while still held so stores stay clean; a racer that opened the old file
            # in this instant could also lock it: acceptable for a guard against mistakes.
            self.path.unlink(missing_ok=True)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def lock_path(path: Path) -> Path:
    return path.parent / (path.name + ".lock")


def disk_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
