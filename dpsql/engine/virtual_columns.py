"""Virtual columns priced from the policy: the bounds of an expression inside an aggregate, and
the domain of a GROUP BY bin, as the planner uses them.

The analyzer (``dpsql.sql.expressions``) turns expressions into virtual columns of the table and
the binder has the database enumerate each bin's keys (``dpsql.engine.literals``); here the
policy's declared bounds give each summed expression its interval (interval arithmetic over the
clamped columns: Moore, *Interval Analysis*, 1966) and each virtual column the expression the
database runs.
"""

from __future__ import annotations

import math
from dataclasses import replace

from sqlglot import exp

from dpsql.engine.calendars import bounds_sql
from dpsql.engine.moments import check_bounds
from dpsql.engine.policy import TablePolicy
from dpsql.errors import PolicyError
from dpsql.sql import calendar
from dpsql.sql.expressions import (
    KEY_PREFIX,
    bin_of,
    bin_run,
    bounds_of,
    clamped,
    in_condition,
)
from dpsql.sql.shape import ColumnKind, QueryShape

__all__ = ["with_virtual_bounds"]


def _key(
    name: str, expression: exp.Expression, table: TablePolicy, shape: QueryShape
) -> tuple[exp.Expression, list[object]]:
    """The expression the database runs for a virtual key, and its public domain (for a bin:
    the distinct values the database enumerated when the query was bound, ``shape.domains``)."""
    key = calendar.calendar_of(expression)
    if key is not None:
        bounds = table.column(key.column).calendar_bounds
        domain = shape.domains.get(name)
        if domain is None or bounds is None:
            raise PolicyError(
                f"the keys of GROUP BY {key.text} were not enumerated by the database: bind the "
                "query with a backend first"
            )
        type_name = shape.types[key.column]
        low, high = bounds_sql(bounds, type_name)
        run = exp.maybe_parse(calendar.run(key, low, high, type_name), dialect="duckdb")
        return run, list(domain)
    found = bin_of(expression)
    if found is None:
        return expression, [False, True]
    domain = shape.domains.get(name)
    interval = table.column(found.column).numeric_bounds
    if domain is None or interval is None:
        raise PolicyError(
            f"the keys of GROUP BY {expression.sql(dialect='duckdb')} were not enumerated by the "
            "database: bind the query with a backend first"
        )
    return bin_run(found, interval, shape.columns), list(domain)


def _with_schema_domains(shape: QueryShape, table: TablePolicy) -> TablePolicy:
    """``table`` with the ENUM values the database listed for a group column without declared
    public keys (``dpsql.engine.literals.Binder.enum_domains``) as its public keys."""
    columns = dict(table.columns)
    virtual = getattr(shape, "virtual", None) or {}
    for column in getattr(shape, "group_by", ()):
        domain = (getattr(shape, "domains", None) or {}).get(column)
        rules = table.column(column)
        if domain is not None and column not in virtual and rules.public_keys is None:
            columns[column] = rules.model_copy(update={"public_keys": domain})
    return table.model_copy(update={"columns": columns}) if columns != table.columns else table


def with_virtual_bounds(shape: QueryShape, table: TablePolicy) -> tuple[QueryShape, TablePolicy]:
    """``shape`` whose virtual columns read clamped columns, and ``table`` with their derived
    bounds; a virtual column summed or averaged needs bounds on every numeric column it adds."""
    table = _with_schema_domains(shape, table)
    virtual = getattr(shape, "virtual", None) or {}
    if not virtual:
        return shape, table
    check_bounds(shape, table)  # a two-column moment names its missing bounds itself
    declared = {name: rules.numeric_bounds for name, rules in table.columns.items()}
    summed = {a.column for a in shape.aggregates if a.kind.value in ("sum", "avg")}
    columns = dict(table.columns)
    runs: dict[str, exp.Expression] = {}
    for name, expression in virtual.items():
        if name.startswith(KEY_PREFIX):
            runs[name], domain = _key(name, expression, table, shape)
            columns[name] = table.column(name).model_copy(update={"public_keys": domain})
            continue
        interval = bounds_of(expression, declared, shape.columns)
        if name in summed and interval is None:
            missing = sorted(
                c.name
                for c in expression.find_all(exp.Column)
                if not in_condition(c)
                and shape.columns.get(c.name) is not ColumnKind.BOOLEAN
                and declared.get(c.name) is None
            )
            detail = (
                f"set [tables.{shape.table}.columns.{missing[0]}] bounds = [low, high]"
                if missing
                else "sum numbers or bounded numeric columns"
            )
            raise PolicyError(f"{expression.sql(dialect='duckdb')!r} has no bounds: {detail}")
        if interval is not None and not all(math.isfinite(v) for v in interval):
            if name in summed:
                raise PolicyError(
                    f"the bounds of {expression.meta.get('text', expression.sql())!r} overflow a "
                    "DOUBLE (its declared bounds are too wide for this arithmetic); narrow them"
                )
            interval = None
        if interval is not None:
            columns[name] = table.column(name).model_copy(update={"bounds": interval})
        runs[name] = clamped(expression, declared, shape.columns)
    table = table.model_copy(update={"columns": columns})
    return replace(shape, virtual=runs), table
