"""Analyst commands: ``dpsql query``, ``explain``, ``contributions``, ``result``, ``schema``.

Thin over :class:`dpsql.engine.session.Session`; the printers are in :mod:`dpsql.cli.output`.
"""

from __future__ import annotations

import json

import click

from dpsql.cli.options import db_option, format_option
from dpsql.cli.output import console, print_result, print_schema
from dpsql.cli.progress import progress_display, progress_option
from dpsql.engine.choices import CONTRIBUTIONS_EPSILON, MECHANISM_NAMES, STREAM_MECHANISMS

__all__ = ["contributions", "explain", "query", "result", "schema"]

_mechanism = click.option(
    "--mechanism",
    type=click.Choice([*MECHANISM_NAMES, *STREAM_MECHANISMS]),
    default=None,
    help="How keys of a GROUP BY column without public keys are released (default: the one "
    "releasing the most keys among those whose count error is within 1.3x the best; "
    "OPTIONS(prefer='keys'|'counts') moves along that frontier; alp: threshold + ALP synopsis); "
    "laplace forces fresh noise instead "
    "of a stored synopsis or stream; pmw / range_tree answer a COUNT(*) from a query stream, "
    "opening one if none answers it.",
)
_max_answers = click.option(
    "--max-answers",
    type=int,
    default=None,
    help="Cut-off c of the sparse vector technique (range JOIN with HAVING).",
)
_accuracy = click.option(
    "--accuracy",
    type=float,
    default=None,
    help="Instead of --epsilon: the interval half-width to meet; the least epsilon meeting it "
    "is charged.",
)


@click.command()
@db_option
@click.option("--analyst", required=True, help="Analyst whose allocation is charged.")
@click.option("--epsilon", type=float, default=None, help="Epsilon for this query.")
@click.option("--delta", type=float, default=None, help="Delta for this query.")
@click.option("--dialect", default="duckdb", show_default=True, help="SQL dialect of the query.")
@_mechanism
@_max_answers
@_accuracy
@format_option("table", "json", "csv")
@progress_option
@click.argument("sql")
def query(
    database: str,
    analyst: str,
    epsilon: float | None,
    delta: float | None,
    dialect: str,
    mechanism: str | None,
    max_answers: int | None,
    accuracy: float | None,
    output_format: str,
    show_progress: bool | None,
    sql: str,
) -> None:
    """Answer SQL with differential privacy, charging the analyst's budget first."""
    from dpsql.engine.session import connect

    with (
        progress_display(show_progress) as display,
        connect(database, analyst=analyst, dialect=dialect, progress=display) as session,
    ):
        result = session.execute(
            sql,
            epsilon=epsilon,
            delta=delta,
            mechanism=mechanism,
            max_answers=max_answers,
            accuracy=accuracy,
        )
    print_result(result, output_format)


@click.command()
@db_option
@click.option("--analyst", required=True)
@click.option("--epsilon", type=float, default=None)
@click.option("--delta", type=float, default=None)
@_mechanism
@_max_answers
@_accuracy
@click.argument("sql")
def explain(
    database: str,
    analyst: str,
    epsilon: float | None,
    delta: float | None,
    mechanism: str | None,
    max_answers: int | None,
    accuracy: float | None,
    sql: str,
) -> None:
    """Show the plan, sensitivities and cost of SQL without reading data or charging."""
    from dpsql.engine.session import connect

    with connect(database, analyst=analyst) as session:
        report = session.explain(
            sql,
            epsilon=epsilon,
            delta=delta,
            mechanism=mechanism,
            max_answers=max_answers,
            accuracy=accuracy,
        )
        click.echo(json.dumps(report, indent=2))


@click.command()
@db_option
@click.option("--analyst", required=True, help="Analyst whose allocation is charged.")
@click.option("--table", required=True, help="A table of the policy.")
@click.option(
    "--group-by", "group_by", multiple=True, help="Group column(s) whose groups are counted."
)
@click.option(
    "--epsilon",
    type=float,
    default=None,
    help=f"Epsilon spent (default {CONTRIBUTIONS_EPSILON}).",
)
@click.option(
    "--suggest", is_flag=True, help="Noisy histograms and suggested bounds instead of counts."
)
@click.option("--coverage", type=float, default=0.95, show_default=True)
@format_option("table", "json", "csv")
def contributions(
    database: str,
    analyst: str,
    table: str,
    group_by: tuple[str, ...],
    epsilon: float | None,
    suggest: bool,
    coverage: float,
    output_format: str,
) -> None:
    """How much the contribution bounds cut a table (noisy counts of persons over each bound),
    or --suggest bounds from noisy histograms; charged like any query."""
    from dpsql.engine.session import connect

    with connect(database, analyst=analyst) as session:
        result = session.contributions(
            table, group_by=group_by, epsilon=epsilon, suggest=suggest, coverage=coverage
        )
    print_result(result, output_format)
    if suggest and output_format == "table":
        for key, value in result.details["suggested"].items():
            current = result.details["current"][key]
            shown = "none (too few persons)" if value is None else value
            console().print(f"suggested {key} = {shown} (policy: {current})")


@click.command()
@db_option
@click.option(
    "--analyst",
    default=None,
    help="Only an answer this analyst paid for; without it, any (the administrator's view).",
)
@click.option(
    "--query",
    "query_name",
    default=None,
    help="Of a report's ledger entry: the name of its query to print.",
)
@format_option("table", "json", "csv")
@click.argument("entry", type=int)
def result(
    database: str, analyst: str | None, query_name: str | None, output_format: str, entry: int
) -> None:
    """Print the answer released under ledger entry ENTRY again, for free (no new charge);
    of a report's entry, the answer to its query --query NAME."""
    from dpsql.engine.session import database_result

    print_result(database_result(database, entry, analyst, query_name), output_format)
    if output_format == "table":
        console().print("fetched from the ledger's stored answers: nothing was charged again")


@click.command()
@db_option
@click.option("--analyst", required=True, help="Analyst whose tables and budget are shown.")
@format_option("table", "json")
def schema(database: str, analyst: str, output_format: str) -> None:
    """Show the tables the analyst may query: columns and types, privacy units, contribution
    bounds, public keys, bounds, key domains, query defaults and the analyst's budget. Reads no
    row and charges nothing."""
    from dpsql.engine.session import connect

    with connect(database, analyst=analyst) as session:
        described = session.schema()
    print_schema(described, output_format)
