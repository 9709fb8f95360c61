"""The root ``dpsql`` group with every command added to it, and the entry points around it.

Errors dpsql raises on purpose print one line on stderr and exit with status 1 (2 for usage).
"""

from __future__ import annotations

import gc
import os
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
    """Console-script entry point (and ``python -m dpsql.cli``): one command in its own process.

    Three settings for this process only (``main``, which tests and other programs call in
    theirs, changes none), each CPU a short command spent for nothing:

    - NumPy's OpenBLAS starts a thread per core when it loads, each spinning about 2**28 cycles
      (0.1 s of CPU) before it sleeps, though a command rarely multiplies a matrix: 2**4 cycles
      (``OPENBLAS_THREAD_TIMEOUT``, unless set) lets them sleep at once, and waking them for a
      large product costs microseconds. NumPy loads only inside a command, after this.
    - The cyclic garbage collector runs every 200,000 new objects rather than every 700 (as mypy
      does): a command's imports create about 125,000 objects that live as long as the process.
    - What is left when the command returns is frozen, so that the interpreter's exit does not
      free it object by object: the operating system takes the memory back at once, while open
      streams are still flushed and ``atexit`` handlers still run.

    On two cores they saved a query on a tiny database about 0.08, 0.05 and 0.09 s of CPU.
    """
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
    gc.set_threshold(200_000)
    code = main()
    gc.freeze()
    sys.exit(code)
