"""Calendar bounds and key domains, decided by the database (``dpsql.sql.calendar``).

A DATE or TIMESTAMP column's policy bounds (``bounds = ["2025-01-01", "2025-12-31"]``) are
converted by the database when the policy is set and when a query is bound: a bound that is not
exactly a value of the column's type, or a low bound after the high one, is refused with a
``PolicyError``. A calendar GROUP BY key's domain is the database's own evaluation of the key
over the bounded range (``candidates_sql``), refused when it has more than
``dpsql.sql.expressions.MAX_BINS`` keys. Nothing here reads a row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from sqlglot import exp

from dpsql.errors import PolicyError
from dpsql.sql import calendar
from dpsql.sql.analyze import temporal_pattern
from dpsql.sql.expressions import MAX_BINS
from dpsql.sql.shape import ColumnKind

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["bounds_sql", "calendar_bounds", "calendar_domain"]


class Converter(Protocol):
    """What is needed of a ``dpsql.engine.literals.Binder``."""

    def convert(self, literals: list[exp.Cast], what: str) -> list[exp.Cast]: ...

    def run(self, sql: str) -> pd.DataFrame: ...


def bounds_sql(bounds: tuple[str, str], type_name: str) -> tuple[str, str]:
    """The bounds as typed literals of the column's type (DuckDB SQL)."""
    target = exp.DataType.build(type_name, dialect="duckdb")
    return tuple(  # type: ignore[return-value]
        exp.Cast(this=exp.Literal.string(b), to=target.copy()).sql(dialect="duckdb")
        for b in bounds
    )


def calendar_bounds(
    binder: Converter, table: str, column: str, type_name: str, bounds: tuple[str, str]
) -> tuple[str, str]:
    """``bounds`` of ``table.column`` as the database spells them in the column's type;
    ``PolicyError`` unless the column is a DATE or TIMESTAMP (without time zone), each bound
    is an ISO literal of that type the database converts exactly, and low <= high."""
    where = f"bounds of {table}.{column}"
    temporal = ColumnKind.of(type_name) in (ColumnKind.DATE, ColumnKind.TIMESTAMP)
    if not temporal or calendar.zoned(type_name):
        raise PolicyError(
            f"{where}: dates or timestamps as bounds need a DATE or TIMESTAMP column (without "
            f"time zone); it is {type_name}"
        )
    for text in bounds:
        if not temporal_pattern(type_name).fullmatch(text):
            raise PolicyError(
                f"{where}: {text!r} is not a {type_name} literal; write YYYY-MM-DD or "
                "YYYY-MM-DD HH:MM[:SS[.fraction]]"
            )
    target = exp.DataType.build(type_name, dialect="duckdb")
    low, high = binder.convert(
        [exp.Cast(this=exp.Literal.string(b), to=target.copy()) for b in bounds],
        f"bound of {table}.{column}",
    )
    ordered, dated = binder.run(
        f"SELECT {low.sql(dialect='duckdb')} <= {high.sql(dialect='duckdb')}, "
        f"YEAR({low.sql(dialect='duckdb')}) >= 1"
    ).iloc[0]
    if not ordered:
        raise PolicyError(f"{where}: low {bounds[0]!r} is after high {bounds[1]!r}")
    if not dated:
        raise PolicyError(f"{where}: {bounds[0]!r} is before the year 1")
    return low.this.this, high.this.this


def calendar_domain(
    binder: Converter, key: calendar.CalendarKey, bounds: tuple[str, str], type_name: str
) -> tuple[int | str, ...]:
    """The keys of ``key`` over the bounded range, as the database computes them in order:
    integers for a part, the database's text of each DATE or TIMESTAMP for a truncation."""
    low, high = bounds_sql(bounds, type_name)
    what = f"GROUP BY {key.text}"
    try:
        periods = int(binder.run(calendar.periods_sql(key, low, high)).iloc[0, 0])
    except Exception:  # the bounds are policy literals, not data
        raise PolicyError(f"{what}: the database cannot count the periods of {bounds}") from None
    if key.truncate or key.part == "year":
        if periods > MAX_BINS:
            raise PolicyError(
                f"{what} over the bounds {list(bounds)} gives {periods} groups (at most "
                f"{MAX_BINS}); use a coarser unit or narrower bounds"
            )
        count = periods
    else:
        count = min(periods, calendar.CYCLES[key.part])
    frame = binder.run(calendar.candidates_sql(key, low, high, type_name, count))
    if key.truncate:
        return tuple(str(v) for v in frame["__key"])
    return tuple(int(v) for v in frame["__value"])
