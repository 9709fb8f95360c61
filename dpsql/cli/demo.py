"""``dpsql demo``: build a generated database, set its policy, run a few queries (and serve it)."""

from __future__ import annotations

from pathlib import Path

import click

from dpsql.cli.output import console, print_budget, print_result
from dpsql.errors import DpsqlError

__all__ = ["demo"]


@click.command()
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
    from dpsql.cli.serve import serve_demo
    from dpsql.engine import demo as demo_data
    from dpsql.engine.session import connect, ledger_path, set_policy

    database = Path(directory) / "demo.duckdb"
    ledger_path(database).unlink(missing_ok=True)
    for suffix in ("-wal", "-shm"):
        Path(f"{ledger_path(database)}{suffix}").unlink(missing_ok=True)
    demo_data.build_demo(database, rows=rows)
    policy_file = Path(directory) / "policy.toml"
    policy_file.write_text(demo_data.DEMO_POLICY, encoding="utf-8")
    set_policy(database, policy_file)
    console().print(f"Built {database} ({rows} generated rows) with policy {policy_file}.\n")
    with connect(database, analyst="alice") as session:
        for title, sql in demo_data.DEMO_QUERIES:
            console().print(title, style="bold")
            console().print(f"  {sql}")
            print_result(session.execute(sql), "table", max_rows=12)
            console().print()
        refused = "SELECT country, MAX(bytes) FROM requests GROUP BY country"
        console().print("A query dpsql refuses (no charge)", style="bold")
        console().print(f"  {refused}")
        try:
            session.execute(refused)
        except DpsqlError as error:
            console().print(f"  refused: {error}\n")
        print_budget(session.budget(), "table")
    console().print(
        f"Try: dpsql query --db {database} --analyst alice "
        '"SELECT country, COUNT(*) FROM requests GROUP BY country"'
    )
    if then_serve:
        serve_demo(str(database))
