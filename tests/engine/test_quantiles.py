"""Quantiles end to end: MEDIAN, quantile_cont and percentile_cont on the panel, compared with
DuckDB's own quantile at a very high epsilon (where permute-and-flip picks the best grid point);
refusals that charge nothing; and the bounded histogram on neighbouring databases (one person
moves it by at most the policy's row bound, the raw histogram by all their rows: the twin)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from dpsql.engine.planner import key_literal
from dpsql.engine.plans.quantiles import QUANTILE_WEIGHT
from dpsql.errors import ParameterError, PolicyError, UnsupportedQueryError
from dpsql.sql.generate import Bounds, Histogram, bounded_aggregate
from dpsql.sql.shape import ColumnKind
from tests.conftest import make_database, seeded_connect
from tests.engine.panel import POLICY, build_panel, panel_frame, truth

HIGH = 1e6
STEP = {"hours": 4000 / 1023, "wage": 40 / 1023}


@pytest.fixture(scope="module")
def panel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_panel(tmp_path_factory.mktemp("quantiles"))


def _answer(panel: Path, sql: str, seed: int = 1):
    with seeded_connect(panel, analyst="a", rng=np.random.default_rng(seed)) as session:
        return session.execute(sql, epsilon=HIGH)


def _rank_is_right(values: list[float], q: float, released: float, step: float) -> bool:
    """At a very high ε permute-and-flip picks a grid point whose rank is closest to q·n: the
    rows below ``released`` are q·n up to the rows within a grid step of it (ties between order
    statistics make any point between them equally good, so DuckDB's interpolated value is
    not the only right answer)."""
    data = np.asarray(values, dtype=float)
    below = int(np.sum(data < released))
    near = int(np.sum(np.abs(data - released) <= step))
    return abs(below - q * len(data)) <= near + 1


@pytest.mark.parametrize(
    ("sql", "oracle", "q", "column"),
    [
        ("SELECT MEDIAN(hours) AS m FROM males", "SELECT hours FROM males", 0.5, "hours"),
        (
            "SELECT quantile_cont(wage, 0.9) AS p FROM males",
            "SELECT wage FROM males",
            0.9,
            "wage",
        ),
        (
            "SELECT percentile_cont(0.25) WITHIN GROUP (ORDER BY hours) AS p FROM males",
            "SELECT hours FROM males",
            0.25,
            "hours",
        ),
        (
            "SELECT percentile_cont(0.1) WITHIN GROUP (ORDER BY wage DESC) AS p FROM males",
            "SELECT wage FROM males",
            0.9,
            "wage",
        ),
        (
            "SELECT MEDIAN(wage) FILTER (WHERE \"union\" = 'yes') AS m FROM males",
            "SELECT wage FROM males WHERE \"union\" = 'yes'",
            0.5,
            "wage",
        ),
    ],
)
def test_quantile_matches_duckdb_at_high_epsilon(
    panel: Path, sql: str, oracle: str, q: float, column: str
) -> None:
    result = _answer(panel, sql)
    ((released,),) = result.rows
    values = [v for (v,) in truth(panel, oracle)]
    assert _rank_is_right(values, q, released, STEP[column])
    # and DuckDB's own quantile is close (the panel is dense on the grid)
    ((expected,),) = truth(panel, f"SELECT quantile_cont(x, {q}) FROM ({oracle}) AS t(x)")
    assert abs(released - expected) <= 0.01 * (40 if column == "wage" else 4000)
    assert result.mechanism == "permute_and_flip"
    # The interval is the chosen public bin, around the released midpoint
    ((low, high),) = result.intervals[result.columns[0]]
    assert low < released < high
    assert high - low == pytest.approx(STEP[column] * 1023 / 1024)
    statement = result.details["intervals"][result.columns[0]]
    assert statement["kind"] == "conservative" and "rank" in statement["covers"]
    (details,) = result.details["quantiles"]
    assert details["candidates"] == 1024 and details["rank_sensitivity"] == 8


def test_grouped_median_over_public_keys(panel: Path) -> None:
    sql = "SELECT year, MEDIAN(wage) AS m FROM males GROUP BY year ORDER BY year"
    result = _answer(panel, sql)
    assert [r[0] for r in result.rows] == list(range(1980, 1988))
    for year, released in result.rows:
        values = [v for (v,) in truth(panel, f"SELECT wage FROM males WHERE year = {year}")]
        assert _rank_is_right(values, 0.5, released, STEP["wage"])
    assert "quantile of wage clamped to [0, 40]" in result.measures["m"]


def test_several_quantiles_split_epsilon(panel: Path) -> None:
    sql = "SELECT MEDIAN(hours) AS m, quantile_cont(hours, 0.9) AS p FROM males"
    with seeded_connect(panel, analyst="a", rng=np.random.default_rng(2)) as session:
        plan = session.explain(sql, epsilon=1.0)["plan"]
        result = session.execute(sql, epsilon=HIGH)
    assert [q["epsilon"] for q in plan["quantiles"]] == [0.5, 0.5]
    assert plan["mechanism"] == "permute_and_flip"
    ((median, p90),) = result.rows
    values = [v for (v,) in truth(panel, "SELECT hours FROM males")]
    assert _rank_is_right(values, 0.5, median, STEP["hours"])
    assert _rank_is_right(values, 0.9, p90, STEP["hours"])


def test_explain_names_mechanism_grid_sensitivity_and_bound(panel: Path) -> None:
    sql = (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(quantile_candidates=256) "
        "quantile_cont(wage, 0.9) FROM males"
    )
    with seeded_connect(panel, analyst="a", rng=np.random.default_rng(3)) as session:
        plan = session.explain(sql, epsilon=1.0)["plan"]
    (quantile,) = plan["quantiles"]
    assert quantile["candidates"] == 256
    assert quantile["rank_sensitivity"] == 8
    assert quantile["q"] == "9/10"
    assert quantile["rank_error_with_probability_0.95"] == pytest.approx(
        2 * 0.9 * 8 / 1.0 * np.log(256 / 0.05)
    )
    assert "permute-and-flip" in plan["reason"]


@pytest.mark.parametrize(
    ("sql", "error", "message"),
    [
        ("SELECT MEDIAN(year) FROM males", PolicyError, "needs declared bounds"),
        ("SELECT quantile_cont(hours, 1.5) FROM males", UnsupportedQueryError, "in [0, 1]"),
        ("SELECT quantile_cont(hours, -0.5) FROM males", UnsupportedQueryError, "in [0, 1]"),
        ("SELECT MEDIAN(hours), COUNT(*) FROM males", UnsupportedQueryError, "separate query"),
        ("SELECT quantile_disc(hours, 0.5) FROM males", UnsupportedQueryError, "quantile_cont"),
        ("SELECT MAX(hours) FROM males", UnsupportedQueryError, "quantile_cont(col, 0.99)"),
        (
            "SELECT ethn, MEDIAN(hours) FROM males GROUP BY ethn HAVING COUNT(*) > 3",
            UnsupportedQueryError,
            "",
        ),
        (
            "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(quantile_candidates=1) MEDIAN(hours) "
            "FROM males",
            ParameterError,
            "quantile_candidates",
        ),
    ],
)
def test_refusals_charge_nothing(panel: Path, sql: str, error: type, message: str) -> None:
    with seeded_connect(panel, analyst="a", rng=np.random.default_rng(4)) as session:
        before = session.budget().for_analyst("a").epsilon_spent
        with pytest.raises(error) as caught:
            session.execute(sql, epsilon=1.0)
        assert message in str(caught.value)
        assert session.budget().for_analyst("a").epsilon_spent == before


CAPPED = POLICY.replace("max_rows_per_unit = 8", "max_rows_per_unit = 2")


def _histogram(database: Path, *, bounded: bool, grouped: bool = False) -> pd.Series:
    """The bounded histogram dpsql reads for MEDIAN(hours) (or, for the twin, DuckDB's raw
    histogram over the same bins), indexed by bin (and year when ``grouped``)."""
    histogram = Histogram("hours", 0.0, 4000.0, 64, QUANTILE_WEIGHT)
    connection = duckdb.connect(str(database), read_only=True)
    try:
        if bounded:
            from dpsql.sql.analyze import analyze
            from dpsql.sql.parse import parse

            catalog = {
                "males": {
                    name: type_name
                    for name, type_name, *_ in connection.execute("DESCRIBE males").fetchall()
                }
            }
            text = "SELECT year, MEDIAN(hours) FROM males GROUP BY year" if grouped else (
                "SELECT MEDIAN(hours) FROM males"
            )
            shape = analyze(parse(text), catalog)
            years = [key_literal(y, ColumnKind.INTEGER, "year")[1] for y in range(1980, 1988)]
            sql = bounded_aggregate(
                shape,
                measures=[],
                bounds=Bounds("nr", 8, 8, 2),
                public_keys={"year": years} if grouped else {},
                salt=11,
                histogram=histogram,
            )
            frame = connection.execute(sql).df()
            index = ["year", "__bin"] if grouped else ["__bin"]
            return frame.set_index(index)["m0"].astype("int64")
        step = 4000.0 / 63
        frame = connection.execute(
            f"SELECT LEAST(CAST(FLOOR(hours / {step}) AS BIGINT), 63) AS b, "
            f"COUNT(*) * {QUANTILE_WEIGHT} AS m0 FROM males GROUP BY b"
        ).df()
        return frame.set_index("b")["m0"].astype("int64")
    finally:
        connection.close()


@pytest.fixture(scope="module")
def neighbours(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("quantile_neighbours")
    frame = panel_frame(persons=60, seed=5)
    extra = frame[frame["nr"] == 0].assign(nr=10_000)
    with_person = pd.concat([frame, extra], ignore_index=True)
    return (
        make_database(directory / "without.duckdb", {"males": frame}, CAPPED),
        make_database(directory / "with.duckdb", {"males": with_person}, CAPPED),
    )


def _moved(first: pd.Series, second: pd.Series) -> int:
    both = pd.concat([first, second], axis=1).fillna(0)
    return int((both.iloc[:, 1] - both.iloc[:, 0]).abs().sum())


def test_one_person_moves_the_bounded_histogram_by_at_most_the_row_bound(
    neighbours: tuple[Path, Path],
) -> None:
    without, with_person = (_histogram(db, bounded=True) for db in neighbours)
    assert 0 < _moved(without, with_person) <= 2 * QUANTILE_WEIGHT


def test_one_person_moves_the_grouped_histograms_by_at_most_the_row_bound_in_all(
    neighbours: tuple[Path, Path],
) -> None:
    """Over GROUP BY year the person's 8 rows (one per year) weigh at most max_rows_per_unit = 2
    rows in all groups together: the L1 bound the per-group utilities' ε-split rests on."""
    without, with_person = (_histogram(db, bounded=True, grouped=True) for db in neighbours)
    assert 0 < _moved(without, with_person) <= 2 * QUANTILE_WEIGHT


