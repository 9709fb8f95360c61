"""The SQL a query stream runs, generated from its declared columns: the bounded histogram it is
opened with (private rows only: ``dpsql.sql.generate.private_rows``), and the cells a WHERE
selects, evaluated by DuckDB over the cells' values (``dpsql.engine.streams`` has the rules).
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from dpsql.engine.streams import StreamColumn, ticks_sql, value_sql
from dpsql.errors import UnsupportedQueryError
from dpsql.sql.generate import private_rows, scoped

__all__ = ["alignment_sql", "cells_selected_sql", "histogram_sql"]


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
