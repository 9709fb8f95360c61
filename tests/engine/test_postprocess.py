"""Post-processing of released values (``dpsql.sql.postprocess``, ``dpsql.engine.derived``).

Every query of ``tests/sql/fixtures/postprocessed.sql`` is answered on a panel at a very high
epsilon and compared with DuckDB's own answer on the raw data: the rows match, each interval
covers the true value, derived columns are marked. Post-processing costs nothing more than the DP
query it post-processes, and reads the released answer only.
"""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import numpy as np
import pytest

from dpsql.engine.derived import post_processed
from dpsql.engine.results import QueryResult
from dpsql.errors import UnsupportedQueryError
from dpsql.sql.parse import parse
from dpsql.sql.postprocess import sandbox
from tests.conftest import released_answer, seeded_connect
from tests.engine.panel import build_panel, truth
from tests.sql.test_analyze import FIXTURES, Case, read_cases

CASES = [
    pytest.param(c, id=c.name)
    for name in ("postprocessed.sql", "filtered.sql", "aggregated.sql", "grouped.sql")
    for c in read_cases(FIXTURES / name)
]
EPSILON = 1e6


@pytest.fixture(scope="module")
def panel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_panel(tmp_path_factory.mktemp("panel"))


def _close(got: object, want: object) -> bool:
    if isinstance(want, float | int) and not isinstance(want, bool):
        if got is None:
            return False
        return math.isclose(float(got), float(want), rel_tol=1e-3, abs_tol=1e-3)
    return got == want


def _names(spec: str | None) -> set[str]:
    return {n.strip() for n in (spec or "").split(",") if n.strip()}


def test_fixture_file_is_substantial() -> None:
    assert len(CASES) >= 15


@pytest.mark.parametrize("case", CASES)
def test_post_processed_answers_match_duckdb_within_their_intervals(
    case: Case, panel: Path
) -> None:
    plain = case.headers.get("truth") or parse(case.query).expression.sql(dialect="duckdb")
    expected = truth(panel, plain)
    with seeded_connect(panel, analyst="a", rng=np.random.default_rng(3)) as session:
        epsilon = None if "DIFFERENTIAL_PRIVACY" in case.query else EPSILON
        result = session.execute(case.query, epsilon=epsilon)
    assert len(result.rows) == len(expected)
    assert set(result.intervals) == _names(case.headers.get("intervals"))
    released = [
        (row, {n: result.intervals[n][i] for n in result.intervals})
        for i, row in enumerate(result.rows)
    ]
    wanted = list(expected)
    if "ORDER BY" not in case.query.upper():
        released, wanted = sorted(released, key=lambda r: repr(r[0])), sorted(wanted, key=repr)
    for (got, intervals), want in zip(released, wanted, strict=True):
        assert all(_close(g, w) for g, w in zip(got, want, strict=True)), (got, want)
        for name, (low, high) in intervals.items():
            true_value = want[result.columns.index(name)]
            if true_value is None:  # LAG's first row: no value, no interval
                assert (low, high) == (None, None)
                continue
            assert low is not None and high is not None
            # At this epsilon a sum's interval is narrower than its randomised rounding to the
            # sum grid (about one grid step): allow a relative 1e-6 beyond it.
            slack = 1e-6 * abs(true_value) + 1e-2
            assert low - slack <= true_value <= high + slack, (name, low, true_value, high)
    assert set(result.details.get("post_processing", {}).get("derived", {})) == _names(
        case.headers.get("derived")
    )
    for name in _names(case.headers.get("derived")):
        assert result.measures[name].startswith("derived from released values")


def test_intervals_cover_the_truth_at_moderate_epsilon(panel: Path) -> None:
    """An exact interval image covers the true value as often as the released interval does."""
    sql = "SELECT year, COUNT(*) * 2 + 1 AS odd FROM males GROUP BY year ORDER BY year"
    want = dict(truth(panel, sql))
    covered = total = 0
    with seeded_connect(panel, analyst="a", rng=np.random.default_rng(11)) as session:
        for _ in range(25):
            result = session.execute(sql, epsilon=0.5)
            for (year, _odd), (low, high) in zip(result.rows, result.intervals["odd"], strict=True):
                covered += low <= want[year] <= high
                total += 1
    assert covered / total >= 0.9  # confidence 0.95 by default; 200 intervals


