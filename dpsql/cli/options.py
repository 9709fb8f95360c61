"""Options that several commands share: the database file and the output format."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

__all__ = ["db_option", "format_option"]

db_option = click.option(
    "--db", "database", required=True, type=click.Path(dir_okay=False), help="DuckDB database file."
)


def format_option(
    *choices: str, show_default: bool = True
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--format`` (``output_format``) among ``choices``, by default ``table``."""
    return click.option(
        "--format",
        "output_format",
        type=click.Choice(list(choices)),
        default="table",
        show_default=show_default,
    )
