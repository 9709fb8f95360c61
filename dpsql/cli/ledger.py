"""Commands over the privacy ledger: ``dpsql policy set|show``, ``budget``, ``synopses`` and
``ledger [verify|head|backup]`` (administrators and auditors; analysts see their own share).
"""

from __future__ import annotations

from pathlib import Path

import click

from dpsql.cli.options import db_option, format_option
from dpsql.cli.output import print_budget, print_ledger, print_synopses
from dpsql.errors import LedgerError

__all__ = ["budget", "ledger", "policy", "synopses"]


@click.group()
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
    from dpsql.engine.session import ledger_path, set_policy

    entry = set_policy(database, Path(policy_file))
    click.echo(f"policy recorded as ledger entry {entry.seq} in {ledger_path(database)}")


@policy.command("show")
@db_option
def policy_show(database: str) -> None:
    """Print the policy in force as JSON."""
    from dpsql.engine.session import show_policy

    click.echo(show_policy(database).model_dump_json(indent=2))


@click.command()
@db_option
@click.option("--analyst", default=None, help="Only the synopses this analyst may use.")
@format_option("table", "json", "csv")
def synopses(database: str, analyst: str | None, output_format: str) -> None:
    """List stored synopses (released structures that answer point queries for free)."""
    from dpsql.engine.session import database_synopses

    print_synopses(database_synopses(database, analyst), output_format)


@click.command()
@db_option
@click.option("--analyst", default=None, help="Only this analyst (and the dataset).")
@format_option("table", "json", "csv")
def budget(database: str, analyst: str | None, output_format: str) -> None:
    """Show cap, spent and remaining budget."""
    from dpsql.engine.session import database_budget

    print_budget(database_budget(database, analyst), output_format)


@click.group(invoke_without_command=True)
@click.option("--db", "database", type=click.Path(dir_okay=False), help="DuckDB database file.")
@click.option(
    "--analyst",
    default=None,
    help="Only this analyst's own entries (what the analyst is shown); without it, every entry "
    "(the administrator's and auditor's view).",
)
@format_option("table", "json", "csv")
@click.pass_context
def ledger(
    context: click.Context, database: str | None, analyst: str | None, output_format: str
) -> None:
    """List ledger entries (verified first); `ledger verify` checks the chain, `ledger head`
    prints the newest hash. `--db` may come before or after the subcommand."""
    context.obj = {"database": database}
    if context.invoked_subcommand is not None:
        return
    from dpsql.engine.session import database_ledger

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
    "--file",
    "ledger_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="A ledger file (e.g. from `dpsql ledger backup`) instead of --db's; read, never changed.",
)
@click.option(
    "--expect",
    default=None,
    help="A hash recorded earlier (`dpsql ledger head`): fail unless it is still in the chain, "
    "which detects deleted newest entries.",
)
@click.option(
    "--head",
    default=None,
    help="The hash the newest entry must have (e.g. the head printed when a backup was taken).",
)
@click.pass_context
def ledger_verify(
    context: click.Context,
    database: str | None,
    ledger_file: str | None,
    expect: str | None,
    head: str | None,
) -> None:
    """Verify the hash chain and every entry's total; name the first bad entry."""
    from dpsql.accountant.ledger import Ledger
    from dpsql.engine.session import database_ledger, ledger_path

    if ledger_file is not None:
        if database is not None or (context.obj or {}).get("database") is not None:
            raise click.UsageError("give either --file or --db, not both")
        path = Path(ledger_file)
        store = Ledger(path, dataset=path.stem, read_only=True)
        try:
            entries = [e.to_dict() for e in store.entries()]
        finally:
            store.close()
    else:
        database = _ledger_database(context, database)
        path = ledger_path(database)
        entries = database_ledger(database)
    if expect is not None:
        found = next((e for e in entries if e["hash"] == expect.strip().lower()), None)
        if found is None:
            raise LedgerError(
                f"hash {expect!r} is not in the ledger {str(path)!r}: entries "
                "recorded after it was taken were deleted, or the ledger was replaced"
            )
        newer = len(entries) - entries.index(found) - 1
        click.echo(f"the expected hash is entry {found['seq']}; {newer} entries were added since")
    if head is not None:
        newest = entries[-1]["hash"] if entries else None
        if newest != head.strip().lower():
            shown = "no entry" if newest is None else f"entry {entries[-1]['seq']} is {newest}"
            raise LedgerError(f"the ledger {str(path)!r} does not end at {head!r}: its {shown}")
    click.echo(f"ledger {path} verified: {len(entries)} entries, chain intact")


@ledger.command("backup")
@_ledger_db
@click.option(
    "--out",
    "target",
    required=True,
    type=click.Path(dir_okay=False),
    help="The backup file to write (must not exist).",
)
@click.pass_context
def ledger_backup(context: click.Context, database: str | None, target: str) -> None:
    """Copy the ledger consistently with SQLite's online backup API (safe while serving; a
    `cp` can miss entries still in the write-ahead log), then verify the copy."""
    from dpsql.accountant.ledger import Ledger, backup
    from dpsql.engine.session import ledger_path

    source = ledger_path(_ledger_database(context, database))
    backup(source, target)
    copy = Ledger(target, dataset=Path(target).stem, read_only=True)
    try:
        entries = copy.entries()
    finally:
        copy.close()
    newest = entries[-1].hash if entries else "none"
    click.echo(f"backed up {source} to {target}: {len(entries)} entries, chain intact")
    click.echo(f"head {newest} (check later: dpsql ledger verify --file {target} --head HASH)")


@ledger.command("head")
@_ledger_db
@click.pass_context
def ledger_head(context: click.Context, database: str | None) -> None:
    """Print the newest entry's hash (keep a copy; `verify --expect` checks it later)."""
    from dpsql.engine.session import database_ledger

    entries = database_ledger(_ledger_database(context, database))
    if not entries:
        raise LedgerError("the ledger has no entries")
    click.echo(entries[-1]["hash"])
