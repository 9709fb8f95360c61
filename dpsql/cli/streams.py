"""Query streams: ``dpsql stream open`` (they are listed by ``dpsql synopses``).

Thin over ``Session.open_stream`` (:mod:`dpsql.engine.streams`).
"""

from __future__ import annotations

import click

from dpsql.cli.options import db_option, format_option
from dpsql.cli.output import print_stream
from dpsql.engine.choices import DEFAULT_EXPECTED_QUERIES, STREAM_MECHANISMS

__all__ = ["stream"]


def _column(text: str, bounds: dict[str, tuple[str, str]]) -> tuple[object, ...]:
    """``NAME`` or ``NAME:WIDTH`` (an integer, or text: an interval, a decimal), with the
    column's ``--bounds`` if given."""
    name, _, width = text.partition(":")
    if not name:
        raise click.BadParameter(f"a column is NAME or NAME:WIDTH, got {text!r}")
    spec: tuple[object, ...] = (name, int(width) if width.strip().isdigit() else width or 1)
    given = bounds.pop(name, None)
    return spec + given if given else spec


def _bounds(texts: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """``NAME=LOW..HIGH`` (repeatable)."""
    found: dict[str, tuple[str, str]] = {}
    for text in texts:
        name, _, rest = text.partition("=")
        low, dots, high = rest.partition("..")
        if not name or not dots or not low or not high:
            raise click.BadParameter(f"bounds are NAME=LOW..HIGH, got {text!r}")
        found[name] = (low, high)
    return found


@click.group()
def stream() -> None:
    """Query streams: one charge answers many COUNT queries over declared columns."""


@stream.command("open")
@db_option
@click.option("--analyst", required=True, help="Analyst whose allocation pays for the stream.")
@click.option("--table", required=True, help="A table of the policy.")
@click.option(
    "--column",
    "columns",
    multiple=True,
    required=True,
    help="A column of the domain (integer, DATE, TIMESTAMP, DECIMAL), as NAME or NAME:BIN_WIDTH "
    "(an integer; days for DATE; '1 hour' for TIMESTAMP; '0.50' for DECIMAL); repeatable.",
)
@click.option(
    "--bounds",
    "bounds",
    multiple=True,
    help="NAME=LOW..HIGH in the column's type (default: the policy's bounds); repeatable.",
)
@click.option(
    "--filter",
    "fixed",
    default=None,
    help="A fixed WHERE condition on other columns (e.g. \"country = 'DK'\"): the stream "
    "counts those rows only and answers queries whose WHERE is exactly it AND conditions on "
    "its columns.",
)
@click.option(
    "--mechanism",
    type=click.Choice(list(STREAM_MECHANISMS)),
    default="pmw",
    show_default=True,
    help="pmw: online private multiplicative weights; range_tree: hierarchical histogram.",
)
@click.option("--epsilon", type=float, required=True, help="Epsilon charged once for the stream.")
@click.option("--delta", type=float, default=0.0, show_default=True)
@click.option("--updates", type=int, default=None, help="pmw: updates before it is exhausted.")
@click.option("--threshold", type=float, default=None, help="pmw: error threshold in rows.")
@click.option(
    "--expected-queries",
    type=int,
    default=DEFAULT_EXPECTED_QUERIES,
    show_default=True,
    help="pmw: sizes the default threshold.",
)
@click.option(
    "--warm-share",
    type=float,
    default=None,
    help="pmw: share of epsilon spent on the warm start (a noisy tree); default 0.8.",
)
@click.option("--name", default=None, help="Name of the stream (default: derived).")
@format_option("table", "json", show_default=False)
def stream_open(
    database: str,
    analyst: str,
    table: str,
    columns: tuple[str, ...],
    bounds: tuple[str, ...],
    fixed: str | None,
    mechanism: str,
    epsilon: float,
    delta: float,
    updates: int | None,
    threshold: float | None,
    expected_queries: int,
    warm_share: float | None,
    name: str | None,
    output_format: str,
) -> None:
    """Open a stream over TABLE's columns, charging (epsilon, delta) once."""
    from dpsql.engine.session import connect

    declared = _bounds(bounds)
    specs = [_column(c, declared) for c in columns]
    if declared:
        raise click.BadParameter(
            f"--bounds for a column not given with --column: {sorted(declared)}"
        )
    with connect(database, analyst=analyst) as session:
        opened = session.open_stream(
            table,
            specs,
            mechanism=mechanism,
            epsilon=epsilon,
            delta=delta,
            updates=updates,
            threshold=threshold,
            expected_queries=expected_queries,
            name=name,
            filter=fixed,
            warm_share=warm_share,
        )
    print_stream(opened, output_format)
