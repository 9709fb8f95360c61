"""dpsql.sql.exclusion: the keys left out of round 2 are exactly those named, in DuckDB's own
comparison, whatever the keys' characters; round 2 over round 1's materialised cells gives
exactly the weights of round 2 over the rows (property-based, against DuckDB)."""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import exp

from dpsql.sql.exclusion import without_keys
from dpsql.sql.shape import ColumnKind, QueryShape

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)


def _left(shape: QueryShape, frame: pd.DataFrame) -> set:
    con = duckdb.connect()
    con.register("t", frame)
    where = "" if shape.where is None else f" WHERE {shape.where.sql(dialect='duckdb')}"
    return {row[0] for row in con.execute(f'SELECT DISTINCT "k" FROM t{where}').fetchall()}


@settings(max_examples=30, deadline=None)
@given(keys=st.lists(TEXT, min_size=1, max_size=12, unique=True), data=st.data())
def test_text_keys_named_are_exactly_the_ones_left_out(keys, data) -> None:
    found = data.draw(st.lists(st.sampled_from(keys), unique=True))
    shape = QueryShape("t", (), ("k",), None, {"k": ColumnKind.STRING}, {})
    assert _left(without_keys(shape, "k", found), pd.DataFrame({"k": keys})) == set(keys) - set(
        found
    )


@settings(max_examples=20, deadline=None)
@given(
    keys=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=12, unique=True),
    data=st.data(),
)
def test_integer_keys_and_an_existing_where_are_both_kept(keys, data) -> None:
    found = data.draw(st.lists(st.sampled_from(keys), unique=True))
    frame = pd.DataFrame(
        {"k": pd.Series(keys, dtype="int64"), "flag": [i % 2 for i in range(len(keys))]}
    )
    where = exp.EQ(this=exp.column("flag"), expression=exp.Literal.number(1))
    shape = QueryShape("t", (), ("k",), where, {"k": ColumnKind.INTEGER}, {})
    expected = set(frame.loc[frame.flag == 1, "k"]) - set(found)
    assert _left(without_keys(shape, "k", found), frame) == expected


# Round 2 over round 1's materialised cells (dpsql.sql.exclusion.second_round_weights) against
# round 2 as today's SQL over the rows (the bounded aggregation with the keys as literals).

INTEGER_KEYS = st.integers(-(2**63), 2**63 - 1)


def _rows(data, keys) -> pd.DataFrame:
    """Persons holding 1..12 of ``keys``, 1..3 rows each (some far more keys than K)."""
    units = data.draw(st.integers(1, 12))
    rows = []
    for unit in range(units):
        held = data.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=12, unique=True))
        for key in held:
            rows += [(unit * 7919 - 3, key)] * data.draw(st.integers(1, 3))
    return pd.DataFrame(rows, columns=["uid", "k"])


def _both_rounds(frame: pd.DataFrame, kind: ColumnKind, cut: int, salt: int, found: list) -> tuple:
    from dpsql.engine.backends import DuckDBBackend
    from dpsql.mechanisms.weighted_selection import unit_weights
    from dpsql.sql.exclusion import FOUND_COLUMN, second_round_weights
    from dpsql.sql.generate import Bounds, Measure, MeasureKind, bounded_aggregate, ranked_cells

    type_name = "VARCHAR" if kind is ColumnKind.STRING else "BIGINT"
    columns = {"k": kind, "uid": ColumnKind.INTEGER}
    shape = QueryShape("t", (), ("k",), None, columns, {}, types={"k": type_name, "uid": "BIGINT"})
    # max_rows_per_unit below 2 * cut sometimes: the per-unit row bound then binds too.
    bounds = Bounds("uid", cut, 2, cut + salt % (2 * cut))
    weights = unit_weights(cut)
    common = {"measures": [], "bounds": bounds, "public_keys": {}, "salt": salt, "weights": weights}
    counted = {**common, "measures": [Measure("n", MeasureKind.ROWS)]}
    backend = DuckDBBackend(None)
    backend.register("t", frame.astype({"k": "string" if kind is ColumnKind.STRING else "int64"}))
    try:
        today = backend.run(bounded_aggregate(without_keys(shape, "k", found), **common))
        first = backend.run(bounded_aggregate(shape, **counted))
        with backend.scratch() as scratch:
            cells = scratch.table(ranked_cells(shape, **counted))
            # Round 1 itself, read from the cells: the same counts and weights.
            again = backend.run(bounded_aggregate(shape, **counted, cells_table=cells))
            assert _rows_of(again) == _rows_of(first)
            values = np.array(found, dtype=object if kind is ColumnKind.STRING else np.int64)
            keys = scratch.values(FOUND_COLUMN, values, text=kind is ColumnKind.STRING)
            kept = backend.run(second_round_weights(cells, keys, "k", weights))
        left = backend.run(
            "SELECT table_name FROM duckdb_tables() WHERE table_name LIKE '__dpsql%' "
            "UNION ALL SELECT view_name FROM duckdb_views() WHERE view_name LIKE '__dpsql%'"
        )
    finally:
        backend.close()
    assert left.empty, "the scratch tables outlive their block"
    return _weights(today), _weights(kept)


def _rows_of(frame: pd.DataFrame) -> set:
    return set(frame.itertuples(index=False, name=None))


def _weights(frame: pd.DataFrame) -> dict:
    return dict(zip(frame["k"].tolist(), frame["weight"].astype(int).tolist(), strict=True))


@settings(max_examples=80, deadline=None)
@given(text=st.booleans(), cut=st.integers(1, 5), salt=st.integers(0, 2**62), data=st.data())
def test_round_two_over_cells_gives_todays_weights(text, cut, salt, data) -> None:
    """Text keys of any characters, or 64-bit integers; persons with up to 12 keys (more than
    K = cut: they re-choose), any subset released in round 1."""
    keys = data.draw(st.lists(TEXT if text else INTEGER_KEYS, min_size=1, max_size=15, unique=True))
    frame = _rows(data, keys)
    found = data.draw(st.lists(st.sampled_from(keys), unique=True))
    kind = ColumnKind.STRING if text else ColumnKind.INTEGER
    today, kept = _both_rounds(frame, kind, cut, salt, found)
    assert kept == today
