"""Neighbouring databases for two-column moments and calendar keys, against DuckDB.

The table and the checks are those of ``tests/privacy/test_neighbours.py`` (one more person,
whose values sit at every type's edge, or rows without a privacy unit), under a policy that also
bounds an INTEGER asymmetrically (``i`` in [-50, 10]), a DOUBLE (``dd`` in [0, 5]), a DATE and a
TIMESTAMP; the added person may also sit exactly at the date bounds. Hypothesis writes CORR,
COVAR_POP, COVAR_SAMP, REGR_SLOPE and REGR_INTERCEPT over bounded, unbounded, BOOLEAN and
privacy-unit columns, grouped or not (by public keys or calendar keys), nested in arithmetic;
and GROUP BY calendar keys of the DATE and TIMESTAMP columns. For every query:

1. the outcome is the same on both sides and nothing fails after the charge; the same keys are
   released; the exact aggregates move by at most each measurement's stated sensitivity (not at
   all for rows without a unit);
2. each sum's stated sensitivity is at least the contribution bound times the largest
   |expression| over the box of its columns' declared bounds (found by DuckDB at the box's
   corners: every moment component is a product of at most two columns, or a square).

Broken twins: a sum of products bounded by two corners of the box only (the per-row bound of
``i * dd`` would be 50, not 250) fails check 2; a calendar domain read from the data (the keys
the rows take) releases a key only the added person has.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import sqlglot
from hypothesis import given
from hypothesis import strategies as st
from sqlglot import exp

from dpsql.errors import DpsqlError
from dpsql.sql import calendar
from tests.conftest import seeded_connect
from tests.engine.test_moments import corner_bound
from tests.privacy.test_neighbours import (
    EDGES,
    POLICY,
    _create,
    _settings,
    check_neighbours,
)

BOUNDS = {"b": (-1000.0, 1000.0), "db": (0.0, 100.0), "i": (-50.0, 10.0), "dd": (0.0, 5.0)}
DATES = ("2024-01-03", "2024-01-10")
TIMES = ("2024-01-01 02:00:00", "2024-01-01 09:30:00")
EXTENDED = (
    POLICY
    + "[tables.w.columns.i]\nbounds = [-50, 10]\n[tables.w.columns.dd]\nbounds = [0, 5]\n"
    + f'[tables.w.columns.t]\nbounds = ["{DATES[0]}", "{DATES[1]}"]\n'
    + f'[tables.w.columns.ts]\nbounds = ["{TIMES[0]}", "{TIMES[1]}"]\n'
)
ROWS_PER_PERSON = 3
"""The most rows' worth one person adds to a sum: min(2 groups x 2 rows, 3 rows) = 3."""

PERSON_EDGES = {
    **EDGES,
    "t": [*EDGES["t"], f"DATE '{DATES[0]}'", f"DATE '{DATES[1]}'", "DATE '2024-01-02'"],
    "ts": [*EDGES["ts"], f"TIMESTAMP '{TIMES[0]}'", f"TIMESTAMP '{TIMES[1]}'"],
}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dpsql.engine.session import set_policy

    path = tmp_path_factory.mktemp("moments_calendar") / "w.duckdb"
    _create(path)
    set_policy(path, EXTENDED)
    return path


def people() -> st.SearchStrategy[tuple[dict[str, str], str, int]]:
    return st.tuples(
        st.fixed_dictionaries({n: st.sampled_from(v) for n, v in PERSON_EDGES.items()}),
        st.sampled_from(["1000", "NULL"]),
        st.integers(1, 3),
    )


STATISTICS = ["CORR", "COVAR_POP", "COVAR_SAMP", "REGR_SLOPE", "REGR_INTERCEPT"]
PAIRED = st.sampled_from(["b", "db", "i", "dd", "f"] * 5 + ["h", "u", "s"])
"""Bounded numbers and a BOOLEAN, 25 times in 28; otherwise an unbounded HUGEINT, the unit or a
VARCHAR (refused)."""
KEYS = [
    *(f"date_trunc('{u}', {c})" for u in calendar.TRUNC_UNITS for c in ("t", "ts")),
    *(f"EXTRACT({p} FROM {c})" for p in calendar.PARTS for c in ("t", "ts")),
    "year(t)", "month(ts)", "dayofweek(t)", "quarter(ts)", "hour(ts)",
    "date_trunc('month', s)",
]


def moment_queries() -> st.SearchStrategy[str]:
    statistic = st.builds(
        lambda f, a, b: f"{f}({a}, {b})", st.sampled_from(STATISTICS), PAIRED, PAIRED,
    )
    return st.one_of(
        st.builds(lambda m: f"SELECT {m} AS m FROM w", statistic),
        st.builds(lambda m: f"SELECT g, {m} AS m FROM w GROUP BY g", statistic),
        st.builds(lambda k, m: f"SELECT {k} AS k, {m} AS m FROM w GROUP BY 1",
                  st.sampled_from(KEYS), statistic),
        st.builds(lambda m, n: f"SELECT ROUND({m}, 3) AS m, {n} AS n FROM w WHERE b > 0",
                  statistic, statistic),
    )


