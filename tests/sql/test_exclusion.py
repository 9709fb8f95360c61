"""dpsql.sql.exclusion: the keys left out of round 2 are exactly those named, in DuckDB's own
comparison, whatever the keys' characters (property-based)."""

from __future__ import annotations

import duckdb
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
