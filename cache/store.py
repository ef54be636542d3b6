"""The Zarr v3 store: layout, attributes, fingerprints, progress markers and the writer lock.

Layout (ARCHITECTURE.md): ``<task>.zarr/<split>/{items,experts/<name>,router/<encoder>}``.
Every array is chunked by rows (``chunk_rows``) and checksummed with crc32c, so corruption is
found per chunk. A chunk's ``done`` flag is written after its arrays and ``complete`` after all
chunks: a store killed at any moment never presents unfinished rows as finished.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from musketeers.cache.errors import UserError
from musketeers.cache.items import Item

FORMAT_VERSION = 1
CHUNK_ROWS = 64
SPLITS: tuple[str, ...] = ("train", "val")  # every store, every task
ITEM_FIELDS = ("id", "question", "system", "answer", "entry", "source")
ROUTER_ENCODER = "all-minilm-l6-v2"
HINTS_FLAG = "hints_done"  # hints are their own unit: flags, then ``hints_complete``
FLAGS = ("done", HINTS_FLAG)


def compressors() -> list:
    return [ZstdCodec(level=3), Crc32cCodec()]


def store_path(cache_dir: str | Path, task: str) -> Path:
    return Path(cache_dir) / f"{task}.zarr"


def check_cache_dir(cache_dir: str | Path) -> Path:
    """The cache root must be a writable directory (created if absent)."""
    root = Path(cache_dir)
    if root.exists() and not root.is_dir():
        raise UserError(f"cache dir {root} is a file; pass a directory with --cache-dir")
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
                       force: bool = False) -> str:
    """The ``musketeers precompute`` command that fills (or, with ``force``, rebuilds) a store;
    ``--cache-dir`` only when it is not the default ``stores``."""
    cmd = f"musketeers precompute --task {task}"
    if experts:
        cmd += f" --experts {experts}"
    if cache_dir is not None and Path(cache_dir) != Path("stores"):
        cmd += f" --cache-dir {cache_dir}"
    return cmd + (" --force" if force else "")


def rebuild_command(task: str, experts: str | None = None) -> str:
    return precompute_command(task, experts, force=True)


def open_root(path: Path, task: str, task_spec: dict, force: bool = False) -> zarr.Group:
    """Open or create a task's store; a different task spec is refused unless ``force``."""
    if path.exists():
        root = zarr.open_group(path, mode="r+")
        attrs = root.attrs.asdict()
        if not attrs and not list(root.group_keys()):  # killed between create and attrs
            shutil.rmtree(path)
            return open_root(path, task, task_spec, force)
        same = attrs.get("format_version") == FORMAT_VERSION and attrs.get("task_spec") == task_spec
        if same:
            return root
        if not force:
            raise UserError(
                f"store {path} was built with another format or task spec; rebuild: "
                f"{rebuild_command(task)}"
            )
        shutil.rmtree(path)
    root = zarr.open_group(path, mode="w", zarr_format=3)
    root.attrs.update({"format_version": FORMAT_VERSION, "task": task, "task_spec": task_spec})
    return root


def create_array(group: zarr.Group, name: str, shape: tuple, dtype, chunk_rows: int):
    chunks = (min(chunk_rows, max(shape[0], 1)),) + tuple(shape[1:])
    kwargs = {} if dtype is str else {"fill_value": 0}
    return group.create_array(
        name, shape=shape, chunks=chunks, dtype=dtype, compressors=compressors(), overwrite=True,
        **kwargs,
    )


def write_items(split_group: zarr.Group, items: list[Item], fingerprint: str, chunk_rows: int):
    """Items of a split, written once per store; ``items_fingerprint`` is set last."""
    g = split_group.require_group("items")
    g.attrs.update({"n": len(items), "items_fingerprint": None})
    for f in ITEM_FIELDS:
        values = np.array([getattr(it, f) or "" for it in items], dtype=object)
        create_array(g, f, (len(items),), str, chunk_rows)[:] = values
    g.attrs.update({"n": len(items), "items_fingerprint": fingerprint})


def items_ready(split_group: zarr.Group, fingerprint: str) -> bool | None:
    """True if the stored items match, False if they differ, None if absent/unfinished."""
    if "items" not in split_group:
        return None
    stored = split_group["items"].attrs.get("items_fingerprint")
    if stored is None:
        return None
    return stored == fingerprint


def n_chunks(n: int, chunk_rows: int) -> int:
    return max(1, -(-n // chunk_rows))


def chunk_range(chunk: int, n: int, chunk_rows: int) -> tuple[int, int]:
    return chunk * chunk_rows, min(n, (chunk + 1) * chunk_rows)


def create_expert_arrays(
    g: zarr.Group, n: int, n_layers: int, d: int, chunk_rows: int, hints: bool
) -> None:
    for name in ("last", "first", "random"):
        create_array(g, name, (n, d), "float32", chunk_rows)
    for name in ("layers_last", "layers_mean"):
        create_array(g, name, (n, n_layers + 1, d), "float32", chunk_rows)
    create_array(g, "random_pos", (n,), "int32", chunk_rows)
    create_array(g, "n_tokens", (n,), "int32", chunk_rows)
    create_array(g, "truncated", (n,), "bool", chunk_rows)
    create_done(g, n, chunk_rows)
    if hints:  # flags first: see ``precompute.prepare_hints``
        create_done(g, n, chunk_rows, HINTS_FLAG)
        create_array(g, "hints", (n,), str, chunk_rows)


def create_done(g: zarr.Group, n: int, chunk_rows: int, name: str = "done") -> None:
    # One file per flag: a flag is a single tiny write, and a torn flag reads as not done.
    g.create_array(name, shape=(n_chunks(n, chunk_rows),), chunks=(1,), dtype="uint8",
                   fill_value=0, compressors=[Crc32cCodec()], overwrite=True)


def done_flags(g: zarr.Group, name: str = "done") -> np.ndarray:
    """Per-chunk done flags; a flag that cannot be read (torn write, bad crc) counts as 0."""
    done = g[name]
    flags = np.zeros(done.shape[0], dtype=np.uint8)
    for c in range(done.shape[0]):
        try:
            flags[c] = done[c]
        except Exception:  # noqa: BLE001 - any decode failure means "not done"
            flags[c] = 0
    return flags


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


def unit_arrays(g: zarr.Group, flag: str = "done") -> tuple[str, ...]:
    """The arrays whose chunks ``flag`` marks done: ``hints`` under ``hints_done``, the rest
    under ``done`` (with ``hints`` too in stores from before hints had their own flags)."""
    if flag == HINTS_FLAG:
        return ("hints",)
    own_hints = HINTS_FLAG in g
    return tuple(k for k in g.array_keys() if k not in FLAGS and not (own_hints and k == "hints"))


def hints_complete(g: zarr.Group) -> bool:
    """Whether an expert group's hints are all stored (either store format)."""
    if HINTS_FLAG in g:
        return bool(g.attrs.get("hints_complete"))
    return "hints" in g and bool(g.attrs.get("complete"))


def lock_path(path: Path) -> Path:
    return path.parent / (path.name + ".lock")


def disk_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