def key_queries() -> st.SearchStrategy[str]:
    keys = st.sampled_from(KEYS)
    return st.one_of(
        st.builds(lambda k: f"SELECT {k} AS k, COUNT(*) AS n FROM w GROUP BY 1", keys),
        st.builds(lambda k, j: f"SELECT {k} AS k, {j} AS j, COUNT(*) AS n FROM w GROUP BY 1, 2",
                  keys, keys),
        st.builds(lambda k: f"SELECT {k} AS k, SUM(b) AS s, COUNT(DISTINCT u) AS p FROM w "
                  "GROUP BY 1", keys),
        st.builds(lambda k: f"SELECT g, {k} AS k, AVG(db) AS a FROM w WHERE t IS NOT NULL "
                  "GROUP BY 1, 2", keys),
    )


def _largest_over_the_box(text: str) -> float:
    """max |expression| over the box of its columns' declared bounds (BOOLEAN: [0, 1])."""
    names = {c.name for c in sqlglot.parse_one(text, read="duckdb").find_all(exp.Column)}
    return corner_bound(text, {n: BOUNDS.get(n, (0.0, 1.0)) for n in names})


def check_stated_bounds(base: Path, sql: str) -> None:
    """Check 2 of the module docstring, on the plan of an answered query."""
    with seeded_connect(base, analyst="a", rng=np.random.default_rng(3)) as db:
        try:
            plan = db.plan(sql, epsilon=1.0, delta=1e-6)
        except DpsqlError:
            return
    for measurement in plan.measurements:
        column = measurement.measure.column
        if measurement.measure.kind.value != "sum" or column not in plan.shape.virtual:
            continue
        text = plan.shape.virtual[column].meta["text"]
        stated = measurement.sensitivity_units * measurement.grid
        largest = _largest_over_the_box(text)
        assert stated >= ROWS_PER_PERSON * largest - 1e-9, ("understated", sql, text, stated)


def check(base: Path, directory: Path, sql: str, person: tuple) -> None:
    check_neighbours(base, directory, sql, person)
    check_stated_bounds(base, sql)


@pytest.mark.parametrize("queries", [moment_queries, key_queries], ids=lambda q: q.__name__)
def test_neighbours_agree_and_move_within_the_stated_sensitivity(
    base: Path, tmp_path: Path, queries: Callable[[], st.SearchStrategy[str]]
) -> None:
    @_settings()
    @given(queries(), people())
    def run(sql: str, person: tuple) -> None:
        check(base, tmp_path / "with", sql, person)

    run()


# --- the broken twins --------------------------------------------------------------------------

def _products_from_two_corners(node, bounds, kinds):
    """Twin: ``x * y`` bounded by [lx * ly, hx * hy] (two corners of the box only)."""
    from dpsql.sql.expressions import bounds_of

    if isinstance(node, exp.Mul):
        left = _products_from_two_corners(node.this, bounds, kinds)
        right = _products_from_two_corners(node.expression, bounds, kinds)
        if left is None or right is None:
            return None
        ends = (left[0] * right[0], left[1] * right[1])
        return (min(ends), max(ends))
    if isinstance(node, exp.Add):
        left = _products_from_two_corners(node.this, bounds, kinds)
        right = _products_from_two_corners(node.expression, bounds, kinds)
        if left is None or right is None:
            return None
        return (left[0] + right[0], left[1] + right[1])
    return bounds_of(node, bounds, kinds)


def _domain_read_from_the_data(key, low, high, column_type, count):
    """Twin: the keys the rows of the table take, instead of the bounded range's."""
    value = calendar._key_value(key, exp.column(key.column, quoted=True).sql(), column_type)
    return (
        f"SELECT DISTINCT CAST(__v AS VARCHAR) AS __key, __v AS __value FROM "
        f'(SELECT {value} AS __v FROM w WHERE "{key.column}" IS NOT NULL) AS __keys '
        "ORDER BY __value"
    )


TWINS = {
    "a sum of products bounded by two corners": (
        "understated", "dpsql.engine.virtual_columns.bounds_of", _products_from_two_corners,
        st.builds(lambda f, a, b: f"SELECT {f}({a}, {b}) AS m FROM w",
                  st.sampled_from(STATISTICS), st.just("i"), st.just("dd")),
    ),
    "a calendar domain read from the data": (
        "Right contains one more item",  # the neighbour releases one more key
        "dpsql.sql.calendar.candidates_sql",
        _domain_read_from_the_data,
        st.builds(lambda k: f"SELECT {k} AS k, COUNT(*) AS n FROM w GROUP BY 1",
                  st.sampled_from(["year(t)", "date_trunc('month', t)", "EXTRACT(hour FROM ts)",
                                   "date_trunc('day', ts)"])),
    ),
}


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_the_suite_catches_each_broken_twin(
    base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, twin: str
) -> None:
    caught, target, broken, queries = TWINS[twin]
    monkeypatch.setattr(target, broken)

    @_settings(20)
    @given(queries, people())
    def run(sql: str, person: tuple) -> None:
        check(base, tmp_path / "with", sql, person)

    with pytest.raises(AssertionError, match=caught):
        run()
