"""Values read from files, grids and configs, made safe to use: as a folder's name, as a path
to write under, as text on a terminal or in a published report.

``safe_name`` is the one check of every name that becomes a path (run, grid, store, expert):
one component, no separator, no leading dot (so never ``..``). ``confine`` refuses a write
outside the folders the user gave (resolved, so a symlink out counts as out). ``printable``
escapes control characters (terminal escape sequences, bidi overrides) in text bound for a
terminal or a report.
"""

from __future__ import annotations

import re
from pathlib import Path

from musketeers.cache.errors import UserError

SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@+=,-]{0,199}")
# C0 and C1 controls, DEL, and the bidi overrides that reorder what a reader sees
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: object, keep: str = "") -> str:
    """``text`` with every control character but those in ``keep`` written as an escape."""
    def escape(m: re.Match[str]) -> str:
        c = m.group()
        return c if c in keep else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")

    return _CONTROL.sub(escape, str(text))


def safe_name(value: object, what: str, fix: str) -> str:
    """``value`` as a folder name, or UserError naming ``what`` and the ``fix``."""
    text = str(value)
    if SAFE_NAME.fullmatch(text) is None:
        raise UserError(f"{what} {printable(text)!r} cannot name a folder (letters, digits and "
                        f"_.:@+=,- only, not starting with a dot, at most 200); {fix}")
    return text


def confine(path: Path, *roots: Path, what: str) -> Path:
    """``path`` when it resolves inside one of ``roots`` (resolved); UserError otherwise."""
    resolved = Path(path).resolve()
    for root in roots:
        if resolved.is_relative_to(Path(root).resolve()):
            return Path(path)
    raise UserError(f"{what} {printable(path)} lies outside {', '.join(map(str, roots))}; "
                    "remove the symlink or name that leads there")
