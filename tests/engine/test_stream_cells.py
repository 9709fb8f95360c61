"""Which rows a stream's answer counts, decided by DuckDB: for integer, DATE, TIMESTAMP and
DECIMAL columns cut into cells (of a width in the column's own type), the cells a WHERE selects
hold exactly the in-domain rows DuckDB's own WHERE selects (hypothesis, against DuckDB); a WHERE
that could split a cell is refused, never approximated."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pytest
import sqlglot
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dpsql.engine.literals import Binder
from dpsql.engine.stream_sql import (
    _cell_index,
    alignment_sql,
    cells_selected_sql,
    cells_selected_ticks,
)
from dpsql.engine.streams import StreamColumn, stream_columns
from dpsql.errors import ParameterError, UnsupportedQueryError

ROWS = 400


class _Backend:
    def __init__(self, connection: duckdb.DuckDBPyConnection):
        self.connection = connection

    def run(self, sql: str) -> pd.DataFrame:
        return self.connection.execute(sql).df()


_TYPES = {
    "integer": ("BIGINT", -50, 50, [1, 3, 10]),
    "date": ("DATE", "2024-01-01", "2024-03-31", [1, 7, 30]),
    "timestamp": ("TIMESTAMP", "2024-01-01 00:00:00", "2024-01-03 23:59:59", ["1 hour", "6 hours"]),
    "decimal": ("DECIMAL(10,2)", "-5.00", "5.00", ["0.01", "0.25", "1.00"]),
}


def _values(kind: str, rng: np.random.Generator) -> list[Any]:
    """Values around (and beyond) each kind's bounds, with NULLs."""
    if kind == "integer":
        values: list[Any] = [int(v) for v in rng.integers(-60, 61, ROWS)]
    elif kind == "date":
        start = dt.date(2023, 12, 20)
        values = [start + dt.timedelta(days=int(d)) for d in rng.integers(0, 120, ROWS)]
    elif kind == "timestamp":
        start = dt.datetime(2023, 12, 31, 20)
        values = [
            start + dt.timedelta(microseconds=int(u)) for u in rng.integers(0, 4 * 86400e6, ROWS)
        ]
        values[:3] = [
            dt.datetime(2024, 1, 1),
            dt.datetime(2024, 1, 1, 0, 59, 59, 999999),
            dt.datetime(2024, 1, 3, 23, 59, 59),
        ]
    else:
        values = [Decimal(int(v)) / 100 for v in rng.integers(-600, 601, ROWS)]
    values[-5:] = [None] * 5
    return values


@pytest.fixture(scope="module", params=sorted(_TYPES))
def table(request) -> tuple[str, duckdb.DuckDBPyConnection]:
    kind = request.param
    type_name = _TYPES[kind][0]
    connection = duckdb.connect()
    connection.execute(f"CREATE TABLE t (v {type_name})")
    values = _values(kind, np.random.default_rng(5))
    connection.executemany("INSERT INTO t VALUES (?)", [(v,) for v in values])
    yield kind, connection
    connection.close()


def _column(kind: str, connection, width: Any) -> StreamColumn:
    type_name, low, high, _ = _TYPES[kind]
    binder = Binder(_Backend(connection), {"t": {"v": type_name}})
    (column,) = stream_columns([("v", width, low, high)], {"v": type_name}, {}, binder)
    return column


def _literal(kind: str, draw) -> str:
    """A literal of the column's type near the domain (often on a cell edge, often not)."""
    type_name = _TYPES[kind][0]
    if kind == "integer":
        text = str(draw(st.integers(-60, 60)))
    elif kind == "date":
        text = str(dt.date(2023, 12, 25) + dt.timedelta(days=draw(st.integers(0, 110))))
    elif kind == "timestamp":
        hours = draw(st.integers(0, 80))
        extra = draw(st.sampled_from([0, 0, 1, 3_599_999_999]))
        moment = dt.datetime(2023, 12, 31, 22) + dt.timedelta(hours=hours, microseconds=extra)
        text = moment.isoformat(sep=" ")
    else:
        text = str(Decimal(draw(st.integers(-600, 600))) / 100)
    return f"CAST('{text}' AS {type_name})"


@st.composite
def _predicates(draw, kind: str, depth: int = 0) -> str:
    choice = draw(st.integers(0, 9 if depth < 2 else 5))
    if choice <= 3:
        op = draw(st.sampled_from(["<", "<=", ">", ">="]))
        a = _literal(kind, draw)
        return f"v {op} {a}" if draw(st.booleans()) else f"{a} {op} v"
    if choice == 4:
        return f"v BETWEEN {_literal(kind, draw)} AND {_literal(kind, draw)}"
    if choice == 5:
        return draw(
            st.sampled_from(
                [
                    f"v = {_literal(kind, draw)}",
                    f"v IN ({_literal(kind, draw)}, {_literal(kind, draw)})",
                    f"v <> {_literal(kind, draw)}",
                ]
            )
        )
    if choice == 6:
        return f"NOT ({draw(_predicates(kind, depth + 1))})"
    joiner = draw(st.sampled_from([" AND ", " OR "]))
    return f"({draw(_predicates(kind, depth + 1))}){joiner}({draw(_predicates(kind, depth + 1))})"


