"""A query shape restricted to the rows whose key is not among already released keys.

Round 2 of the adaptive selection (``dpsql.mechanisms.adaptive_selection``) reads the same
bounded aggregation as round 1 with the keys round 1 released left out: the keys are a public
output of round 1, written into the WHERE clause as literals of the column's own kind, so the
database compares them in its own semantics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sqlglot import exp

from dpsql.sql.shape import ColumnKind, QueryShape

__all__ = ["without_keys"]


def without_keys(shape: QueryShape, column: str, keys: Sequence[object]) -> QueryShape:
    """``shape`` whose WHERE also requires ``column NOT IN (keys)`` (``shape`` when none).

    >>> from dpsql.sql.shape import QueryShape
    >>> shape = QueryShape("t", (), ("url",), None, {"url": ColumnKind.STRING}, {})
    >>> print(without_keys(shape, "url", ["a", "b'c"]).where.sql(dialect="duckdb"))
    NOT "url" IN ('a', 'b''c')
    """
    if not len(keys):
        return shape
    text = shape.columns[column] is ColumnKind.STRING
    literals = [exp.Literal.string(str(k)) if text else exp.Literal.number(int(k)) for k in keys]
    excluded = exp.Not(this=exp.In(this=exp.column(column, quoted=True), expressions=literals))
    where = excluded if shape.where is None else exp.and_(shape.where, excluded)
    return dataclasses.replace(shape, where=where)
