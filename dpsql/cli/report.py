"""Audited reports: ``dpsql report plan`` and ``dpsql report run``.

Thin over :mod:`dpsql.engine.report`.
"""

from __future__ import annotations

import click

from dpsql.cli.options import db_option, format_option
from dpsql.cli.output import console, print_plan

__all__ = ["report"]

_spec = click.argument("spec", type=click.Path(dir_okay=False))
_analyst = click.option("--analyst", required=True, help="Analyst whose allocation is charged.")


@click.group()
def report() -> None:
    """Price, charge and publish a batch of queries as one audited report."""


@report.command("plan")
@_spec
@db_option
@_analyst
@format_option("table", "json")
def plan_command(spec: str, database: str, analyst: str, output_format: str) -> None:
    """Price SPEC and split its budget; reads no data, charges nothing. Exits with status 1
    when the batch does not fit what remains, naming the shortfall."""
    from dpsql.engine.report import plan_report
    from dpsql.engine.report_spec import load_report_spec
    from dpsql.engine.session import connect

    with connect(database, analyst=analyst) as session:
        planned = plan_report(session, load_report_spec(spec))
    print_plan(planned, output_format)
    planned.check_fits()


@report.command("run")
@_spec
@db_option
@_analyst
@click.option("--out", required=True, type=click.Path(file_okay=False), help="A new directory.")
def run_command(spec: str, database: str, analyst: str, out: str) -> None:
    """Charge SPEC in one ledger entry (all or nothing), run it, and write report.html,
    results.json and one file per query into OUT."""
    from dpsql.engine.report import run_report
    from dpsql.engine.report_spec import load_report_spec
    from dpsql.engine.session import connect

    with connect(database, analyst=analyst) as session:
        done = run_report(session, load_report_spec(spec), out)
    total = done.plan.total
    console().print(
        f"report written to {done.out}/report.html: {len(done.results)} queries, "
        f"epsilon={total.epsilon:.10g}, delta={total.delta:.10g}, "
        f"ledger entry {done.ledger_entry['seq']} ({done.ledger_entry['hash']})"
    )
    seq = done.ledger_entry["seq"]
    console().print(
        f"answers stored under ledger entry {seq}, fetched again for free with "
        f"`dpsql result {seq} --query NAME` (or GET /v1/results/{seq}?query=NAME): "
        + ", ".join(done.results)
    )
