"""musketeers.cli — the Typer app: thin wiring of the method and the cache."""
