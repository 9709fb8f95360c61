"""Every printer of the command line: tables on stdout through one ``rich`` console, CSV, JSON.

A printer takes what the engine returned and an output format (``table``, ``json`` or ``csv``)
and writes it; commands decide nothing about layout. rich loads when the console is first used
(``console()``), so that ``--help`` and JSON or CSV output start without it.
"""

from __future__ import annotations

import functools
import json
import math
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from rich.console import Console

    from dpsql.engine.publishing import (
        CommonItemsResult,
        DecodedRow,
        PopularityResult,
        PublishedRelease,
    )
    from dpsql.engine.report import ReportPlan
    from dpsql.engine.results import BudgetReport, QueryResult

__all__ = [
    "console",
    "print_budget",
    "print_common_items",
    "print_csv",
    "print_decoded",
    "print_ledger",
    "print_listing",
    "print_plan",
    "print_popularity",
    "print_release",
    "print_releases",
    "print_result",
    "print_schema",
    "print_stream",
    "print_synopses",
    "print_table",
    "print_tokens",
]

@functools.cache
def console() -> Console:
    """The console on stdout that tables and messages are printed to, made on first use."""
    from rich.console import Console

    made = Console(highlight=False, markup=False, soft_wrap=True)
    if not made.is_terminal or made.width < 160:
        made.width = 160
    return made


def _number(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e6 else f"{value:.0f}"
    return str(value)


def _step(low: Any, high: Any) -> float | None:
    """The rounding step a value with interval ``[low, high]`` deserves: a tenth of the power
    of ten at or below its half-width (two significant digits of the error)."""
    numbers = (int, float)
    if not (isinstance(low, numbers) and isinstance(high, numbers)) or not high > low:
        return None
    half = (high - low) / 2
    if not math.isfinite(half):
        return None
    return 10.0 ** (math.floor(math.log10(half)) - 1)


def _shown(columns: list[str], row: list[Any], result: QueryResult) -> list[Any]:
    """A row of ``interval_table`` for display: each float with an interval rounded to the
    precision its noise allows (the ends outwards); the result itself keeps every digit."""
    shown = list(row)
    for name in result.intervals:
        if name not in columns:
            continue
        at = columns.index(name)
        step = _step(row[at + 1], row[at + 2])
        if step is None or not isinstance(row[at], float):
            continue
        digits = max(0, -round(math.log10(step)))
        shown[at] = round(round(row[at] / step) * step, digits)
        shown[at + 1] = round(math.floor(row[at + 1] / step) * step, digits)
        shown[at + 2] = round(math.ceil(row[at + 2] / step) * step, digits)
    return shown


def print_table(title: str | None, columns: list[str], rows: list[list[Any]]) -> None:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(_number(v) for v in row))
    console().print(table)


def print_csv(columns: list[str], rows: list[list[Any]]) -> None:
    from dpsql.engine.results import csv_text

    click.echo(csv_text(columns, rows), nl=False)


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


# Queries, budgets and the ledger. ------------------------------------------------------------
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
    print_table(title, columns, [_shown(columns, row, result) for row in rows[:max_rows]])
    if max_rows is not None and len(rows) > max_rows:
        console().print(f"... {len(rows)} rows in all (first {max_rows} shown)")
    for warning in result.details.get("warnings", []):
        console().print(f"warning: {warning}")
    for name, measured in result.measures.items():
        console().print(f"{name} measures: {measured}")
    console().print(
        f"spent epsilon={result.epsilon:g} delta={result.delta:g} "
        f"({result.mechanism}); intervals are {result.confidence:.0%} confidence; "
        f"ledger entry {result.ledger_entry}"
    )


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


def print_schema(schema: dict[str, Any], output_format: str) -> None:
    """The tables an analyst may query: one table of columns and rules per policy table, the
    public tables, the query defaults and the caller's budget."""
    if output_format == "json":
        click.echo(json.dumps(schema))
        return
    dataset = schema["dataset"]
    default = dataset["default_query_epsilon"]
    console().print(
        f"dataset {dataset['name']}: default epsilon "
        f"{'none (give one per query)' if default is None else _number(default)}, "
        f"default delta {_number(dataset['default_query_delta'])}, "
        f"{_number(dataset['confidence'] * 100)}% intervals"
    )
    for table in schema["tables"]:
        partition = table["partition_column"]
        title = (
            f"{table['name']}: privacy unit {table['privacy_unit']}; per unit at most "
            f"{table['max_groups_per_unit']} groups, {table['max_rows_per_group']} rows per "
            f"group, {table['max_rows_per_unit']} rows"
            + (f"; partitioned by {partition}" if partition else "")
        )
        rows = [
            [
                c["name"],
                c["type"],
                "-"
                if c["bounds"] is None
                else f"[{_number(c['bounds'][0])}, {_number(c['bounds'][1])}]",
                "-" if c["public_keys"] is None else ", ".join(map(str, c["public_keys"])),
                "-" if c["key_domain"] is None else json.dumps(c["key_domain"]),
                c["auto_bounds"] or "-",
            ]
            for c in table["columns"]
        ]
        columns = ["column", "type", "bounds", "public_keys", "key_domain", "auto_bounds"]
        print_table(title, columns, rows)
    for table in schema["public_tables"]:
        title = f"{table['name']} (public)" + (
            f": {table['description']}" if table["description"] else ""
        )
        print_table(title, ["column", "type"], [[c["name"], c["type"]] for c in table["columns"]])
    for line in schema["budget"]:
        console().print(
            f"{line['scope']} {line['name']}: epsilon {_number(line['epsilon_remaining'])} of "
            f"{_number(line['epsilon_cap'])} remaining, delta {_number(line['delta_remaining'])}"
        )


