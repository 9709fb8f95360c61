"""Command-line commands for reports: ``dpsql report plan`` and ``dpsql report run``.

Thin over :mod:`dpsql.engine.report`. ``register(cli)`` adds the ``report`` group to ``dpsql``.
"""

from __future__ import annotations

import json

import click

from dpsql.cli_output import console, db_option, print_table
from dpsql.engine.report import ReportPlan, plan_report, run_report
from dpsql.engine.report_spec import load_report_spec
from dpsql.engine.session import connect

__all__ = ["register", "report"]

_spec = click.argument("spec", type=click.Path(dir_okay=False))
_analyst = click.option("--analyst", required=True, help="Analyst whose allocation is charged.")


@click.group()
def report() -> None:
    """Price, charge and publish a batch of queries as one audited report."""


@report.command("plan")
@_spec
@db_option
@_analyst
@click.option(
    "--format", "output_format", type=click.Choice(["table", "json"]), default="table",
    show_default=True,
)
def plan_command(spec: str, database: str, analyst: str, output_format: str) -> None:
    """Price SPEC and split its budget; reads no data, charges nothing. Exits with status 1
    when the batch does not fit what remains, naming the shortfall."""
    with connect(database, analyst=analyst) as session:
        planned = plan_report(session, load_report_spec(spec))
    if output_format == "json":
        click.echo(json.dumps(planned.to_dict(), indent=2, allow_nan=False))
    else:
        print_plan(planned)
    planned.check_fits()


def print_plan(planned: ReportPlan) -> None:
    data = planned.to_dict()
    rows = [
        [
            q["name"],
            f"{q['epsilon']:.10g}",
            f"{q['delta']:.10g}",
            "; ".join(
                f"{c} ±{e:.6g}" if e is not None else f"{c}: depends on the data"
                for c, e in q["expected_error"].items()
            ),
            "-" if q["accuracy_target"] is None else f"±{q['accuracy_target']:g}",
            q["mechanism"],
        ]
        for q in data["queries"]
    ]
    print_table(
        f"{data['title']}: allocation {data['allocation']}",
        ["query", "epsilon", "delta", f"expected error ({data['confidence']:.0%})", "target",
         "mechanism"],
        rows,
    )
    console.print(f"rule: {data['allocation_rule']}")
    total = data["total"]
    console.print(
        f"total: epsilon={total['epsilon']:.10g} ({total['epsilon_units']} units of 1e-9), "
        f"delta={total['delta']:.10g}"
    )
    for line in data["draws_on"]:
        console.print(
            f"{line['scope']} {line['name']}: epsilon={line['epsilon_remaining']:.10g}, "
            f"delta={line['delta_remaining']:.10g} remaining"
            + (f" in budget period {line['period']}" if line.get("period") else "")
        )
    console.print("fits: yes" if data["fits"] else "fits: NO")


@report.command("run")
@_spec
@db_option
@_analyst
@click.option("--out", required=True, type=click.Path(file_okay=False), help="A new directory.")
def run_command(spec: str, database: str, analyst: str, out: str) -> None:
    """Charge SPEC in one ledger entry (all or nothing), run it, and write report.html,
    results.json and one file per query into OUT."""
    with connect(database, analyst=analyst) as session:
        done = run_report(session, load_report_spec(spec), out)
    total = done.plan.total
    console.print(
        f"report written to {done.out}/report.html: {len(done.results)} queries, "
        f"epsilon={total.epsilon:.10g}, delta={total.delta:.10g}, "
        f"ledger entry {done.ledger_entry['seq']} ({done.ledger_entry['hash']})"
    )


def register(cli: click.Group) -> None:
    """Add the ``report`` group to the ``dpsql`` command group."""
    cli.add_command(report)