def _selected(column: StreamColumn, where: str, connection) -> np.ndarray | None:
    """The selected cells, or None when the stream refuses the WHERE."""
    tree = sqlglot.parse_one(where, dialect="duckdb")
    try:
        check = alignment_sql(tree, column)
    except UnsupportedQueryError:
        return None
    if check is not None and not connection.execute(check).fetchone()[0]:
        return None
    cells = connection.execute(cells_selected_sql(tree, (column,))).fetchall()
    selected = np.zeros(column.cells, dtype=bool)
    selected[[c for (c,) in cells]] = True
    return selected


def test_the_cells_a_where_selects_hold_exactly_the_rows_duckdb_selects(table) -> None:
    kind, connection = table
    widths = _TYPES[kind][3]

    @settings(
        max_examples=60,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(st.sampled_from(widths), _predicates(kind))
    def check(width: Any, where: str) -> None:
        column = _column(kind, connection, width)
        selected = _selected(column, where, connection)
        assume(selected is not None)
        low, high = _TYPES[kind][1:3]
        type_name = _TYPES[kind][0]
        rows = connection.execute(
            f"SELECT {_cell_index(column)} AS cell, COALESCE(({where}), false) AS chosen FROM t "
            f"WHERE v BETWEEN CAST('{low}' AS {type_name}) AND CAST('{high}' AS {type_name})"
        ).df()
        assert len(rows) > 0
        cells = rows["cell"].to_numpy(dtype=np.int64)
        assert cells.min() >= 0 and cells.max() < column.cells
        np.testing.assert_array_equal(selected[cells], rows["chosen"].to_numpy(dtype=bool))

    check()


def test_single_value_cells_answer_equality_and_binned_cells_refuse_it(table) -> None:
    kind, connection = table
    literal = {
        "integer": "7",
        "date": "'2024-02-29'",
        "decimal": "'1.25'",
        "timestamp": "'2024-01-02 05:00:00'",
    }[kind]
    column = _column(kind, connection, _TYPES[kind][3][0])
    where = f"v = CAST({literal} AS {column.type}) OR v IN (CAST({literal} AS {column.type}))"
    selected = _selected(column, where, connection)
    if kind == "timestamp":  # one-hour cells: equality would split one
        assert selected is None
        return
    assert selected is not None and selected.sum() == 1
    wider = _column(kind, connection, _TYPES[kind][3][1])
    assert _selected(wider, where, connection) is None


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("v + 0 < 5", "comparisons of the column itself"),
        ("abs(v) < 5", "comparisons of the column itself"),
        ("v < v", "comparisons of the column itself"),
        ("5 BETWEEN v AND 10", "comparisons of the column itself"),
        ("v = 5", "=, <> and IN"),
    ],
)
def test_binned_cells_refuse_what_is_not_monotone(where: str, message: str) -> None:
    column = StreamColumn("v", "BIGINT", 0, 99, 10)
    with pytest.raises(UnsupportedQueryError, match=message):
        alignment_sql(sqlglot.parse_one(where, dialect="duckdb"), column)


@pytest.mark.parametrize(
    ("type_name", "spec", "message"),
    [
        ("DATE", ("v", 7), "needs bounds"),
        ("DATE", ("v", 0, "2024-01-01", "2024-02-01"), "positive integer"),
        ("DATE", ("v", 1, "2024-02-30", "2024-03-01"), "not exactly a value"),
        ("DATE", ("v", 1, "2024-03-01", "2024-02-01"), "low <= high"),
        ("TIMESTAMP", ("v", "1 month", "2024-01-01", "2024-12-31"), "fixed-length interval"),
        ("TIMESTAMP", ("v", "-1 hour", "2024-01-01", "2024-12-31"), "positive"),
        ("TIMESTAMP WITH TIME ZONE", ("v", "1 hour", "2024-01-01", "2024-12-31"), "streams take"),
        ("DECIMAL(10,2)", ("v", "0.001", "0", "5"), "not exactly a value"),
        ("DECIMAL(30,2)", ("v", "0.01", "0", "5"), "precision <= 18"),
        ("DOUBLE", ("v", 1, 0, 5), "streams take"),
        ("BIGINT", ("v", 1, 0.5, 5), "integer bounds"),
    ],
)
def test_bad_typed_columns_are_refused(type_name: str, spec: tuple, message: str) -> None:
    connection = duckdb.connect()
    binder = Binder(_Backend(connection), {"t": {"v": type_name}})
    with pytest.raises(Exception, match=message) as raised:
        stream_columns([spec], {"v": type_name}, {}, binder)
    assert raised.type.__module__.startswith("dpsql")


