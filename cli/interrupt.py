"""What to tell a user whose command SIGINT/SIGTERM stopped: the running command names how to
resume it (train knows its run folder); ``main`` prints it. Its own module, not main's: under
``python -m musketeers.cli.main`` that module is ``__main__`` and an import of it is a copy."""

from __future__ import annotations

_hint: list[str] = []


def on_interrupt(hint: str) -> None:
    """Name how to resume the running command if it is interrupted."""
    _hint[:] = [hint]


def resume_hint() -> str | None:
    return _hint[0] if _hint else None


def clear() -> None:
    _hint.clear()
