"""The root ``dpsql`` group with every command added to it, and the entry points around it.

Errors dpsql raises on purpose print one line on stderr and exit with status 1 (2 for usage).
"""

from __future__ import annotations

import sys

import click

from dpsql.cli.demo import demo
from dpsql.cli.ledger import budget, ledger, policy, synopses
from dpsql.cli.publish import publish_rr_command, rr
from dpsql.cli.query import contributions, explain, query, result, schema
from dpsql.cli.report import report
from dpsql.cli.serve import accept_remote, serve, token
from dpsql.cli.streams import stream
from dpsql.errors import DpsqlError

__all__ = ["cli", "main", "run"]


@click.group()
@click.version_option(package_name="dpsql")
def cli() -> None:
    """dpsql: differentially private SQL over DuckDB, with a privacy budget ledger."""


for _command in (
    query,
    explain,
    contributions,
    result,
    schema,
    policy,
    budget,
    synopses,
    ledger,
    stream,
    report,
    publish_rr_command,
    rr,
    serve,
    token,
    demo,
):
    cli.add_command(_command)
accept_remote(cli)


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
