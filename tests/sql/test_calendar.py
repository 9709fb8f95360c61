"""Calendar keys (``dpsql.sql.calendar``): which GROUP BY expressions are calendar keys, and that
the key each row gets is DuckDB's own function of the clamped value.

The runtime expression is written to mean the same on DuckDB and Spark (the day of the week is
computed from the days since a Sunday, not with the engines' differing ``dayofweek``); here it
is checked against DuckDB's ``date_trunc``, ``EXTRACT`` and ``dayofweek`` over instants inside,
at and beyond the bounds, and NULL.
"""

from __future__ import annotations

import datetime as dt

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql.errors import UnsupportedQueryError
from dpsql.sql import calendar
from dpsql.sql.analyze import analyze
from dpsql.sql.parse import parse

CATALOG = {
    "t": {
        "u": "BIGINT",
        "d": "DATE",
        "ts": "TIMESTAMP",
        "tz": "TIMESTAMP WITH TIME ZONE",
        "s": "VARCHAR",
        "x": "DOUBLE",
    }
}
KEYS = {
    "date_trunc('month', d)": ("d", "month", True),
    "DATE_TRUNC('YEAR', ts)": ("ts", "year", True),
    "date_trunc('quarter', d)": ("d", "quarter", True),
    "date_trunc('week', ts)": ("ts", "week", True),
    "date_trunc('day', ts)": ("ts", "day", True),
    "EXTRACT(dow FROM d)": ("d", "dow", False),
    "EXTRACT(month FROM ts)": ("ts", "month", False),
    "EXTRACT(year FROM d)": ("d", "year", False),
    "EXTRACT(quarter FROM d)": ("d", "quarter", False),
    "EXTRACT(hour FROM ts)": ("ts", "hour", False),
    "year(d)": ("d", "year", False),
    "month(ts)": ("ts", "month", False),
    "quarter(d)": ("d", "quarter", False),
    "dayofweek(ts)": ("ts", "dow", False),
    "hour(ts)": ("ts", "hour", False),
}
NATIVE = {
    ("month", True): "date_trunc('month', {})",
    ("year", True): "date_trunc('year', {})",
    ("quarter", True): "date_trunc('quarter', {})",
    ("week", True): "date_trunc('week', {})",
    ("day", True): "date_trunc('day', {})",
    ("dow", False): "dayofweek({})",
    ("month", False): "month({})",
    ("year", False): "year({})",
    ("quarter", False): "quarter({})",
    ("hour", False): "hour({})",
}
"""DuckDB's own functions: the oracle."""


@pytest.mark.parametrize("text", sorted(KEYS))
def test_calendar_keys_are_recognised_in_every_spelling(text: str) -> None:
    shape = analyze(parse(f"SELECT {text} AS k, COUNT(*) AS n FROM t GROUP BY 1"), CATALOG)
    ((name, expression),) = shape.virtual.items()
    key = calendar.calendar_of(expression)
    assert key == calendar.CalendarKey(*KEYS[text])
    assert shape.types[name] == (
        "BIGINT" if not key.truncate else "DATE" if key.column == "d" else "TIMESTAMP"
    )


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT date_trunc('month', s) AS k, COUNT(*) FROM t GROUP BY 1", "'s' is VARCHAR"),
        ("SELECT EXTRACT(dow FROM tz) AS k, COUNT(*) FROM t GROUP BY 1", "without time zone"),
        ("SELECT date_trunc('minute', ts) AS k, COUNT(*) FROM t GROUP BY 1", "calendar keys"),
        ("SELECT EXTRACT(epoch FROM ts) AS k, COUNT(*) FROM t GROUP BY 1", "calendar keys"),
        ("SELECT date_trunc('month', ts + INTERVAL 1 DAY) AS k, COUNT(*) FROM t GROUP BY 1",
         "calendar keys"),
    ],
)
def test_other_calendar_expressions_are_refused(sql: str, message: str) -> None:
    with pytest.raises(UnsupportedQueryError, match=message):
        analyze(parse(sql), CATALOG)


_instants = st.datetimes(min_value=dt.datetime(1, 1, 8), max_value=dt.datetime(9999, 12, 24))


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    st.sampled_from(sorted(NATIVE)),
    st.sampled_from(["DATE", "TIMESTAMP"]),
    st.lists(_instants, min_size=3, max_size=3),
)
def test_each_rows_key_is_duckdbs_own_function_of_the_clamped_value(
    part: tuple[str, bool], type_name: str, instants: list
) -> None:
    texts = [i.isoformat(sep=" ")[: 10 if type_name == "DATE" else None] for i in instants]
    low, high = sorted(texts[:2])  # ISO text sorts as time does (years 0001-9999)
    low, high, value = (f"CAST('{t}' AS {type_name})" for t in (low, high, texts[2]))
    key = calendar.CalendarKey("v", part[0], part[1])
    ours = calendar.run(key, low, high, type_name, value)
    theirs = NATIVE[part].format(f"LEAST(GREATEST({value}, {low}), {high})")
    if part[1] and type_name == "DATE":
        theirs = f"CAST({theirs} AS DATE)"
    null = calendar.run(key, low, high, type_name, f"CAST(NULL AS {type_name})")
    connection = duckdb.connect()
    try:
        got, want, missing = connection.execute(f"SELECT {ours}, {theirs}, {null}").fetchone()
    finally:
        connection.close()
    assert got == want
    assert missing is None
