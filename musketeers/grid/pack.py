"""A published folder kept as one pack: ``<folder>.tar.xz`` beside where the folder would be.

A grid's published runs are thousands of small text files that every report rebuild reads
whole; committed as one deterministic xz tarball (members sorted, times, owners and modes
fixed) they take a tenth of the space, and the same files always make the same bytes, so a
publish that changes nothing changes no commit. xz rather than gzip: the runs repeat the same
validation questions, and xz's window spans runs where gzip's 32 KiB does not.
Standard tools read it: ``tar -xJf reports/pocket/runs.tar.xz -C /tmp/pocket`` unpacks every
run, ``tar -xJOf reports/pocket/runs.tar.xz RUN/eval.json`` prints one file.
"""

from __future__ import annotations

import fcntl
import io
import lzma
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from musketeers.cache.errors import UserError

SUFFIX = ".tar.xz"
# a pack unpacks into a temporary folder: past this it is no grid's small artefacts
MAX_BYTES = 2 << 30


def pack_of(folder: Path) -> Path:
    """The pack that stands for ``folder``: ``runs`` → ``runs.tar.xz`` beside it."""
    folder = Path(folder)
    return folder if folder.name.endswith(SUFFIX) else folder.with_name(folder.name + SUFFIX)


def _damaged(pack: Path, why: str) -> UserError:
    return UserError(f"{pack} is damaged ({why}); restore it with `git checkout -- {pack}` "
                     "(or delete it to publish afresh)")


def read_pack(pack: Path) -> dict[str, bytes]:
    """Every regular file of ``pack`` by its relative path; a damaged or foreign pack (a
    member that is a link, absolute, or climbs out with ``..``) is a one-line UserError."""
    files: dict[str, bytes] = {}
    total = 0
    try:
        with tarfile.open(pack, "r:xz") as tar:
            for member in tar:
                parts = PurePosixPath(member.name).parts
                if member.isdir():
                    continue
                if (not member.isfile() or not parts or parts[0] == "/" or ".." in parts):
                    raise _damaged(pack, f"member {member.name!r} is not a plain relative file")
                total += member.size
                if total > MAX_BYTES:
                    raise _damaged(pack, f"more than {MAX_BYTES >> 30} GiB unpacked")
                data = tar.extractfile(member)
                files[PurePosixPath(*parts).as_posix()] = data.read() if data else b""
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as err:
        raise _damaged(pack, str(err).splitlines()[0] if str(err) else type(err).__name__
                       ) from None
    return files


def write_pack(pack: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` (relative path → bytes) as ``pack``, the same bytes for the same files;
    the pack is replaced whole, never left half-written."""
    pack = Path(pack)
    pack.parent.mkdir(parents=True, exist_ok=True)
    tmp = pack.with_name(f".{pack.name}.tmp")
    with lzma.open(tmp, "wb", preset=9 | lzma.PRESET_EXTREME) as xz, \
            tarfile.open(fileobj=xz, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(files[name]), 0o644, 0
            tar.addfile(info, io.BytesIO(files[name]))
    tmp.replace(pack)


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every regular file under ``folder`` by its path relative to it (links left out: a
    published file is never a link)."""
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


def unpack(pack: Path, dest: Path) -> None:
    """Write every file of ``pack`` under ``dest``."""
    for name, data in read_pack(pack).items():
        path = Path(dest) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _both(folder: Path) -> UserError:
    return UserError(f"both {folder}/ and {pack_of(folder)} exist; keep one: move the folder "
                     f"away (e.g. `mv {folder} {folder}.old`) to use the pack, or delete the "
                     "pack to use the folder")


@contextmanager
def opened(folder: Path) -> Iterator[Path]:
    """A folder to read: ``folder`` itself when it is one, else its pack unpacked into a
    temporary folder (removed after); a pack named directly is unpacked too."""
    folder, pack = Path(folder), pack_of(folder)
    if folder.is_dir():
        if pack.is_file():
            raise _both(folder)
        yield folder
        return
    if not pack.is_file():
        yield folder  # neither: the caller's empty case
        return
    with tempfile.TemporaryDirectory(prefix="musketeers-pack-") as tmp:
        view = Path(tmp) / folder.name.removesuffix(SUFFIX)
        view.mkdir()
        unpack(pack, view)
        yield view


@contextmanager
def editing(folder: Path) -> Iterator[Path]:
    """A folder to change that is written back as ``folder``'s pack when the block ends
    without error (one writer at a time: workers of one grid publish into one pack). A
    folder there from before packs is packed, checked, and removed."""
    folder, pack = Path(folder), pack_of(folder)
    pack.parent.mkdir(parents=True, exist_ok=True)
    lock = os.open(pack.parent, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if folder.is_dir() and pack.is_file():
            raise _both(folder)
        legacy = folder.is_dir() and not folder.is_symlink()
        with tempfile.TemporaryDirectory(prefix="musketeers-pack-") as tmp:
            view = Path(tmp) / pack.name.removesuffix(SUFFIX)
            if legacy:
                shutil.copytree(folder, view, symlinks=True)
            else:
                view.mkdir()
                if pack.is_file():
                    unpack(pack, view)
            yield view
            files = folder_files(view)
            if files or pack.is_file():
                write_pack(pack, files)
            if legacy and read_pack(pack) == files:
                shutil.rmtree(folder)  # every file it held is in the pack
    finally:
        os.close(lock)
