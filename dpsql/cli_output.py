"""Output helpers shared by the command-line modules: tables, CSV, and common options."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.table import Table

from dpsql.engine.results import csv_text

__all__ = ["console", "db_option", "print_csv", "print_table"]

console = Console(highlight=False, markup=False, soft_wrap=True)
if not console.is_terminal or console.width < 160:
    console.width = 160

db_option = click.option(
    "--db", "database", required=True, type=click.Path(dir_okay=False), help="DuckDB database file."
)


def _number(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e6 else f"{value:.0f}"
    return str(value)


def print_table(title: str | None, columns: list[str], rows: list[list[Any]]) -> None:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(_number(v) for v in row))
    console.print(table)


def print_csv(columns: list[str], rows: list[list[Any]]) -> None:
    click.echo(csv_text(columns, rows), nl=False)
