"""Command-line commands for published releases: ``dpsql publish-rr`` and ``dpsql rr ...``.

Thin over :mod:`dpsql.engine.publishing`. ``register(cli)`` adds them to the ``dpsql`` group; the
group's ``main`` turns dpsql errors into one line on stderr (exit status 1).
"""

from __future__ import annotations

import json
from typing import Any

import click

from dpsql.cli_output import console, db_option, print_csv, print_table
from dpsql.cli_progress import progress_display, progress_option
from dpsql.engine.publishing import (
    PublishedRelease,
    list_releases,
    publish_rr,
    release_common_items,
    release_decode,
    release_popularity,
)

__all__ = ["publish_rr_command", "register", "rr"]

_analyst_option = click.option(
    "--analyst", required=True, help="Analyst recorded in the ledger (must be in the policy)."
)
_release_option = click.option("--release", "name", required=True, help="Name of the release.")


def _format(*choices: str) -> Any:
    return click.option(
        "--format",
        "output_format",
        type=click.Choice(list(choices)),
        default="table",
        show_default=True,
    )


def _print_release(release: PublishedRelease, output_format: str) -> None:
    data = release.to_dict()
    if output_format == "json":
        click.echo(json.dumps(data))
        return
    data["universe"] = ", ".join(f"{k}={v}" for k, v in data["universe"].items())
    print_table(f"Release {release.name}", ["field", "value"], [[k, v] for k, v in data.items()])


@click.command("publish-rr")
@db_option
@_analyst_option
@click.option("--table", required=True, help="Table of the policy holding (unit, item) rows.")
@click.option("--unit", required=True, help="Privacy unit column (as in the policy).")
@click.option("--item", required=True, help="Item column (public_keys or integer bounds).")
@click.option(
    "--epsilon", type=float, required=True, help="Person-level epsilon charged (replace one set)."
)
@click.option("--out", "name", required=True, help="Name of the new release.")
@click.option(
    "--max-items",
    type=click.IntRange(min=1),
    default=None,
    help="Public cap D on items per person (default: the table's max_rows_per_unit).",
)
@click.option(
    "--chunks", type=click.IntRange(min=1), default=None, help="Public number of PPR chunks."
)
@click.option("--alpha", type=float, default=2.0, show_default=True, help="PPR parameter > 1.")
@_format("table", "json")
@progress_option
def publish_rr_command(
    database: str,
    analyst: str,
    table: str,
    unit: str,
    item: str,
    epsilon: float,
    name: str,
    max_items: int | None,
    chunks: int | None,
    alpha: float,
    output_format: str,
    show_progress: bool | None,
) -> None:
    """Publish every person's item set under local DP (compressed randomized response).

    Charges EPSILON per person before anything is read; the release (public parameters and one
    message per person) is stored in the database as dpsql_rr_<name>.
    """
    with progress_display(show_progress) as display:
        release = publish_rr(
            database,
            analyst=analyst,
            table=table,
            unit=unit,
            item=item,
            epsilon=epsilon,
            name=name,
            chunks=chunks,
            alpha=alpha,
            max_items=max_items,
            progress=display,
        )
    _print_release(release, output_format)


@click.group("rr")
def rr() -> None:
    """Query stored compressed-RR releases (post-processing: free, recorded in the ledger)."""


@rr.command("list")
@db_option
@_format("table", "json")
def rr_list(database: str, output_format: str) -> None:
    """List the stored releases and their public parameters."""
    releases = [release.to_dict() for release in list_releases(database)]
    if output_format == "json":
        click.echo(json.dumps(releases))
        return
    columns = ["name", "table", "persons", "epsilon", "epsilon_per_item", "max_items", "chunks"]
    columns += ["bits_per_person", "ledger_entry", "created"]
    print_table("Releases", columns, [[r[c] for c in columns] for r in releases])


@rr.command("popularity")
@db_option
@_analyst_option
@_release_option
@click.option("--top", "top_k", type=click.IntRange(min=1), default=None, help="Only the top K.")
@click.option("--confidence", type=float, default=None, help="Interval level (policy default).")
@_format("table", "json", "csv")
def rr_popularity(
    database: str,
    analyst: str,
    name: str,
    top_k: int | None,
    confidence: float | None,
    output_format: str,
) -> None:
    """Unbiased number of persons holding each item, with intervals."""
    result = release_popularity(
        database, analyst=analyst, name=name, top_k=top_k, confidence=confidence
    )
    if output_format == "json":
        click.echo(json.dumps(result.to_dict()))
        return
    columns = ["item", "estimate", "estimate_low", "estimate_high"]
    rows = [
        [i, float(e), float(lo), float(hi)]
        for i, e, lo, hi in zip(
            result.items, result.estimate, result.lower, result.upper, strict=True
        )
    ]
    if output_format == "csv":
        print_csv(columns, rows)
        return
    print_table(f"Item popularity in release {result.release}", columns, rows)
    console.print(
        f"{result.persons} persons; standard error {result.std_error:.4g}; intervals are "
        f"{result.confidence:.0%} confidence per item; free (post-processing), ledger entry "
        f"{result.ledger_entry}"
    )


@rr.command("common")
@db_option
@_analyst_option
@_release_option
@click.argument("person_a")
@click.argument("person_b")
@_format("table", "json")
def rr_common(
    database: str, analyst: str, name: str, person_a: str, person_b: str, output_format: str
) -> None:
    """Unbiased estimate of how many items PERSON_A and PERSON_B have in common."""
    (result,) = release_common_items(
        database, analyst=analyst, name=name, pairs=[(person_a, person_b)]
    )
    if output_format == "json":
        click.echo(json.dumps(result.to_dict()))
        return
    console.print(
        f"common items of {result.person_a} and {result.person_b}: {result.estimate:.4g} "
        f"(standard error {result.std_error:.4g}); free (post-processing), ledger entry "
        f"{result.ledger_entry}"
    )


@rr.command("decode")
@db_option
@_analyst_option
@_release_option
@click.argument("person")
@_format("table", "json")
def rr_decode(database: str, analyst: str, name: str, person: str, output_format: str) -> None:
    """The noisy item set of PERSON (randomized response of their published items)."""
    (row,) = release_decode(database, analyst=analyst, name=name, persons=[person])
    data = row.to_dict()
    if output_format == "json":
        click.echo(json.dumps(data))
        return
    console.print(
        f"{data['person']}: {data['ones']} of {data['n']} items reported: "
        f"{', '.join(str(i) for i in data['items'])}"
    )
    console.print(f"free (post-processing), ledger entry {data['ledger_entry']}")


def register(cli: click.Group) -> None:
    """Add ``publish-rr`` and the ``rr`` group to the ``dpsql`` command group."""
    cli.add_command(publish_rr_command)
    cli.add_command(rr)
