"""Entry point of the ``musketeers`` command: builds the Typer app from its command modules."""

from __future__ import annotations

import importlib
import logging
import sys

import typer

from musketeers.cache.errors import UserError

app = typer.Typer(
    help="Frozen LM experts help a small LoRA policy reason through their hidden states (RLVR).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Each module exposes register(app); a module that is absent in a partial install is skipped.
_COMMAND_MODULES = ("precompute", "train", "ablate", "demo", "fixtures")


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


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S"
    )
    try:
        app()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