def test_the_raw_histogram_twin_moves_by_every_row_of_the_person(
    neighbours: tuple[Path, Path],
) -> None:
    without, with_person = (_histogram(db, bounded=False) for db in neighbours)
    assert _moved(without, with_person) == 8 * QUANTILE_WEIGHT > 2 * QUANTILE_WEIGHT


def test_an_epsilon_too_small_for_the_exact_sampler_is_refused_before_the_charge(
    panel: Path,
) -> None:
    with seeded_connect(panel, analyst="a", rng=np.random.default_rng(6)) as session:
        before = session.budget().for_analyst("a").epsilon_spent
        with pytest.raises(ParameterError, match="too small for a quantile"):
            session.execute("SELECT quantile_cont(hours, 0.000001) FROM males", epsilon=1e-9)
        assert session.budget().for_analyst("a").epsilon_spent == before


def test_bounds_whose_width_overflows_are_refused_before_the_charge(tmp_path: Path) -> None:
    """``high - low`` = inf would make every bin index NaN, failing in the database after the
    charge; the planner refuses such bounds first."""
    policy = POLICY.replace("bounds = [0, 4000]", "bounds = [-1.7e308, 1.7e308]")
    database = make_database(tmp_path / "wide.duckdb", {"males": panel_frame(persons=5)}, policy)
    with seeded_connect(database, analyst="a", rng=np.random.default_rng(7)) as session:
        with pytest.raises(PolicyError, match="too wide for a quantile"):
            session.execute("SELECT MEDIAN(hours) FROM males", epsilon=1.0)
        assert session.budget().for_analyst("a").epsilon_spent == 0
