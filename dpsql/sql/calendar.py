"""Calendar keys: ``date_trunc(unit, d)``, ``EXTRACT(part FROM d)`` and ``year(d)``,
``quarter(d)``, ``month(d)``, ``dayofweek(d)``, ``hour(d)`` as GROUP BY keys over a DATE or
TIMESTAMP column with declared bounds (``bounds = ["2025-01-01", "2025-12-31"]``).

Like a numeric bin (``dpsql.sql.expressions``), a calendar key is a virtual key column whose
domain is public: the database enumerates it from the declared bounds before the query is
priced (``dpsql.engine.calendars``), and every row's key is the same expression over the column
*clamped* to its bounds (a value outside them reads as the nearer bound; NULL stays NULL), so
each row's key lies in the enumerated domain by construction.

The domain is the key expression evaluated by the database over candidate instants: the start
of every period of the key's unit (a day for ``dow``, an hour for ``hour``, ...) from the period
holding the lower bound to the one holding the upper bound. The key is constant on each such
period and each period meets the bounded range, so these are exactly the values the rows can
take. A periodic part repeats after one cycle of periods (7 days, 24 hours, 12 months, 4
quarters), so no more candidates than one cycle are read.

Every expression here means the same on DuckDB and Spark (the generated SQL is transpiled): a
date_trunc of a DATE is cast back to a DATE (both engines truncate to a timestamp), EXTRACT
results are BIGINT, and the day of the week (DuckDB's ``dayofweek``: Sunday 0 to Saturday 6;
Spark's counts Sunday as 1) is computed from the days since a Sunday.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

__all__ = [
    "CYCLES",
    "TRUNC_UNITS",
    "CalendarKey",
    "calendar_of",
    "candidates_sql",
    "emitted",
    "key_type",
    "periods_sql",
    "run",
    "zoned",
]

TRUNC_UNITS = ("year", "quarter", "month", "week", "day")
"""The units of ``date_trunc`` keys."""

PARTS = ("year", "quarter", "month", "dow", "hour")
"""The parts of ``EXTRACT`` keys."""

CYCLES = {"quarter": 4, "month": 12, "dow": 7, "hour": 24}
"""Periods after which a periodic part repeats: one cycle holds all its values."""

_FUNCTIONS: dict[type[exp.Expression], str] = {
    exp.Year: "year",
    exp.Quarter: "quarter",
    exp.Month: "month",
    exp.DayOfWeek: "dow",
    exp.Hour: "hour",
}
_EXTRACT_NAMES = {"DOW": "dow", "DAYOFWEEK": "dow", "WEEKDAY": "dow"}
_UNIT = {"year": "year", "quarter": "quarter", "month": "month", "dow": "day", "hour": "hour"}
"""The period on which each part is constant."""
_STEP = {
    "year": "INTERVAL 1 YEAR",
    "quarter": "INTERVAL 3 MONTH",
    "month": "INTERVAL 1 MONTH",
    "week": "INTERVAL 7 DAY",
    "day": "INTERVAL 1 DAY",
    "hour": "INTERVAL 1 HOUR",
}
_SUNDAY = "CAST('1970-01-04' AS DATE)"


@dataclass(frozen=True)
class CalendarKey:
    """``date_trunc(part, column)`` (``truncate``) or ``EXTRACT(part FROM column)``."""

    column: str
    part: str
    truncate: bool

    @property
    def unit(self) -> str:
        """The period on which the key is constant."""
        return self.part if self.truncate else _UNIT[self.part]

    @property
    def text(self) -> str:
        """The key as an analyst reads it."""
        if self.truncate:
            return f"date_trunc('{self.part}', {self.column})"
        return f"EXTRACT({self.part} FROM {self.column})"


def zoned(type_name: str) -> bool:
    """Whether ``type_name`` is a TIMESTAMP WITH TIME ZONE (its calendar depends on the
    session's time zone)."""
    name = type_name.upper()
    return "TIME ZONE" in name or name == "TIMESTAMPTZ"


def _name(node: exp.Expression) -> str:
    return (node.name if isinstance(node, exp.Var | exp.Literal | exp.Column) else "").upper()


def calendar_of(node: exp.Expression) -> CalendarKey | None:
    """``node`` as a calendar key over a column (None for any other shape, or a unit or part
    not in ``TRUNC_UNITS``/``PARTS``). A cast of a ``date_trunc`` to DATE or TIMESTAMP is the
    same key (the form ``emitted`` writes)."""
    if isinstance(node, exp.Cast) and node.to.is_type(
        exp.DataType.Type.DATE, *exp.DataType.TEMPORAL_TYPES
    ):
        node = node.this
    if isinstance(node, exp.TimestampTrunc | exp.DateTrunc):
        unit = node.args.get("unit")
        part = _name(unit).lower() if unit is not None else ""
        column = node.this
        if part in TRUNC_UNITS and isinstance(column, exp.Column):
            return CalendarKey(column.name, part, truncate=True)
        return None
    if isinstance(node, exp.Extract):
        part = _name(node.this)
        part = _EXTRACT_NAMES.get(part, part.lower())
        column = node.expression
    elif type(node) in _FUNCTIONS:
        part, column = _FUNCTIONS[type(node)], node.this
    else:
        return None
    if part in PARTS and isinstance(column, exp.Column):
        return CalendarKey(column.name, part, truncate=False)
    return None


def key_type(expression: exp.Expression, column_type: str | None = None) -> str | None:
    """The database type of a calendar key written by ``emitted`` (None: not one): BIGINT for
    a part, the cast's type for a truncation."""
    key = calendar_of(expression)
    if key is None:
        return None
    if not key.truncate:
        return "BIGINT"
    if isinstance(expression, exp.Cast):
        return expression.to.sql(dialect="duckdb")
    return "DATE" if (column_type or "").upper() == "DATE" else "TIMESTAMP"


def _key_value(key: CalendarKey, value: str, column_type: str) -> str:
    """SQL of the key of ``value`` (a DATE or TIMESTAMP of the column's type)."""
    if key.truncate:
        target = "DATE" if column_type.upper() == "DATE" else "TIMESTAMP"
        return f"CAST(DATE_TRUNC('{key.part.upper()}', CAST({value} AS TIMESTAMP)) AS {target})"
    if key.part == "dow":
        days = f"DATE_DIFF('day', {_SUNDAY}, CAST({value} AS DATE))"
        return f"CAST(((({days}) % 7) + 7) % 7 AS BIGINT)"
    return f"CAST(EXTRACT({key.part.upper()} FROM {value}) AS BIGINT)"


def emitted(key: CalendarKey, column_type: str) -> exp.Expression:
    """The virtual key column the analyzer records: the key over the column as stored (the
    runtime form, over the clamped column, is ``run``)."""
    column = exp.column(key.column, quoted=True).sql(dialect="duckdb")
    if key.truncate:
        target = "DATE" if column_type.upper() == "DATE" else "TIMESTAMP"
        text = f"CAST(DATE_TRUNC('{key.part.upper()}', {column}) AS {target})"
    else:
        text = f"EXTRACT({key.part.upper()} FROM {column})"
    return exp.maybe_parse(text, dialect="duckdb")


def run(key: CalendarKey, low: str, high: str, column_type: str, value: str | None = None) -> str:
    """SQL of the key on each row: over the column (or ``value``) clamped to ``[low, high]``
    (SQL of typed literals), NULL for NULL (LEAST and GREATEST skip NULLs)."""
    value = value or exp.column(key.column, quoted=True).sql(dialect="duckdb")
    clamped = f"LEAST(GREATEST({value}, {low}), {high})"
    return f"(CASE WHEN {value} IS NULL THEN NULL ELSE {_key_value(key, clamped, column_type)} END)"


def periods_sql(key: CalendarKey, low: str, high: str) -> str:
    """SQL of one row: the number of periods of the key's unit from the one holding ``low`` to
    the one holding ``high`` (both counted)."""
    unit = key.unit
    if unit in ("year", "quarter", "month"):
        per_year = {"year": 1, "quarter": 4, "month": 12}[unit]
        within = {"year": "0", "quarter": "QUARTER({})", "month": "MONTH({})"}[unit]

        def index(value: str) -> str:
            return f"YEAR({value}) * {per_year} + {within.format(value)}"

        return f"SELECT {index(high)} - ({index(low)}) + 1"
    days = f"DATE_DIFF('day', CAST({low} AS DATE), CAST({high} AS DATE))"
    if unit == "week":
        weeks = (
            f"DATE_DIFF('day', CAST(DATE_TRUNC('WEEK', CAST({low} AS TIMESTAMP)) AS DATE), "
            f"CAST(DATE_TRUNC('WEEK', CAST({high} AS TIMESTAMP)) AS DATE))"
        )
        return f"SELECT CAST(({weeks}) / 7 AS BIGINT) + 1"
    if unit == "day":
        return f"SELECT {days} + 1"
    return f"SELECT ({days}) * 24 + HOUR({high}) - HOUR({low}) + 1"


def candidates_sql(
    key: CalendarKey, low: str, high: str, column_type: str, count: int
) -> str:
    """SQL listing the distinct keys of the first ``count`` periods from the one holding
    ``low`` (the key as ``run`` computes it, at each period's start), as the database prints
    them, in order: ``__key`` (text) and ``__value``."""
    start = f"DATE_TRUNC('{key.unit.upper()}', CAST({low} AS TIMESTAMP))"
    instant = f"CAST({start} + CAST(__i AS INTEGER) * {_STEP[key.unit]} AS {column_type})"
    value = run(key, low, high, column_type, instant)
    rows = ", ".join(f"({i})" for i in range(int(count)))
    return (
        f"SELECT DISTINCT CAST(__v AS VARCHAR) AS __key, __v AS __value FROM "
        f"(SELECT {value} AS __v FROM (VALUES {rows}) AS __periods(__i)) AS __keys "
        "ORDER BY __value"
    )