def test_derived_intervals_cover_the_truth_end_to_end(panel: Path) -> None:
    """A ratio, a difference of sums and a LAG difference answered by the session: each
    interval covers DuckDB's answer on the raw data (the panel's bounds cut nothing) in at least
    90% of 10 runs x 8 years (stated 95%; the ratio's is conservative), and says its kind."""
    sql = (
        "SELECT year, SUM(hours) / COUNT(*) AS mean, SUM(hours) - SUM(wage) AS gap, "
        "COUNT(*) - LAG(COUNT(*)) OVER (ORDER BY year) AS change FROM males GROUP BY year "
        "ORDER BY year"
    )
    want = truth(panel, sql)
    covered = {"mean": 0, "gap": 0, "change": 0}
    with seeded_connect(panel, analyst="a", rng=np.random.default_rng(12)) as session:
        for _ in range(10):
            result = session.execute(sql, epsilon=1.0)
            for name in covered:
                position = result.columns.index(name)
                for row, (low, high) in zip(want, result.intervals[name], strict=True):
                    true_value = row[position]
                    covered[name] += true_value is None or low <= true_value <= high
    kinds = {n: result.details["intervals"][n]["kind"] for n in covered}
    assert kinds == {"mean": "conservative", "gap": "exact", "change": "exact"}
    assert all(count / 80 >= 0.9 for count in covered.values()), covered


def test_post_processing_costs_nothing_more(panel: Path) -> None:
    with seeded_connect(panel, analyst="a", rng=np.random.default_rng(4)) as session:
        plain = session.explain("SELECT ethn, COUNT(*) AS n FROM males GROUP BY ethn", epsilon=1)
        post = session.explain(
            "SELECT ethn, COUNT(*) AS n, COUNT(*) * 2 AS twice FROM males GROUP BY ethn "
            "ORDER BY n DESC LIMIT 1",
            epsilon=1,
        )
        before = session.budget().for_analyst("a").epsilon_spent
        session.execute("SELECT ethn, COUNT(*) AS n FROM males GROUP BY 1 ORDER BY n", epsilon=1)
        spent = session.budget().for_analyst("a").epsilon_spent - before
    assert post["cost"] == plain["cost"]
    assert spent == pytest.approx(1.0)
    assert post["plan"]["post_processing"]["runs_on"].startswith("the released (noisy) answer")
    assert post["plan"]["post_processing"]["intervals"]["twice"].startswith("the image of")
    # Expected errors by the analyst's names: a copy keeps the released one, a computed none.
    assert post["expected_error"] == {"n": plain["expected_error"]["n"], "twice": None}


def test_refused_post_processing_charges_nothing(panel: Path) -> None:
    with seeded_connect(panel, analyst="a", rng=np.random.default_rng(5)) as session:
        before = session.budget().for_analyst("a").epsilon_spent
        for sql in (
            "SELECT year, COUNT(*) FROM males GROUP BY year ORDER BY hours",
            "SELECT COUNT(*) FROM males LIMIT (SELECT COUNT(*) FROM males)",
            "SELECT COUNT(*) || 'x' - 1 AS bad FROM males",
            "SELECT n FROM (SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1) COUNT(*) AS n "
            "FROM males) JOIN males ON true",
        ):
            with pytest.raises(UnsupportedQueryError):
                session.execute(sql, epsilon=None if "OPTIONS" in sql else 1)
        assert session.budget().for_analyst("a").epsilon_spent == before


def _released(rows: list[tuple], intervals: list[tuple]) -> QueryResult:
    return released_answer(
        ["__dp_g0", "__dp_a0"], rows, {"__dp_a0": intervals}, noise_scale={"__dp_a0": 1.0}
    )


