"""Token chunks already hashed against their recorded digests, remembered so that the next run
on the same store (a resume, the grid's next run) does not hash them again.

The reader hashes every chunk of a token unit before its rows are used, which costs seconds per
GiB (docs/channels.md). A chunk passes unhashed only when nothing about it can have changed
since it passed: the same store, unit, recorded digest and fingerprint, and every file that
holds it (``token_layout.chunk_files``) the same inode, size, mtime and ctime. Any write,
rename or copy over a file sets its ctime to now, and no user call sets it back, so a tampered
chunk is hashed again, and refused.

Kept as one JSON file per store under ``MUSKETEERS_VERIFIED_DIR`` (else
``~/.cache/musketeers/verified``); a file that cannot be read or written only costs a check.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

VERIFIED_DIR_ENV = "MUSKETEERS_VERIFIED_DIR"


def verified_dir() -> Path:
    return Path(os.environ.get(VERIFIED_DIR_ENV) or
                Path.home() / ".cache" / "musketeers" / "verified")


def chunk_key(parts: Sequence[object], files: Sequence[Path]) -> str | None:
    """The identity of a chunk as checked: ``parts`` (digest, fingerprint, path) and each of its
    files' (inode, size, mtime, ctime); None when a file is gone (hash it: it will fail)."""
    stats = []
    for f in files:
        try:
            st = f.stat()
        except OSError:
            return None
        stats.append([str(f), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns])
    blob = json.dumps([list(map(str, parts)), stats], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class Verified:
    """The keys of the chunks of one store that hashed to their recorded digests."""

    def __init__(self, store: Path):
        name = hashlib.sha256(str(store.resolve()).encode()).hexdigest()[:32]
        self.path = verified_dir() / f"{name}.json"
        try:
            self.keys = set(json.loads(self.path.read_text("utf-8")))
        except (OSError, ValueError, TypeError):
            self.keys = set()
        self.added: set[str] = set()
        self.skipped = 0  # chunks passed unhashed, for the reader's log line

    def passed(self, key: str | None) -> bool:
        known = key is not None and key in self.keys
        self.skipped += known
        return known

    def add(self, key: str | None) -> None:
        if key is not None and key not in self.keys:
            self.keys.add(key)
            self.added.add(key)

    def save(self) -> None:
        """Write the keys (atomically) when any was added; a failure is only a lost saving."""
        if not self.added:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(sorted(self.keys)))
            os.replace(tmp, self.path)
            self.added.clear()
        except OSError:
            pass
