"""Entry point of the ``musketeers`` command: builds the Typer app from its command modules."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys

import typer
import typer.rich_utils

from musketeers.cache.errors import UserError
from musketeers.cache.untrusted import printable
from musketeers.cli import interrupt

# Outside a terminal (a pipe, a file, a test) Rich would lay help out at 80 columns and cut
# option values short; a width set by the user (TERMINAL_WIDTH, COLUMNS) still wins.
HELP_WIDTH = 160
if not sys.stdout.isatty() and not os.environ.get("TERMINAL_WIDTH") \
        and not os.environ.get("COLUMNS"):
    typer.rich_utils.MAX_WIDTH = HELP_WIDTH

app = typer.Typer(
    help="Frozen LM experts help a small LoRA policy reason through their hidden states (RLVR).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Each module exposes register(app); a module that is absent in a partial install is skipped.
_COMMAND_MODULES = ("precompute", "train", "ablate", "demo", "fixtures", "teams", "tasks")


def _register_commands() -> None:
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(f"musketeers.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"musketeers.cli.{name}":
                continue
            raise
        module.register(app)


_register_commands()


def _exit_on_sigterm() -> None:
    """Turn SIGTERM (``kill``, a scheduler's time limit, a closing terminal) into SystemExit.

    Python's default SIGTERM ends the process at once, skipping every ``finally``: a grid's
    ledger would then never record the interrupted call's time. As an exception it unwinds
    like Ctrl-C (after the running torch op returns), and the exit status stays 128 + 15.
    """
    def handler(signum: int, _frame) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


INTERRUPTED = {128 + signal.SIGINT: "SIGINT", 128 + signal.SIGTERM: "SIGTERM"}


class _Printable(logging.Formatter):
    """Log lines carry values read from files (names, configs): their control characters are
    escaped, so no file can drive the terminal."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record), keep="\n\t")


def main() -> None:
    _exit_on_sigterm()
    interrupt.clear()
    handler = logging.StreamHandler()
    handler.setFormatter(_Printable("%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    try:
        app()  # click turns Ctrl-C into SystemExit(130); the SIGTERM handler raises 143
    except UserError as exc:
        from musketeers.runtime.distributed import rank_prefix

        print(printable(f"error: {rank_prefix()}{exc}"), file=sys.stderr)
        sys.exit(2)
    except SystemExit as exc:
        if exc.code in INTERRUPTED:
            hint = interrupt.resume_hint()
            hint = f"; {hint}" if hint else ""
            print(f"interrupted ({INTERRUPTED[exc.code]}){hint}", file=sys.stderr)
        raise


if __name__ == "__main__":
    main()
