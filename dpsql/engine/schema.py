"""What an analyst may know before querying: the policy's tables, their columns and rules.

``describe_schema`` joins the policy in force with the database's catalog as the analyst sees
it (``dpsql.engine.query.visible_catalog``: the policy's tables and public tables, nothing
else). Everything in it is public under the threat model (the policy is public to analysts, the
column types of the tables they may name are what a refusal would tell them); no row is read.
Where a table's files live (``source``) and other analysts' allocations are left out: neither
helps an analyst write a query.
"""

from __future__ import annotations

import re
from typing import Any

from dpsql.engine.backends import Backend
from dpsql.engine.policy import ColumnPolicy, Policy
from dpsql.engine.query import visible_catalog
from dpsql.engine.results import BudgetReport

__all__ = ["describe_schema", "example_query", "identifier"]


def _column(name: str, type_name: str, rules: ColumnPolicy | None) -> dict[str, Any]:
    rules = rules or ColumnPolicy()
    return {
        "name": name,
        "type": type_name,
        "bounds": list(rules.bounds) if rules.bounds is not None else None,
        "public_keys": list(rules.public_keys) if rules.public_keys is not None else None,
        "key_domain": list(rules.key_domain)
        if isinstance(rules.key_domain, tuple)
        else rules.key_domain,
        "auto_bounds": rules.auto_bounds,
    }


def describe_schema(
    policy: Policy,
    backend: Backend,
    *,
    dataset: str,
    budget: BudgetReport,
) -> dict[str, Any]:
    """The schema an analyst may query, as JSON-ready data.

    Args:
        policy: the policy in force.
        backend: the database; only the tables the policy names are read from its catalog.
        dataset: the dataset's name (its budget line's).
        budget: the caller's budget lines (what ``budget()`` shows them).

    """
    catalog = visible_catalog(backend, policy)
    visible = {name.lower(): (name, columns) for name, columns in catalog.items()}
    tables = []
    for key, rules in policy.tables.items():
        name, columns = visible.get(key.lower(), (key, {}))
        by_name = {column.lower(): column_rules for column, column_rules in rules.columns.items()}
        tables.append(
            {
                "name": name,
                "privacy_unit": rules.privacy_unit,
                "max_groups_per_unit": rules.max_groups_per_unit,
                "max_rows_per_group": rules.max_rows_per_group,
                "max_rows_per_unit": rules.max_rows_per_unit,
                "partition_column": rules.partition_column,
                "columns": [
                    _column(column, type_name, by_name.get(column.lower()))
                    for column, type_name in columns.items()
                ],
            }
        )
    public_tables = []
    for key, rules in policy.public_tables.items():
        name, columns = visible.get(key.lower(), (key, {}))
        public_tables.append(
            {
                "name": name,
                "description": rules.description,
                "columns": [{"name": c, "type": t} for c, t in columns.items()],
            }
        )
    settings = policy.dataset
    return {
        "dataset": {
            "name": dataset,
            "default_query_epsilon": settings.default_query_epsilon,
            "default_query_delta": settings.default_query_delta,
            "confidence": settings.confidence,
            "composition": settings.composition,
            "period": settings.period,
            "share_synopses": settings.share_synopses,
        },
        "tables": tables,
        "public_tables": public_tables,
        "budget": [line.model_dump() for line in budget.lines],
        "example_query": example_query(tables),
    }


_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def identifier(name: str) -> str:
    """``name`` as SQL spells it: double-quoted unless it is a plain identifier.

    >>> identifier("country"), identifier("unit id")
    ('country', '"unit id"')
    """
    if _PLAIN.fullmatch(name):
        return name
    return '"' + name.replace('"', '""') + '"'


def example_query(tables: list[dict[str, Any]]) -> str | None:
    """A first query over the first policy table: counts per its first column with public keys,
    else one count (None without a table).

    >>> example_query([{"name": "t", "columns": [
    ...     {"name": "uid", "public_keys": None}, {"name": "c", "public_keys": ["a"]}]}])
    'SELECT c, COUNT(*) AS n FROM t GROUP BY c'
    """
    if not tables:
        return None
    table = identifier(tables[0]["name"])
    keyed = next((c["name"] for c in tables[0]["columns"] if c.get("public_keys")), None)
    if keyed is None:
        return f"SELECT COUNT(*) AS n FROM {table}"
    key = identifier(keyed)
    return f"SELECT {key}, COUNT(*) AS n FROM {table} GROUP BY {key}"
