"""The ``dpsql`` command line: a thin layer over the engine that formats what it returns.

Errors dpsql raises on purpose print one line on stderr and exit with status 1 (2 for usage).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from dpsql.cli_output import console, db_option, print_csv, print_table
from dpsql.cli_progress import progress_display, progress_option
from dpsql.cli_publish import register as register_publish
from dpsql.cli_report import register as register_report
from dpsql.cli_serve import register as register_serve
from dpsql.cli_serve import serve_demo
from dpsql.cli_streams import register as register_streams
from dpsql.engine import contributions as contribution_defaults
from dpsql.engine import demo as demo_data
from dpsql.engine.planner import MECHANISM_NAMES
from dpsql.engine.results import LEDGER_COLUMNS, BudgetReport, QueryResult
from dpsql.engine.session import (
    connect,
    database_budget,
    database_ledger,
    database_result,
    database_synopses,
    ledger_path,
    set_policy,
    show_policy,
)
from dpsql.engine.streams import STREAM_MECHANISMS
from dpsql.errors import DpsqlError, LedgerError

_mechanism = click.option(
    "--mechanism",
    type=click.Choice([*MECHANISM_NAMES, *STREAM_MECHANISMS]),
    default=None,
    help="How keys of a GROUP BY column without public keys are released (default: the one "
    "releasing the most keys; alp: threshold + ALP synopsis); laplace forces fresh noise instead "
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
_format = click.option(
    "--format",
    "output_format",
    type=click.Choice(["table", "json", "csv"]),
    default="table",
    show_default=True,
)


def print_result(
    result: QueryResult, output_format: str, title: str | None = None, max_rows: int | None = None
) -> None:
    if output_format == "json":
        click.echo(json.dumps(result.to_dict(), allow_nan=False))
        return
    columns, rows = result.interval_table()
    if output_format == "csv":
        print_csv(columns, rows)
        return
    print_table(title, columns, rows[:max_rows])
    if max_rows is not None and len(rows) > max_rows:
        console.print(f"... {len(rows)} rows in all (first {max_rows} shown)")
    for name, measured in result.measures.items():
        console.print(f"{name} measures: {measured}")
    console.print(
        f"spent epsilon={result.epsilon:g} delta={result.delta:g} "
        f"({result.mechanism}); intervals are {result.confidence:.0%} confidence; "
        f"ledger entry {result.ledger_entry}"
    )


def print_listing(
    document: object, title: str, columns: list[str], rows: list[list[Any]], output_format: str
) -> None:
    """``document`` as JSON, or ``rows`` under ``columns`` as CSV or a table titled ``title``."""
    if output_format == "json":
        click.echo(json.dumps(document))
    elif output_format == "csv":
        print_csv(columns, rows)
    else:
        print_table(title, columns, rows)


def print_budget(report: BudgetReport, output_format: str) -> None:
    columns = [
        "scope",
        "name",
        "epsilon_cap",
        "epsilon_spent",
        "epsilon_remaining",
        "delta_cap",
        "delta_spent",
        "delta_remaining",
    ]
    period = report.lines[0].period if report.lines else None
    columns += ["period"] if period is not None else []
    rows = [[getattr(line, c) for c in columns] for line in report.lines]
    title = "Privacy budget" + (f" (period {period})" if period is not None else "")
    print_listing(report.model_dump(), title, columns, rows, output_format)


def print_synopses(listed: list[dict[str, Any]], output_format: str) -> None:
    columns = ["name", "table", "key_column", "filters", "epsilon", "delta", "created", "bytes"]
    rows = [[s[c] if c != "filters" else " AND ".join(s[c]) for c in columns] for s in listed]
    print_listing(listed, "Synopses", columns, rows, output_format)


def print_ledger(entries: list[dict[str, Any]], output_format: str) -> None:
    rows = [[e.get(c) for c in LEDGER_COLUMNS] for e in entries]
    print_listing(entries, "Ledger", LEDGER_COLUMNS, rows, output_format)


@click.group()
@click.version_option(package_name="dpsql")
def cli() -> None:
    """dpsql: differentially private SQL over DuckDB, with a privacy budget ledger."""


@cli.group()
def policy() -> None:
    """Set or show a database's privacy policy."""


