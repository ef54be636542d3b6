"""The Zarr v3 store: layout, attributes, fingerprints, progress markers and the writer lock.

Layout (ARCHITECTURE.md): ``<task>.zarr/<split>/{items,experts/<name>,router/<encoder>}``.
Every array is chunked by rows (``chunk_rows``) and checksummed with crc32c, so corruption is
found per chunk. A chunk's ``done`` flag is written after its arrays and ``complete`` after all
chunks: a store killed at any moment never presents unfinished rows as finished.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec
from zarr.core.sync import sync

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
                       force: bool = False, limit: int | None = None, hints: bool = False) -> str:
    """The one builder of every fix command: the ``musketeers precompute`` that fills (or, with
    ``force``, rebuilds) a store, runnable as printed: ``--cache-dir`` unless it is the default
    ``stores``, and the ``--limit`` the store holds (see ``store_limit``) so a repair never
    builds a task's full item set into a small store."""
    cmd = f"musketeers precompute --task {task}"
    if experts:
        cmd += f" --experts {experts}"
    if cache_dir is not None and Path(cache_dir) != Path("stores"):
        cmd += f" --cache-dir {cache_dir}"
    if limit is not None:
        cmd += f" --limit {limit}"
    return cmd + (" --force" if force else "") + (" --hints" if hints else "")


def expert_arg(name: str, kind: str | None = None, ref: str | None = None) -> str:
    """What ``--experts`` takes for an expert: folders and hub ids by their reference (their
    slug names resolve to nothing), registry experts by name."""
    return ref if kind in ("dir", "hub") and ref else name


def stored_experts(path: Path) -> tuple[str | None, bool]:
    """``--experts`` naming every expert a store holds, so a repair command recomputes what is
    there (without it precompute would add the default team), None if there are none; and
    whether it holds hints (a recomputed group must get them back: ``--hints``)."""
    args: dict[str, None] = {}
    hints = False
    for split in SPLITS:
        try:
            experts = zarr.open_group(path, path=f"{split}/experts", mode="r")
            names = child_names(experts)
        except Exception:  # noqa: BLE001 - absent or damaged
            continue
        for name in names:
            try:
                hints = hints or "hints" in child_names(experts[name])
                spec = experts[name].attrs["fingerprint"]["expert"]
                args[expert_arg(name, spec["kind"], spec["ref"])] = None
            except Exception:  # noqa: BLE001 - a damaged group is known by its name
                args[name] = None
    return ",".join(args) or None, hints


def store_limit(path: Path) -> int | None:
    """The ``--limit`` that rebuilds the store's items: the largest split (a split holds
    ``min(limit, size)`` items). Read split by split, so a damaged root does not hide it."""
    sizes = []
    for split in SPLITS:
        try:
            sizes.append(int(zarr.open_group(path, path=f"{split}/items", mode="r").attrs["n"]))
        except Exception:  # noqa: BLE001 - absent or damaged: that split says nothing
            continue
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
        same = attrs.get("format_version") == FORMAT_VERSION and attrs.get("task_spec") == task_spec
        if same:
            return root
        if not force:
            raise UserError(
                f"store {path} was built with another format or task spec; rebuild: {rebuild}"
            )
        shutil.rmtree(path)
    root = zarr.open_group(path, mode="w", zarr_format=3)
    root.attrs.update({"format_version": FORMAT_VERSION, "task": task, "task_spec": task_spec})
    return root


def one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Damaged(Exception):
    """A node of the store whose metadata (its ``zarr.json``) cannot be read."""

    def __init__(self, where: str, exc: BaseException):
        super().__init__(f"{where}: unreadable metadata ({one_line(exc)})")
        self.where = where


def child(g: zarr.Group, name: str) -> zarr.Group | zarr.Array | None:
    """``g[name]``, None when absent; Damaged when its metadata (or a parent's) is unreadable,
    where zarr would raise a JSON or KeyError from deep inside."""
    try:
        return g[name] if name in g else None
    except Exception as exc:  # noqa: BLE001
        raise Damaged(f"{g.path}/{name}".lstrip("/"), exc) from None


