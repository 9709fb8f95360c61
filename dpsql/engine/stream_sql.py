"""The SQL a query stream runs, generated from its declared columns: the bounded histogram it is
opened with (private rows only: ``dpsql.sql.generate.private_rows``), and the cells a WHERE
selects, evaluated by DuckDB over the cells' values (``dpsql.engine.streams`` has the rules).
"""

from __future__ import annotations

import numpy as np
import sqlglot
from sqlglot import exp

from dpsql.engine.streams import StreamColumn, ticks_sql, value_sql
from dpsql.errors import UnsupportedQueryError
from dpsql.sql.generate import private_rows, scoped

__all__ = ["alignment_sql", "cells_selected_sql", "cells_selected_ticks", "histogram_sql"]


def _ident(name: str) -> str:
    return exp.to_identifier(name, quoted=True).sql(dialect="duckdb")


def _cell_index(column: StreamColumn) -> str:
    ticks = ticks_sql(column, _ident(column.name))
    return f"(({ticks} - {column.low}) // {column.width})"


def histogram_sql(
    table: str,
    unit: str,
    max_rows_per_unit: int,
    columns: tuple[StreamColumn, ...],
    salt: int,
    fixed: tuple[str, ...] = (),
) -> str:
    """Cell index (row-major) and bounded count of every non-empty cell of the rows that satisfy
    the fixed filter (``fixed``: its conjuncts, DuckDB SQL): each unit keeps at most
    ``max_rows_per_unit`` of its in-domain rows, chosen by a salted hash of their cells."""
    inside = [
        f"{_ident(c.name)} BETWEEN {value_sql(c, str(c.low))} AND {value_sql(c, str(c.high))}"
        for c in columns
    ]
    inside += [
        f"({scoped(sqlglot.parse_one(conjunct, read='duckdb'), table, unit)})" for conjunct in fixed
    ]
    index = _cell_index(columns[0])
    for column in columns[1:]:
        index = f"({index} * {column.cells} + {_cell_index(column)})"
    return (
        f"SELECT cell, COUNT(*) AS n FROM (SELECT {index} AS cell, row_number() OVER "
        f"(PARTITION BY {_ident(unit)} ORDER BY hash({index}, {salt}), {index}) AS rank "
        f"FROM {private_rows(table, unit)} WHERE {' AND '.join(inside)}) "
        f"WHERE rank <= {max_rows_per_unit} "
        "GROUP BY cell ORDER BY cell"
    )