@policy.command("set")
@db_option
@click.option(
    "--file",
    "policy_file",
    required=True,
    type=click.Path(dir_okay=False),
    help="TOML policy file.",
)
def policy_set(database: str, policy_file: str) -> None:
    """Validate a TOML policy against the database and record it in the ledger."""
    entry = set_policy(database, Path(policy_file))
    click.echo(f"policy recorded as ledger entry {entry.seq} in {ledger_path(database)}")


@policy.command("show")
@db_option
def policy_show(database: str) -> None:
    """Print the policy in force as JSON."""
    click.echo(show_policy(database).model_dump_json(indent=2))


@cli.command()
@db_option
@click.option("--analyst", required=True, help="Analyst whose allocation is charged.")
@click.option("--epsilon", type=float, default=None, help="Epsilon for this query.")
@click.option("--delta", type=float, default=None, help="Delta for this query.")
@click.option("--dialect", default="duckdb", show_default=True, help="SQL dialect of the query.")
@_mechanism
@_max_answers
@_accuracy
@_format
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


@cli.command()
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


@cli.command()
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
    help=f"Epsilon spent (default {contribution_defaults.DEFAULT_EPSILON}).",
)
@click.option(
    "--suggest", is_flag=True, help="Noisy histograms and suggested bounds instead of counts."
)
@click.option("--coverage", type=float, default=0.95, show_default=True)
@_format
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
    with connect(database, analyst=analyst) as session:
        result = session.contributions(
            table, group_by=group_by, epsilon=epsilon, suggest=suggest, coverage=coverage
        )
    print_result(result, output_format)
    if suggest and output_format == "table":
        for key, value in result.details["suggested"].items():
            current = result.details["current"][key]
            shown = "none (too few persons)" if value is None else value
            console.print(f"suggested {key} = {shown} (policy: {current})")


@cli.command()
@db_option
@click.option(
    "--analyst",
    default=None,
    help="Only an answer this analyst paid for; without it, any (the administrator's view).",
)
@_format
@click.argument("entry", type=int)
def result(database: str, analyst: str | None, output_format: str, entry: int) -> None:
    """Print the answer released under ledger entry ENTRY again, for free (no new charge)."""
    print_result(database_result(database, entry, analyst), output_format)
    if output_format == "table":
        console.print("fetched from the ledger's stored answers: nothing was charged again")


@cli.command()
@db_option
@click.option("--analyst", default=None, help="Only the synopses this analyst may use.")
@_format
def synopses(database: str, analyst: str | None, output_format: str) -> None:
    """List stored synopses (released structures that answer point queries for free)."""
    print_synopses(database_synopses(database, analyst), output_format)


@cli.command()
@db_option
@click.option("--analyst", default=None, help="Only this analyst (and the dataset).")
@_format
def budget(database: str, analyst: str | None, output_format: str) -> None:
    """Show cap, spent and remaining budget."""
    print_budget(database_budget(database, analyst), output_format)


@cli.group(invoke_without_command=True)
@click.option("--db", "database", type=click.Path(dir_okay=False), help="DuckDB database file.")
@click.option(
    "--analyst",
    default=None,
    help="Only this analyst's own entries (what the analyst is shown); without it, every entry "
    "(the administrator's and auditor's view).",
)
@_format
@click.pass_context
def ledger(
    context: click.Context, database: str | None, analyst: str | None, output_format: str
) -> None:
    """List ledger entries (verified first); `ledger verify` checks the chain, `ledger head`
    prints the newest hash. `--db` may come before or after the subcommand."""
    context.obj = {"database": database}
    if context.invoked_subcommand is not None:
        return
    print_ledger(database_ledger(_ledger_database(context, None), analyst), output_format)


def _ledger_database(context: click.Context, database: str | None) -> str:
    """``--db`` given to the subcommand, or else to ``dpsql ledger`` itself."""
    given = database or (context.obj or {}).get("database")
    if given is None:
        raise click.UsageError("Missing option '--db'.")
    return given


