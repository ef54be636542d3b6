"""The key that binds a checkpoint's manifest to its content (HMAC-SHA256).

A manifest of plain sha256 sums only finds accidents: whoever replaces a file can recompute
its sum. Each manifest is therefore signed with a per-user secret kept outside every run
folder, ``~/.config/musketeers/manifest.key`` (created 0600 on first use;
``MUSKETEERS_MANIFEST_KEY`` names another file), so a manifest that verifies was written by
this user's own training.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path
from typing import Any

from musketeers.cache.errors import UserError

ENV = "MUSKETEERS_MANIFEST_KEY"


def key_path() -> Path:
    return Path(os.environ.get(ENV) or Path.home() / ".config" / "musketeers" / "manifest.key")


def _key() -> bytes:
    """The user's key, created (0600, atomically, never replaced) when it does not exist yet."""
    path = key_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32))
        key = path.read_text().strip()
    except OSError as exc:
        raise UserError(f"manifest key {path} cannot be read or created ({exc.strerror or exc}); "
                        f"make its folder writable or set {ENV} to a file of your own") from None
    if len(key) < 32:
        raise UserError(f"manifest key {path} is too short; delete it (a new one is made) or set "
                        f"{ENV} to another file")
    return key.encode()


def sign(content: Any) -> str:
    """HMAC-SHA256 of ``content``'s canonical JSON under the user's key."""
    data = json.dumps(content, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(_key(), data, hashlib.sha256).hexdigest()


def signed(content: Any, mac: Any) -> bool:
    return isinstance(mac, str) and hmac.compare_digest(sign(content), mac)
