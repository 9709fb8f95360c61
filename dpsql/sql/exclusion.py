"""Round 2 of the adaptive selection (``dpsql.mechanisms.adaptive_selection``): each unit's
weights over its kept keys outside the keys round 1 released.

Round 2 is round 1's bounded aggregation (same salt, so each unit's keys in the same salted
order) with round 1's keys left out *before* each unit keeps its first K keys: a unit whose kept
keys include released ones re-chooses K among the rest. Two ways to compute it:

- :func:`second_round_weights` reads round 1's ranked cells, materialised once
  (``dpsql.sql.generate.ranked_cells``), and the released keys as a table (data of the key
  column's kind, compared by the database itself: no literal is written into SQL). No row of
  the data is read again. A unit's first K cells outside the released keys are exactly its
  cells outside them whose round-1 rank is at most ``K + s``, where ``s`` counts the unit's
  released cells that come before its K-th other cell: the released cell ``j`` (by rank
  ``r_j``) comes before it iff fewer than K other cells precede it, ``r_j - j < K``.
- :func:`without_keys`, for backends that cannot keep the cells (Spark): the released keys
  written into the WHERE clause as literals of the column's own kind, and the whole bounded
  aggregation run again.

Both give each unit's ``m = min(K, its keys outside the released ones)`` remaining kept keys the
weight ``w_m`` and sum per key (``tests/sql/test_exclusion.py`` checks that they agree).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sqlglot import exp

from dpsql.sql.generate import identifier, unit_weight
from dpsql.sql.shape import ColumnKind, QueryShape

__all__ = ["FOUND_COLUMN", "second_round_weights", "without_keys"]

FOUND_COLUMN = "__found_key"
"""The one column of the released keys' table read by :func:`second_round_weights`."""


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


def second_round_weights(cells: str, found: str, column: str, weights: Sequence[int]) -> str:
    """DuckDB SQL: per key, the summed round-2 weights (columns ``column`` and ``weight``).

    ``cells`` names a table of round 1's ranked cells (``ranked_cells``, one group column
    ``__key0``), ``found`` a table of the released keys (column :data:`FOUND_COLUMN`);
    ``weights`` are ``w_1..w_K``.

    >>> sql = second_round_weights("c", "f", "url", (128, 90))
    >>> "ANTI JOIN \"f\"" in sql, "__group_rank <= 2 + COALESCE(s.__shift, 0)" in sql
    (True, True)
    """
    cells_table, found_table = identifier(cells), identifier(found)
    cut = len(weights)
    on = f"__key0 = {identifier(FOUND_COLUMN)}"
    # Each released cell's number of other cells before it in its unit's order (r_j - j).
    hits = (
        "hits AS (SELECT __unit, __group_rank - ROW_NUMBER() OVER (PARTITION BY __unit "
        f"ORDER BY __group_rank) AS __before FROM {cells_table} SEMI JOIN {found_table} ON {on})"
    )
    shifts = (
        f"shifts AS (SELECT __unit, COUNT(*) AS __found_keys, "
        f"COUNT(*) FILTER (WHERE __before < {cut}) AS __shift FROM hits GROUP BY __unit)"
    )
    others = f"(SELECT * FROM {cells_table} ANTI JOIN {found_table} ON {on}) AS m"
    kept = (
        f"kept AS (SELECT m.__key0, LEAST(m.__unit_keys - COALESCE(s.__found_keys, 0), {cut}) "
        f"AS __m FROM {others} LEFT JOIN shifts AS s ON m.__unit = s.__unit "
        f"WHERE m.__group_rank <= {cut} + COALESCE(s.__shift, 0))"
    )
    return (
        f"WITH {hits}, {shifts}, {kept} SELECT __key0 AS {identifier(column)}, "
        f"CAST(SUM({unit_weight('__m', weights)}) AS BIGINT) AS {identifier('weight')} "
        "FROM kept GROUP BY __key0"
    )