def test_ticks_and_cells_of_each_type() -> None:
    connection = duckdb.connect()
    binder = Binder(_Backend(connection), {})
    (day,) = stream_columns([("d", 7, "2024-01-01", "2024-12-31")], {"d": "DATE"}, {}, binder)
    assert (day.width, day.cells, day.bounds) == (7, 53, ("2024-01-01", "2024-12-31"))
    (hour,) = stream_columns(
        [("t", "1 hour", "2024-01-01", "2024-01-01 23:59:59")], {"t": "TIMESTAMP"}, {}, binder
    )
    assert (hour.width, hour.cells) == (3_600_000_000, 24)
    assert hour.bounds == ("2024-01-01 00:00:00", "2024-01-01 23:59:59")
    (money,) = stream_columns([("m", "0.50", "0", "99.99")], {"m": "DECIMAL(8,2)"}, {}, binder)
    assert (money.low, money.high, money.width, money.cells) == (0, 9999, 50, 200)
    with pytest.raises(ParameterError, match="2 to"):
        stream_columns([("d", 1, "2000-01-01", "4999-01-01")], {"d": "DATE"}, {}, binder)


@st.composite
def _two_column_predicates(draw, depth: int = 0) -> str:
    choice = draw(st.integers(0, 7 if depth < 2 else 4))
    name = draw(st.sampled_from(["v", "w"]))
    if choice <= 2:
        op = draw(st.sampled_from(["<", "<=", ">", ">="]))
        a = f"CAST('{draw(st.integers(-60, 60))}' AS BIGINT)"
        return f"{name} {op} {a}" if draw(st.booleans()) else f"{a} {op} {name}"
    if choice == 3:
        a, b = draw(st.integers(-60, 60)), draw(st.integers(-60, 60))
        return f"{name} BETWEEN CAST('{a}' AS BIGINT) AND CAST('{b}' AS BIGINT)"
    if choice == 4:
        return f"{name} = CAST('{draw(st.integers(-60, 60))}' AS BIGINT)"  # DuckDB decides
    if choice == 5:
        return f"NOT ({draw(_two_column_predicates(depth + 1))})"
    joiner = draw(st.sampled_from([" AND ", " OR "]))
    left, right = draw(_two_column_predicates(depth + 1)), draw(_two_column_predicates(depth + 1))
    return f"({left}){joiner}({right})"


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    st.sampled_from([1, 3, 10]), st.sampled_from([1, 4]), st.booleans(), _two_column_predicates()
)
def test_cells_chosen_in_numpy_are_the_cells_duckdb_chooses(
    width: int, other: int, low_edge: bool, where: str
) -> None:
    """Where ``cells_selected_ticks`` answers (plain comparisons of integer ticks with bound
    literals), it selects exactly the cells DuckDB's ``cells_selected_sql`` selects, and it
    answers nothing DuckDB's alignment check refuses."""
    columns = (
        StreamColumn("v", "BIGINT", -50 if low_edge else -47, 50, width),
        StreamColumn("w", "INTEGER", -20, 20, other),
    )
    tree = sqlglot.parse_one(where, dialect="duckdb")
    ours = cells_selected_ticks(tree, columns)
    connection = duckdb.connect()
    try:
        aligned = all(
            (check := alignment_sql(tree, c)) is None or connection.execute(check).fetchone()[0]
            for c in columns
        )
    except UnsupportedQueryError:
        aligned = False
    if not aligned:
        assert ours is None
        return
    cells = connection.execute(cells_selected_sql(tree, columns)).fetchall()
    theirs = np.zeros(columns[0].cells * columns[1].cells, dtype=bool)
    theirs[[c for (c,) in cells]] = True
    if ours is None:
        assert "=" in where.replace("<=", "").replace(">=", "")
        return
    np.testing.assert_array_equal(ours, theirs)


def test_cells_chosen_in_numpy_only_for_integer_ticks_and_bound_literals() -> None:
    integer = (StreamColumn("v", "BIGINT", 0, 99, 10),)
    day = (StreamColumn("v", "DATE", 0, 99, 1, kind="date"),)
    plain = sqlglot.parse_one("v >= CAST('10' AS BIGINT)", dialect="duckdb")
    assert cells_selected_ticks(plain, integer) is not None
    assert cells_selected_ticks(plain, day) is None
    for where in (
        "v >= 10",
        "v + 0 >= CAST('10' AS BIGINT)",
        "v >= CAST('10' AS DOUBLE)",
        "v BETWEEN SYMMETRIC CAST('20' AS BIGINT) AND CAST('10' AS BIGINT)",
        "v >= CAST('15' AS BIGINT)",
    ):
        assert cells_selected_ticks(sqlglot.parse_one(where, dialect="duckdb"), integer) is None