def _at(where: exp.Expression, values: dict[str, str]) -> exp.Expression:
    """``where`` with each column replaced by a SQL value expression."""

    def replace(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and node.name in values:
            return exp.maybe_parse(values[node.name], dialect="duckdb")
        return node

    return where.copy().transform(replace)


def _value(column: StreamColumn, index: str, end: bool) -> str:
    offset = f" + {column.width - 1}" if end and column.width > 1 else ""
    ticks = f"LEAST({column.low} + {index} * {column.width}{offset}, {column.high})"
    return value_sql(column, ticks)


_MONOTONE = (exp.LT, exp.LTE, exp.GT, exp.GTE)


def _monotone_atoms(where: exp.Expression, column: str) -> list[exp.Expression]:
    """The comparisons on ``column`` as monotone atoms (BETWEEN split in two). On a cell wider
    than one tick, the column may only appear as a side of ``<, <=, >, >=`` or as the tested
    value of a BETWEEN, the other sides free of columns: each such atom is monotone in the
    column's value, so agreeing at both ends of a cell it agrees on all of it. Anything else
    (``=``, ``IN``, a function or arithmetic of the column) is refused."""
    atoms: list[exp.Expression] = []
    for node in where.find_all(exp.Column):
        if node.name != column:
            continue
        parent = node.parent
        while isinstance(parent, exp.Paren):
            parent = parent.parent
        if isinstance(parent, exp.EQ | exp.NEQ | exp.In):
            raise UnsupportedQueryError(
                f"=, <> and IN on {column!r} are not answered by a stream whose cells are wider "
                "than one value; use ranges aligned with the cells"
            )
        if isinstance(parent, _MONOTONE):
            sides = [parent.this.unnest(), parent.expression.unnest()]
            others = [side for side in sides if side is not node]
            direct = len(others) == 1
        elif isinstance(parent, exp.Between):
            others = [parent.args["low"], parent.args["high"]]
            direct = parent.this.unnest() is node
        else:
            others, direct = [], False
        if not direct or any(o.find(exp.Column) is not None for o in others):
            raise UnsupportedQueryError(
                f"on {column!r} (cells wider than one value) a stream answers comparisons of the "
                "column itself with values (<, <=, >, >=, BETWEEN) only"
            )
        atom = parent
        if isinstance(atom, exp.Between):
            atoms.append(exp.GTE(this=atom.this.copy(), expression=atom.args["low"].copy()))
            atoms.append(exp.LTE(this=atom.this.copy(), expression=atom.args["high"].copy()))
        else:
            atoms.append(atom)
    return atoms


def alignment_sql(where: exp.Expression, column: StreamColumn) -> str | None:
    """A query returning TRUE when every comparison on a binned column has the same value at
    both ends of every cell (None when the column's cells are single values)."""
    if column.width == 1:
        return None
    atoms = _monotone_atoms(where, column.name)
    if not atoms:
        return None
    checks = [
        f"bool_and(({_at(a, {column.name: _value(column, 'i', False)}).sql('duckdb')}) IS NOT "
        f"DISTINCT FROM ({_at(a, {column.name: _value(column, 'i', True)}).sql('duckdb')}))"
        for a in atoms
    ]
    return f"SELECT {' AND '.join(checks)} FROM range({column.cells}) AS cells(i)"


def cells_selected_sql(where: exp.Expression, columns: tuple[StreamColumn, ...]) -> str:
    """The row-major index of every cell that satisfies ``where``, evaluated by DuckDB at the
    cell's low end (NULL is not selected, as in a WHERE)."""
    sources = ", ".join(f"range({c.cells}) AS r{i}(i{i})" for i, c in enumerate(columns))
    values = {c.name: _value(c, f"i{i}", False) for i, c in enumerate(columns)}
    index = "i0"
    for i, column in enumerate(columns[1:], start=1):
        index = f"({index} * {column.cells} + i{i})"
    predicate = _at(where, values).sql(dialect="duckdb")
    return f"SELECT {index} AS cell FROM {sources} WHERE ({predicate})"


_FLIPPED: dict[type, type] = {exp.LT: exp.GT, exp.LTE: exp.GTE, exp.GT: exp.LT, exp.GTE: exp.LTE}
_COMPARE = {
    exp.LT: np.less,
    exp.LTE: np.less_equal,
    exp.GT: np.greater,
    exp.GTE: np.greater_equal,
}
_INT64 = (-(2**63), 2**63 - 1)


class _NotPlain(Exception):
    """The WHERE is not a plain comparison of integer ticks: DuckDB decides its cells."""


def _integer_literal(node: exp.Expression) -> int:
    """The value of a bound literal ``CAST('<digits>' AS <integer type>)``."""
    node = node.unnest()
    if not (
        isinstance(node, exp.Cast)
        and isinstance(node.this, exp.Literal)
        and node.this.is_string
        and node.to.this in exp.DataType.INTEGER_TYPES  # is_type's test, without building types
    ):
        raise _NotPlain
    text = node.this.this
    if not text.lstrip("-").isdigit() or not _INT64[0] <= int(text) <= _INT64[1]:
        raise _NotPlain
    return int(text)


def cells_selected_ticks(
    where: exp.Expression, columns: tuple[StreamColumn, ...]
) -> np.ndarray | None:
    """The cells ``cells_selected_sql`` selects, computed without a database round trip, or None
    when the WHERE is not of the one form this is exact for.

    The form: AND, OR, NOT and parentheses over comparisons ``<, <=, >, >=`` and ``BETWEEN`` of
    an integer column of the stream (``kind`` "integer": its values are its ticks) with bound
    literals, i.e. ``CAST('<digits>' AS <integer type>)`` whose text the database itself wrote
    when it converted the analyst's literal (``dpsql.engine.literals``). Such a comparison is
    one of two integers, both non-NULL and within 64 bits, which the database and NumPy decide
    alike (the database widens both sides to a common integer type, exactly); with no NULL,
    AND, OR and NOT are two-valued. Every cell is decided at its low end as in
    ``cells_selected_sql``, and on a column with cells wider than one value each comparison must
    agree at both ends of every cell, as ``alignment_sql`` demands (a comparison is monotone in
    the column, so agreeing at both ends it agrees on the whole cell); a cell it splits is
    refused with ``alignment_sql``'s message by the caller. Anything else (another kind, type or
    operator, a function, arithmetic) returns None and DuckDB decides."""
    by_name = {c.name: i for i, c in enumerate(columns)}
    if any(
        c.kind != "integer" or not (_INT64[0] <= c.low and c.high <= _INT64[1]) for c in columns
    ):
        return None
    shape = [c.cells for c in columns]

    def ends(name: str, end: bool) -> np.ndarray:
        i = by_name[name]
        column = columns[i]
        index = np.arange(column.cells, dtype=np.int64)
        values = column.low + index * column.width + (column.width - 1 if end else 0)
        values = np.minimum(values, column.high)
        return values.reshape([column.cells if k == i else 1 for k in range(len(columns))])

    split: list[str] = []

    def compare(kind: type, column: exp.Column, literal: exp.Expression) -> np.ndarray:
        if column.name not in by_name:
            raise _NotPlain
        value = _integer_literal(literal)
        low = _COMPARE[kind](ends(column.name, False), value)
        if columns[by_name[column.name]].width > 1:
            high = _COMPARE[kind](ends(column.name, True), value)
            if not np.array_equal(low, high):
                split.append(column.name)
        return low

    def evaluate(node: exp.Expression) -> np.ndarray:
        node = node.unnest()
        if isinstance(node, exp.And):
            return evaluate(node.this) & evaluate(node.expression)
        if isinstance(node, exp.Or):
            return evaluate(node.this) | evaluate(node.expression)
        if isinstance(node, exp.Not):
            return ~evaluate(node.this)
        if isinstance(node, exp.Between):
            column = node.this.unnest()
            if not isinstance(column, exp.Column) or node.args.get("symmetric") is not None:
                raise _NotPlain
            return compare(exp.GTE, column, node.args["low"]) & compare(
                exp.LTE, column, node.args["high"]
            )
        if isinstance(node, _MONOTONE):
            left, right = node.this.unnest(), node.expression.unnest()
            if isinstance(left, exp.Column):
                return compare(type(node), left, right)
            if isinstance(right, exp.Column):
                return compare(_FLIPPED[type(node)], right, left)
        raise _NotPlain

    try:
        selected = np.broadcast_to(evaluate(where), shape)
    except _NotPlain:
        return None
    if split:
        return None  # DuckDB's alignment check refuses it, with its message
    return np.ascontiguousarray(selected).ravel()