def test_post_processing_reads_the_released_values_only() -> None:
    """The outer query sees exactly the released rows: change them and its answer follows."""
    from dpsql.sql.analyze import analyze

    catalog = {"males": {"nr": "BIGINT", "year": "INTEGER", "hours": "INTEGER"}}
    shape = analyze(
        parse("SELECT year, COUNT(*) * 10 AS c FROM males GROUP BY year ORDER BY c DESC"), catalog
    )
    post = shape.post
    first = post_processed(_released([(1, 5), (2, 7)], [(4, 6), (6, 8)]), post)
    assert first.rows == [(2, 70), (1, 50)]
    assert first.intervals == {"c": [(60, 80), (40, 60)]}
    second = post_processed(_released([(1, 9), (2, 7)], [(8, 10), (6, 8)]), post)
    assert second.rows == [(1, 90), (2, 70)]


def test_post_processing_never_returns_more_rows_than_were_released() -> None:
    """The backstop behind the function allow-list: an outer query that multiplied the released
    rows (here written past the allow-list, straight to the sandbox) fails instead of answering
    (after the charge, the session turns that into the one ExecutionError)."""
    from dpsql.engine.derived import _released as frame_of
    from dpsql.engine.derived import _run
    from dpsql.sql.analyze import analyze

    catalog = {"males": {"nr": "BIGINT", "year": "INTEGER", "hours": "INTEGER"}}
    post = analyze(
        parse("SELECT year, COUNT(*) AS c FROM males GROUP BY year ORDER BY c"), catalog
    ).post
    frame = frame_of(_released([(1, 5), (2, 7)], [(4, 6), (6, 8)]), post)
    _, rows = _run(post, frame, post.outer)
    assert len(rows) == 2
    with pytest.raises(ValueError, match="more than the 2 released rows"):
        _run(post, frame, "SELECT UNNEST(RANGE(1000)) FROM released")


def test_the_sandbox_reads_no_file(tmp_path: Path) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    connection = sandbox()
    try:
        with pytest.raises(duckdb.Error, match="disabled"):
            connection.execute(f"SELECT * FROM read_csv('{secret}')").fetchall()
        assert connection.execute("SELECT COUNT(*) FROM duckdb_tables()").fetchone() == (0,)
        with pytest.raises(duckdb.Error, match="locked"):
            connection.execute("SET enable_external_access = true")
    finally:
        connection.close()


def test_explain_shows_virtual_columns_and_post_processing(panel: Path) -> None:
    sql = (
        "SELECT FLOOR(hours / 1000) * 1000 AS band, "
        "SUM(CASE WHEN \"union\" = 'yes' THEN 1 ELSE 0 END) AS members "
        "FROM males GROUP BY band ORDER BY members DESC"
    )
    with seeded_connect(panel, analyst="a", rng=np.random.default_rng(6)) as session:
        plan = session.explain(sql, epsilon=1.0)["plan"]
    virtual = plan["virtual_columns"]
    assert any("FLOOR" in text and "4000.0" in text for text in virtual.values())
    assert any(text.startswith("CASE WHEN \"union\" = 'yes'") for text in virtual.values())
    assert plan["groups"] == 5
    assert plan["post_processing"]["intervals"] == {"members": "the released interval"}


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT ROUND(COUNT(*) * 1.5) AS x FROM males",
        "SELECT ethn, CAST(COUNT(*) AS DECIMAL(18, 3)) AS n FROM males GROUP BY ethn",
    ],
)
def test_post_processed_decimals_are_answered_not_failed_after_the_charge(
    panel: Path, sql: str
) -> None:
    """DECIMAL values from the sandbox could not be stored (JSON): every such query failed
    after its charge."""
    with seeded_connect(panel, analyst="a", rng=np.random.default_rng(6)) as session:
        result = session.execute(sql, epsilon=1)
    assert all(isinstance(row[-1], float) for row in result.rows)
