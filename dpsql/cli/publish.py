"""Local-DP publishing: ``dpsql publish-rr`` and ``dpsql rr list|popularity|common|decode``.

Thin over :mod:`dpsql.engine.publishing`.
"""

from __future__ import annotations

import click

from dpsql.cli.options import db_option, format_option
from dpsql.cli.output import (
    print_common_items,
    print_decoded,
    print_popularity,
    print_release,
    print_releases,
)
from dpsql.cli.progress import progress_display, progress_option

__all__ = ["publish_rr_command", "rr"]

_analyst_option = click.option(
    "--analyst", required=True, help="Analyst recorded in the ledger (must be in the policy)."
)
_release_option = click.option("--release", "name", required=True, help="Name of the release.")


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
@format_option("table", "json")
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
    from dpsql.engine.publishing import publish_rr

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
    print_release(release, output_format)


@click.group("rr")
def rr() -> None:
    """Query stored compressed-RR releases (post-processing: free, recorded in the ledger)."""


@rr.command("list")
@db_option
@format_option("table", "json")
def rr_list(database: str, output_format: str) -> None:
    """List the stored releases and their public parameters."""
    from dpsql.engine.publishing import list_releases

    print_releases([release.to_dict() for release in list_releases(database)], output_format)


@rr.command("popularity")
@db_option
@_analyst_option
@_release_option
@click.option("--top", "top_k", type=click.IntRange(min=1), default=None, help="Only the top K.")
@click.option("--confidence", type=float, default=None, help="Interval level (policy default).")
@format_option("table", "json", "csv")
def rr_popularity(
    database: str,
    analyst: str,
    name: str,
    top_k: int | None,
    confidence: float | None,
    output_format: str,
) -> None:
    """Unbiased number of persons holding each item, with intervals."""
    from dpsql.engine.publishing import release_popularity

    result = release_popularity(
        database, analyst=analyst, name=name, top_k=top_k, confidence=confidence
    )
    print_popularity(result, output_format)


@rr.command("common")
@db_option
@_analyst_option
@_release_option
@click.argument("person_a")
@click.argument("person_b")
@format_option("table", "json")
def rr_common(
    database: str, analyst: str, name: str, person_a: str, person_b: str, output_format: str
) -> None:
    """Unbiased estimate of how many items PERSON_A and PERSON_B have in common."""
    from dpsql.engine.publishing import release_common_items

    (result,) = release_common_items(
        database, analyst=analyst, name=name, pairs=[(person_a, person_b)]
    )
    print_common_items(result, output_format)


@rr.command("decode")
@db_option
@_analyst_option
@_release_option
@click.argument("person")
@format_option("table", "json")
def rr_decode(database: str, analyst: str, name: str, person: str, output_format: str) -> None:
    """The noisy item set of PERSON (randomized response of their published items)."""
    from dpsql.engine.publishing import release_decode

    (row,) = release_decode(database, analyst=analyst, name=name, persons=[person])
    print_decoded(row, output_format)
