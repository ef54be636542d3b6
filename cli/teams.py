"""``musketeers teams``: the named teams of a roster, their members and deviations."""

from __future__ import annotations

from typing import Annotated

import typer


def teams(
    team: Annotated[str | None, typer.Argument(help="one team (default: every team)")] = None,
    roster: Annotated[str, typer.Option(help="pocket, paper or tiny")] = "pocket",
) -> None:
    """Show each team's experts in a roster, with where it departs from the paper's team."""
    from musketeers.teams import POLICIES, TEAMS, describe

    for name in [team] if team else TEAMS:
        typer.echo(describe(name, roster) + "\n")
    typer.echo("policies: " + ", ".join(f"{k} = {v}" for k, v in POLICIES.items()))


def register(app: typer.Typer) -> None:
    app.command("teams")(teams)