def print_ledger(entries: list[dict[str, Any]], output_format: str) -> None:
    from dpsql.engine.results import LEDGER_COLUMNS

    rows = [[e.get(c) for c in LEDGER_COLUMNS] for e in entries]
    print_listing(entries, "Ledger", LEDGER_COLUMNS, rows, output_format)


def print_stream(opened: dict[str, Any], output_format: str) -> None:
    """A stream just opened: its fields, and which queries it now answers."""
    if output_format == "json":
        click.echo(json.dumps(opened))
        return
    rows = [[k, json.dumps(v) if isinstance(v, list | dict) else v] for k, v in opened.items()]
    print_table(f"Stream {opened['name']}", ["field", "value"], rows)
    console().print(
        f"charged epsilon={opened['epsilon']:g} delta={opened['delta']:g} once; COUNT(*) "
        f"queries whose WHERE is {' AND '.join([*opened['filters'], '']) or ''}conditions on "
        f"{opened['key_column']} only are now answered from it"
    )
    stated = opened.get("stated_error") or {}
    if "stated" in stated:
        console().print(
            f"it will state errors of about ±{stated['stated']:.4g} "
            f"({stated['confidence']:.0%} intervals; see stated_error)"
        )
    for warning in stated.get("warnings", []):
        console().print(f"warning: {warning}")


# Reports. ------------------------------------------------------------------------------------
def print_plan(planned: ReportPlan, output_format: str) -> None:
    data = planned.to_dict()
    if output_format == "json":
        click.echo(json.dumps(data, indent=2, allow_nan=False))
        return
    rows = [
        [
            q["name"],
            f"{q['epsilon']:.10g}",
            f"{q['delta']:.10g}",
            "; ".join(
                (
                    f"{c} ±{e:.6g}"
                    + (f" (±{r:.1%} of expected)" if (r := q["relative_error"].get(c)) else "")
                )
                if e is not None
                else f"{c}: depends on the data"
                for c, e in q["expected_error"].items()
            ),
            ("-" if q["accuracy_target"] is None else f"±{q['accuracy_target']:g}")
            + (
                f" (all {q['simultaneous']['cells']} cells at once)"
                if q.get("simultaneous")
                else ""
            ),
            q["mechanism"],
        ]
        for q in data["queries"]
    ]
    print_table(
        f"{data['title']}: allocation {data['allocation']}",
        [
            "query",
            "epsilon",
            "delta",
            f"expected error ({data['confidence']:.0%})",
            "target",
            "mechanism",
        ],
        rows,
    )
    console().print(f"rule: {data['allocation_rule']}")
    if data.get("minimax_driver"):
        driver = data["minimax_driver"]
        relative = driver["relative_error"]
        console().print(
            f"minimax driver: {driver['why']}"
            + ("" if relative is None else f"; every relative error is ±{relative:.1%}")
        )
    total = data["total"]
    console().print(
        f"total: epsilon={total['epsilon']:.10g} ({total['epsilon_units']} units of 1e-9), "
        f"delta={total['delta']:.10g}"
    )
    for line in data["draws_on"]:
        console().print(
            f"{line['scope']} {line['name']}: epsilon={line['epsilon_remaining']:.10g}, "
            f"delta={line['delta_remaining']:.10g} remaining"
            + (f" in budget period {line['period']}" if line.get("period") else "")
        )
    console().print("fits: yes" if data["fits"] else "fits: NO")


# Published (local-DP) releases. --------------------------------------------------------------
def print_release(release: PublishedRelease, output_format: str) -> None:
    data = release.to_dict()
    if output_format == "json":
        click.echo(json.dumps(data))
        return
    data["universe"] = ", ".join(f"{k}={v}" for k, v in data["universe"].items())
    print_table(f"Release {release.name}", ["field", "value"], [[k, v] for k, v in data.items()])


def print_releases(releases: list[dict[str, Any]], output_format: str) -> None:
    if output_format == "json":
        click.echo(json.dumps(releases))
        return
    columns = ["name", "table", "persons", "epsilon", "epsilon_per_item", "max_items", "chunks"]
    columns += ["bits_per_person", "ledger_entry", "created"]
    print_table("Releases", columns, [[r[c] for c in columns] for r in releases])


def print_popularity(result: PopularityResult, output_format: str) -> None:
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
    console().print(
        f"{result.persons} persons; standard error {result.std_error:.4g}; intervals are "
        f"{result.confidence:.0%} confidence per item; estimates are unbiased, unclipped (may "
        f"fall below 0 or above {result.persons}); free (post-processing), ledger entry "
        f"{result.ledger_entry}"
    )


def print_common_items(result: CommonItemsResult, output_format: str) -> None:
    if output_format == "json":
        click.echo(json.dumps(result.to_dict()))
        return
    console().print(
        f"common items of {result.person_a} and {result.person_b}: {result.estimate:.4g} "
        f"(standard error {result.std_error:.4g}; unbiased, unclipped: it may be negative); "
        f"free (post-processing), ledger entry {result.ledger_entry}"
    )


def print_decoded(row: DecodedRow, output_format: str) -> None:
    data = row.to_dict()
    if output_format == "json":
        click.echo(json.dumps(data))
        return
    console().print(
        f"{data['person']}: {data['ones']} of {data['n']} items reported: "
        f"{', '.join(str(i) for i in data['items'])}"
    )
    console().print(f"free (post-processing), ledger entry {data['ledger_entry']}")


# The service's tokens. -----------------------------------------------------------------------
def print_tokens(records: list[dict[str, Any]], output_format: str) -> None:
    columns = ["id", "name", "role", "created", "revoked"]
    rows = [[r[c] for c in columns] for r in records]
    print_listing(records, "Tokens", columns, rows, output_format)