_ledger_db = click.option(
    "--db", "database", default=None, type=click.Path(dir_okay=False), help="DuckDB database file."
)


@ledger.command("verify")
@_ledger_db
@click.option(
    "--expect",
    default=None,
    help="A hash recorded earlier (`dpsql ledger head`): fail unless it is still in the chain, "
    "which detects deleted newest entries.",
)
@click.pass_context
def ledger_verify(context: click.Context, database: str | None, expect: str | None) -> None:
    """Verify the hash chain and every entry's total; name the first bad entry."""
    database = _ledger_database(context, database)
    entries = database_ledger(database)
    if expect is not None:
        found = next((e for e in entries if e["hash"] == expect.strip().lower()), None)
        if found is None:
            raise LedgerError(
                f"hash {expect!r} is not in the ledger {str(ledger_path(database))!r}: entries "
                "recorded after it was taken were deleted, or the ledger was replaced"
            )
        newer = len(entries) - entries.index(found) - 1
        click.echo(f"the expected hash is entry {found['seq']}; {newer} entries were added since")
    click.echo(f"ledger {ledger_path(database)} verified: {len(entries)} entries, chain intact")


@ledger.command("head")
@_ledger_db
@click.pass_context
def ledger_head(context: click.Context, database: str | None) -> None:
    """Print the newest entry's hash (keep a copy; `verify --expect` checks it later)."""
    entries = database_ledger(_ledger_database(context, database))
    if not entries:
        raise LedgerError("the ledger has no entries")
    click.echo(entries[-1]["hash"])


@cli.command()
@click.option(
    "--dir",
    "directory",
    default="demo",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where to build the demo database.",
)
@click.option("--rows", default=200_000, show_default=True, type=click.IntRange(1000, 10**8))
@click.option(
    "--serve",
    "then_serve",
    is_flag=True,
    help="Then serve the demo database on 127.0.0.1:8765 with an analyst and an auditor token.",
)
def demo(directory: str, rows: int, then_serve: bool) -> None:
    """Build a generated demo database, set its policy, and run a few DP queries."""
    database = Path(directory) / "demo.duckdb"
    ledger_path(database).unlink(missing_ok=True)
    for suffix in ("-wal", "-shm"):
        Path(f"{ledger_path(database)}{suffix}").unlink(missing_ok=True)
    demo_data.build_demo(database, rows=rows)
    policy_file = Path(directory) / "policy.toml"
    policy_file.write_text(demo_data.DEMO_POLICY, encoding="utf-8")
    set_policy(database, policy_file)
    console.print(f"Built {database} ({rows} generated rows) with policy {policy_file}.\n")
    with connect(database, analyst="alice") as session:
        for title, sql in demo_data.DEMO_QUERIES:
            console.print(title, style="bold")
            console.print(f"  {sql}")
            print_result(session.execute(sql), "table", max_rows=12)
            console.print()
        refused = "SELECT country, MAX(bytes) FROM requests GROUP BY country"
        console.print("A query dpsql refuses (no charge)", style="bold")
        console.print(f"  {refused}")
        try:
            session.execute(refused)
        except DpsqlError as error:
            console.print(f"  refused: {error}\n")
        print_budget(session.budget(), "table")
    console.print(
        f"Try: dpsql query --db {database} --analyst alice "
        '"SELECT country, COUNT(*) FROM requests GROUP BY country"'
    )
    if then_serve:
        serve_demo(str(database))


register_publish(cli)
register_report(cli)
register_serve(cli)
register_streams(cli)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI; one-line errors on stderr, no traceback."""
    try:
        cli.main(args=argv, prog_name="dpsql", standalone_mode=False)
    except DpsqlError as error:
        click.echo(f"dpsql: error: {error}", err=True)
        return 1
    except click.exceptions.Abort:
        click.echo("dpsql: aborted", err=True)
        return 1
    except click.ClickException as error:
        error.show()
        return error.exit_code
    return 0


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    run()
