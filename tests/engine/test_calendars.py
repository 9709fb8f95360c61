"""Calendar bounds and keys (``dpsql.engine.calendars``), decided by the database.

* A key's domain is the set of values DuckDB's own function takes over the clamped range (every
  day, or every hour, between the bounds), for random bounds from the year 1 to 9999, and more
  than 10,000 keys are refused.
* DATE and TIMESTAMP bounds are converted by the database when the policy is set: a bound that is
  no date, a low bound after the high one, dates on a number or numbers on a date are refused.
* Answers: each released group holds the rows DuckDB puts there once the column is clamped to
  its bounds (rows outside the bounds count at the nearer bound, NULL rows nowhere).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql.engine.backends import DuckDBBackend
from dpsql.engine.calendars import calendar_domain
from dpsql.engine.literals import Binder
from dpsql.engine.session import set_policy
from dpsql.errors import PolicyError
from dpsql.sql.calendar import PARTS, TRUNC_UNITS, CalendarKey
from tests.conftest import make_database, seeded_connect

NATIVE = {
    **{(u, True): f"date_trunc('{u}', {{}})" for u in TRUNC_UNITS},
    ("dow", False): "dayofweek({})",
    ("month", False): "month({})",
    ("year", False): "year({})",
    ("quarter", False): "quarter({})",
    ("hour", False): "hour({})",
}
assert {p for p, t in NATIVE if not t} == set(PARTS)


@pytest.fixture(scope="module")
def binder() -> Binder:
    return Binder(DuckDBBackend(None), {})


def _native_domain(part: tuple[str, bool], low: str, high: str, type_name: str) -> list[str]:
    """DuckDB's own function over every day (DATE) or hour (TIMESTAMP) of the range, and the
    high bound itself: every value the clamped column can take lies in one of those periods."""
    step = "INTERVAL 1 DAY" if type_name == "DATE" else "INTERVAL 1 HOUR"
    function = NATIVE[part].format("CAST(v AS " + type_name + ")")
    if part[1] and type_name == "DATE":
        function = f"CAST({function} AS DATE)"
    sql = (
        f"SELECT DISTINCT CAST({function} AS VARCHAR) AS k FROM (SELECT UNNEST(generate_series("
        f"CAST('{low}' AS TIMESTAMP), CAST('{high}' AS TIMESTAMP), {step})) AS v UNION ALL "
        f"SELECT CAST('{high}' AS TIMESTAMP)) ORDER BY k"
    )
    connection = duckdb.connect()
    try:
        return [k for (k,) in connection.execute(sql).fetchall()]
    finally:
        connection.close()


def _ranges() -> st.SearchStrategy[tuple[dt.datetime, dt.datetime]]:
    start = st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 1, 1))
    length = st.one_of(
        st.timedeltas(min_value=dt.timedelta(0), max_value=dt.timedelta(days=3)),
        st.timedeltas(min_value=dt.timedelta(0), max_value=dt.timedelta(days=400)),
        st.timedeltas(min_value=dt.timedelta(0), max_value=dt.timedelta(days=4000)),
    )
    return st.builds(lambda s, d: (s, min(s + d, dt.datetime(9999, 12, 31))), start, length)


@settings(max_examples=120, deadline=None, derandomize=True, database=None)
@given(st.sampled_from(sorted(NATIVE)), st.sampled_from(["DATE", "TIMESTAMP"]), _ranges())
def test_the_domain_is_duckdbs_own_function_over_the_clamped_range(
    binder: Binder, part: tuple[str, bool], type_name: str, bounds: tuple[dt.datetime, dt.datetime]
) -> None:
    low, high = (b.isoformat(sep=" ")[: 10 if type_name == "DATE" else 19] for b in bounds)
    if type_name == "TIMESTAMP" and (bounds[1] - bounds[0]).days > 500:
        high = (bounds[0] + dt.timedelta(days=500)).isoformat(sep=" ")[:19]  # hours to list
    want = _native_domain(part, low, high, type_name)
    key = CalendarKey("v", part[0], part[1])
    if len(want) > 10_000:
        with pytest.raises(PolicyError, match="at most 10000"):
            calendar_domain(binder, key, (low, high), type_name)
        return
    got = calendar_domain(binder, key, (low, high), type_name)
    assert sorted(str(k) for k in got) == want
    assert list(got) == sorted(got)  # in order: numbers, or ISO text (years 0001-9999)


def test_more_than_ten_thousand_keys_are_refused(binder: Binder) -> None:
    key = CalendarKey("v", "day", True)
    with pytest.raises(PolicyError, match=r"gives 10958 groups \(at most 10000\)"):
        calendar_domain(binder, key, ("2000-01-01", "2029-12-31"), "DATE")
    assert len(calendar_domain(binder, key, ("2000-01-01", "2027-05-18"), "DATE")) == 10_000


POLICY = """
[dataset]
epsilon = 1e9
[analysts.a]
epsilon = 1e9
[tables.t]
privacy_unit = "u"
max_rows_per_unit = 10
max_groups_per_unit = 10
max_rows_per_group = 10
"""


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(6)
    rows = 4000
    start = np.datetime64("2024-10-01T00:00:00")
    seconds = rng.integers(0, 600 * 86_400, rows)  # 2024-10-01 .. 2026-05-24: beyond the bounds
    ts = start + seconds.astype("timedelta64[s]")
    frame = pd.DataFrame({"u": np.arange(rows) // 4, "ts": ts, "x": rng.uniform(0, 10, rows)})
    frame.loc[frame.index % 37 == 0, "ts"] = None
    policy = POLICY + (
        '[tables.t.columns.d]\nbounds = ["2025-01-01", "2025-12-31"]\n'
        '[tables.t.columns.ts]\nbounds = ["2025-01-01", "2025-12-31 23:59:59"]\n'
        "[tables.t.columns.x]\nbounds = [0, 10]\n"
    )
    database = tmp_path_factory.mktemp("calendars") / "t.duckdb"
    connection = duckdb.connect(str(database))
    connection.register("frame", frame)
    connection.execute("CREATE TABLE t AS SELECT u, ts, CAST(ts AS DATE) AS d, x FROM frame")
    connection.close()
    set_policy(database, policy)
    return database


@pytest.mark.parametrize(
    ("key", "clamped"),
    [
        ("date_trunc('month', d)", "date_trunc('month', {})::DATE"),
        ("EXTRACT(dow FROM ts)", "dayofweek({})"),
        ("quarter(d)", "quarter({})"),
        ("hour(ts)", "hour({})"),
        ("date_trunc('week', ts)", "date_trunc('week', {})"),
    ],
)
def test_groups_hold_the_rows_of_the_clamped_column(events: Path, key: str, clamped: str) -> None:
    column = "ts" if "ts" in key else "d"
    low, high = ("DATE '2025-01-01'", "DATE '2025-12-31'") if column == "d" else (
        "TIMESTAMP '2025-01-01'", "TIMESTAMP '2025-12-31 23:59:59'")
    truth_sql = (
        f"SELECT CAST({clamped.format(f'LEAST(GREATEST({column}, {low}), {high})')} AS VARCHAR) "
        f"AS k, COUNT(*) FROM t WHERE {column} IS NOT NULL GROUP BY k"
    )
    connection = duckdb.connect(str(events), read_only=True)
    want = dict(connection.execute(truth_sql).fetchall())
    connection.close()
    with seeded_connect(events, analyst="a", rng=np.random.default_rng(1)) as session:
        result = session.execute(
            f"SELECT {key} AS k, COUNT(*) AS n FROM t GROUP BY 1", epsilon=1e6
        )
    # A midnight TIMESTAMP key prints as its date after post-processing (GROUP BY 1).
    want = {str(k).removesuffix(" 00:00:00"): n for k, n in want.items()}
    got = {str(k): n for k, n in result.rows}
    assert set(want) <= set(got)  # every key the rows take is in the public domain
    assert got == pytest.approx({k: want.get(k, 0) for k in got}, abs=0.5)
    assert sum(got.values()) == pytest.approx(sum(want.values()), abs=0.5 * len(got))


def test_a_calendar_key_without_bounds_is_refused_before_the_charge(tmp_path: Path) -> None:
    frame = pd.DataFrame({"u": [1, 2], "d": pd.to_datetime(["2025-01-01", "2025-02-01"]).date})
    database = make_database(tmp_path / "t.duckdb", {"t": frame}, POLICY)
    with seeded_connect(database, analyst="a", rng=np.random.default_rng(1)) as session:
        with pytest.raises(PolicyError, match=r"needs the bounds of 'd': set \[tables\.t\.columns"):
            session.execute("SELECT month(d) AS m, COUNT(*) AS n FROM t GROUP BY 1", epsilon=1)
        assert session.budget().for_analyst("a").epsilon_spent == 0


@pytest.mark.parametrize(
    ("column", "bounds", "message"),
    [
        ("d", '["2025-02-30", "2025-12-31"]', "not exactly a value of type DATE"),
        ("d", '["2025-12-31", "2025-01-01"]', "is after high"),
        ("d", '["2025/01/01", "2025-12-31"]', "not a DATE literal"),
        ("d", '["2025-01-01", "2025-12-31 12:00"]', "not a DATE literal"),
        ("ts", '["2025-01-01 25:00", "2025-12-31"]', "not exactly a value of type TIMESTAMP"),
        ("x", '["2025-01-01", "2025-12-31"]', "need a DATE or TIMESTAMP column"),
        ("tz", '["2025-01-01 00:00+00", "2025-12-31 00:00+00"]', "without time zone"),
        ("d", "[0, 10]", "need a numeric column"),
        ("d", '["2025-01-01", 10]', "invalid policy"),
    ],
)
def test_calendar_bounds_are_checked_by_the_database_when_the_policy_is_set(
    tmp_path: Path, column: str, bounds: str, message: str
) -> None:
    path = tmp_path / "t.duckdb"
    connection = duckdb.connect(str(path))
    connection.execute(
        "CREATE TABLE t (u BIGINT, d DATE, ts TIMESTAMP, tz TIMESTAMP WITH TIME ZONE, x DOUBLE)"
    )
    connection.close()
    with pytest.raises(PolicyError, match=message):
        set_policy(path, POLICY + f"[tables.t.columns.{column}]\nbounds = {bounds}\n")


def test_calendar_bounds_of_each_temporal_type_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "t.duckdb"
    connection = duckdb.connect(str(path))
    connection.execute("CREATE TABLE t (u BIGINT, d DATE, ts TIMESTAMP, ms TIMESTAMP_MS)")
    connection.close()
    set_policy(
        path,
        POLICY
        + '[tables.t.columns.d]\nbounds = ["0001-01-01", "9999-12-31"]\n'
        + '[tables.t.columns.ts]\nbounds = ["2025-01-01", "2025-01-01 00:00:00.5"]\n'
        + '[tables.t.columns.ms]\nbounds = ["2025-01-01 10:00", "2025-01-01 10:00:00.001"]\n',
    )


def test_a_stream_over_a_date_column_takes_its_policy_bounds(events: Path) -> None:
    with seeded_connect(events, analyst="a", rng=np.random.default_rng(2)) as session:
        stream = session.open_stream("t", [("d", 7)], epsilon=1.0, mechanism="range_tree")
    (column,) = stream["columns"]
    assert column["bounds"] == ["2025-01-01", "2025-12-31"]
    assert stream["cells"] == 53  # 365 days in cells of 7