def child_names(g: zarr.Group) -> list[str]:
    """Names of ``g``'s members, listed without parsing them (one bad member must not hide
    the others) and without zarr's interrupted-write leftovers."""
    async def names() -> list[str]:
        return [k async for k in g.store.list_dir(g.path)]

    return sorted(k for k in sync(names()) if k != "zarr.json" and not k.endswith(".partial"))


def require_container(g: zarr.Group, name: str) -> zarr.Group:
    """A member group that holds no attributes (a split, ``experts``, ``router``); an
    unreadable ``zarr.json`` of it is rewritten, its members kept."""
    try:
        return g.require_group(name)
    except Exception:  # noqa: BLE001 - unreadable metadata: nothing in it is lost by a rewrite
        sync(g.store.delete(f"{g.path}/{name}/zarr.json".lstrip("/")))
        return g.require_group(name)


EXPERT_ARRAYS = ("last", "first", "random", "layers_last", "layers_mean", "random_pos",
                 "n_tokens", "truncated")
ROUTER_ARRAYS = ("emb",)


def required_arrays(g: zarr.Group) -> tuple[str, ...]:
    """The arrays a group of this kind cannot be read without (its place in the layout)."""
    kind = g.path.split("/")[-2] if "/" in g.path else ""
    if kind == "experts":
        return EXPERT_ARRAYS + ("done",)
    if kind == "router":
        return ROUTER_ARRAYS + ("done",)
    return ITEM_FIELDS if g.path.endswith("items") else ()


def unit_damage(g: zarr.Group) -> str | None:
    """Why a group's structure cannot be trusted (one phrase), or None: created but never
    finished, a member with unreadable metadata, or a required array missing."""
    if "/" in g.path and g.path.split("/")[-2] in ("experts", "router") \
            and g.attrs.get("fingerprint") is None:
        return "unfinished (killed while being created)"
    names = child_names(g)
    for name in names:
        try:
            g[name]
        except Exception:  # noqa: BLE001
            return f"array {name} has unreadable metadata"
    missing = [n for n in required_arrays(g) if n not in names]
    return f"missing array {', '.join(missing)}" if missing else None


def missing_chunks(arr: zarr.Array, chunks: list[int] | None = None) -> list[int]:
    """Row chunks (of ``chunks``, default all) whose file is absent. Zarr reads an absent chunk
    as the fill value, silently; precompute writes every chunk (``dense_writes``), so absence
    is damage. Bool arrays are exempt: stores from before ``dense_writes`` left all-False
    ``truncated`` chunks unwritten."""
    if arr.dtype == np.bool_ or arr.shape[0] == 0:
        return []

    async def keys() -> set[str]:
        return {k async for k in arr.store.list_prefix(f"{arr.path}/")}

    present = sync(keys())
    tail = (0,) * (arr.ndim - 1)
    want = range(n_chunks(arr.shape[0], arr.chunks[0])) if chunks is None else chunks
    return [c for c in want
            if f"{arr.path}/{arr.metadata.encode_chunk_key((c, *tail))}" not in present]


def dense_writes():
    """Context in which every chunk is written, even one equal to the fill value, so that an
    absent chunk file always means damage (see ``missing_chunks``)."""
    return zarr.config.set({"array.write_empty_chunks": True})


def remove_partials(path: Path) -> int:
    """Delete the ``*.<uuid>.partial`` files a killed write leaves behind (zarr writes to one,
    then renames): a stray one in a group makes every later listing warn."""
    stray = [p for p in path.rglob("*.partial") if _PARTIAL.search(p.name)]
    for p in stray:
        p.unlink(missing_ok=True)
    return len(stray)


_PARTIAL = re.compile(r"\.[0-9a-f]{32}\.partial$")


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
