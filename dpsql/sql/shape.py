"""The typed shape of an accepted query: what to aggregate, over which rows, grouped by what.

A shape says nothing about privacy; the engine's planner turns it into noisy measurements using the
policy. Column names in a shape are the database's own spelling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from fractions import Fraction
from typing import Any

from sqlglot import exp

__all__ = [
    "Aggregate",
    "AggregateKind",
    "ColumnKind",
    "GroupKey",
    "Having",
    "QueryShape",
    "RangeJoin",
]


class ColumnKind(Enum):
    """What dpsql may do with a column, read off its database type."""

    INTEGER = "integer"
    FLOAT = "float"
    DECIMAL = "decimal"
    STRING = "string"
    BOOLEAN = "boolean"
    DATE = "date"
    TIMESTAMP = "timestamp"
    OTHER = "other"

    @property
    def numeric(self) -> bool:
        return self in (ColumnKind.INTEGER, ColumnKind.FLOAT, ColumnKind.DECIMAL)

    @classmethod
    def of(cls, type_name: str) -> ColumnKind:
        """Classify a DuckDB/ANSI type name such as ``BIGINT`` or ``DECIMAL(10,2)``."""
        name = type_name.upper().split("(")[0].strip()
        if name in {
            "TINYINT",
            "SMALLINT",
            "INTEGER",
            "INT",
            "BIGINT",
            "HUGEINT",
            "UTINYINT",
            "USMALLINT",
            "UINTEGER",
            "UBIGINT",
            "UHUGEINT",
            "INT1",
            "INT2",
            "INT4",
            "INT8",
            "LONG",
            "SHORT",
        }:
            return cls.INTEGER
        if name in {"FLOAT", "DOUBLE", "REAL", "FLOAT4", "FLOAT8"}:
            return cls.FLOAT
        if name in {"DECIMAL", "NUMERIC"}:
            return cls.DECIMAL
        if name in {"VARCHAR", "TEXT", "STRING", "CHAR", "BPCHAR"}:
            return cls.STRING
        if name in {"BOOLEAN", "BOOL"}:
            return cls.BOOLEAN
        if name == "DATE":
            return cls.DATE
        if name.startswith("TIMESTAMP") or name == "DATETIME":
            return cls.TIMESTAMP
        return cls.OTHER


class AggregateKind(Enum):
    COUNT = "count"
    SUM = "sum"
    AVG = "avg"
    PERSONS = "persons"
    """``COUNT(DISTINCT <privacy unit>)``."""
    QUANTILE = "quantile"
    """``MEDIAN``, ``quantile_cont``, ``percentile_cont`` (``dpsql.sql.quantiles``)."""


@dataclass(frozen=True)
class Aggregate:
    """``COUNT(*)`` (column None), ``COUNT(col)``, ``SUM(col)``, ``AVG(col)`` or a quantile of
    ``col`` (``quantile``, an exact fraction in [0, 1]), named ``name``."""

    kind: AggregateKind
    column: str | None
    name: str
    quantile: Fraction | None = None


@dataclass(frozen=True)
class GroupKey:
    """A GROUP BY column shown in the select list under ``name``."""

    column: str
    name: str


@dataclass(frozen=True)
class Having:
    """``HAVING COUNT(*) > threshold`` (``inclusive``: ``>=``); ``name`` is COUNT(*)'s output."""

    threshold: float
    inclusive: bool
    name: str

    @property
    def integer_threshold(self) -> int:
        """The smallest integer count that passes (counts are integers)."""
        return math.ceil(self.threshold) if self.inclusive else math.floor(self.threshold) + 1


@dataclass(frozen=True)
class RangeJoin:
    """``JOIN public ON value BETWEEN public.low AND public.high``: one range query per row of a
    public table; the GROUP BY columns of the shape then name columns of ``table``."""

    table: str
    value: str
    low: str
    high: str
    columns: dict[str, ColumnKind]


@dataclass(frozen=True)
class RelationSql:
    """A relation over several tables as the database reads it: its ``sql`` (DuckDB's dialect),
    and the ``rule`` its contribution bounds follow, in words."""

    sql: str
    rule: str


@dataclass(frozen=True)
class QueryShape:
    """One accepted SELECT over one table."""

    table: str
    outputs: tuple[Aggregate | GroupKey, ...]
    group_by: tuple[str, ...]
    where: exp.Expression | None
    columns: dict[str, ColumnKind]
    options: dict[str, Any]
    having: Having | None = None
    range_join: RangeJoin | None = None
    types: dict[str, str] = field(default_factory=dict)
    """The database's type name of each column of ``table``."""
    virtual: dict[str, exp.Expression] = field(default_factory=dict)
    """Expressions inside aggregates, as columns ``__dp_e<i>`` the aggregates read
    (``dpsql.sql.expressions``)."""
    domains: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """The key domain of each GROUP BY bin (``__dp_k<i>``), as the database enumerated it over
    the declared bounds when the query was bound: its distinct values, in order."""
    post: Any = None
    """The post-processing of the released answer (``dpsql.sql.postprocess.PostProcess``)."""
    relation: RelationSql | None = None
    """The relation ``table`` names when the query reads several tables or a subquery
    (``dpsql.sql.relations``); None for a table of the database."""

    @property
    def aggregates(self) -> tuple[Aggregate, ...]:
        return tuple(o for o in self.outputs if isinstance(o, Aggregate))

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.outputs)
