"""Accuracy-first queries: the least ε meeting ±accuracy, shown in EXPLAIN, charged, and met."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpsql.accountant.units import Cost
from dpsql.engine.accuracy import plan_error
from dpsql.errors import ParameterError
from dpsql.mechanisms.laplace import release_counts
from tests.conftest import make_database, seeded_connect

GROUPS = ["a", "b", "c", "d"]
TRUE = {"a": 400, "b": 300, "c": 200, "d": 100}
POLICY = """
[dataset]
epsilon = 100000.0
[analysts.ann]
epsilon = 100000.0
[tables.t]
privacy_unit = "uid"
max_groups_per_unit = 5
max_rows_per_group = 1
max_rows_per_unit = 5
[tables.t.columns.g]
public_keys = ["a", "b", "c", "d"]
[tables.t.columns.v]
bounds = [0, 10]
[tables.t.columns.w]
bounds = [0, 10]
"""
COUNT = "SELECT g, COUNT(*) AS n FROM t GROUP BY g"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    keys = np.repeat(GROUPS, [TRUE[g] for g in GROUPS])
    frame = pd.DataFrame(
        {"uid": np.arange(len(keys)), "g": keys, "v": 5.0, "w": 1.0}
    )  # one row per person: the bounded count is the plain count
    return make_database(tmp_path / "acc.duckdb", {"t": frame}, POLICY)


def test_explain_shows_the_least_epsilon_and_it_is_charged(db: Path, rng) -> None:
    with seeded_connect(db, analyst="ann", rng=rng) as session:
        shown = session.explain(COUNT, accuracy=50)
        plan = session.plan(COUNT, accuracy=50)
        assert shown["cost"]["epsilon"] == plan.epsilon
        assert shown["plan"]["accuracy"]["target"] == 50
        assert shown["expected_error"] == {"n": plan_error(plan, None)}
        assert plan_error(plan, None) <= 50
        one_unit_less = Cost(Cost.of(plan.epsilon).epsilon_units - 1).epsilon
        cheaper = session.plan(COUNT, epsilon=one_unit_less)
        assert plan_error(cheaper, None) > 50  # one ledger unit less misses the target
        result = session.execute(COUNT, accuracy=50)
        assert result.epsilon == plan.epsilon
        assert result.details["accuracy"]["expected_error"] == {"n": plan_error(plan, None)}
        assert all(hi - lo <= 100 for lo, hi in result.intervals["n"])
        (entry,) = [e for e in session.ledger() if e["kind"] == "charge"]
        assert entry["epsilon"] == plan.epsilon and entry["plan"]["accuracy"]["target"] == 50


def test_options_set_accuracy_and_confidence(db: Path, rng) -> None:
    sql = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(accuracy=20, confidence=0.9) " + COUNT[7:]
    with seeded_connect(db, analyst="ann", rng=rng) as session:
        result = session.execute(sql)
        at_95 = session.plan(COUNT, accuracy=20)
    assert result.confidence == 0.9
    assert result.details["accuracy"]["confidence"] == 0.9
    assert result.epsilon < at_95.epsilon  # a lower level needs less epsilon for ±20


@pytest.mark.parametrize(
    ("sql", "kwargs", "fragment"),
    [
        (COUNT, {"accuracy": 5, "epsilon": 1.0}, "not both"),
        ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, accuracy=5) " + COUNT[7:], {},
         "not both"),
        ("SELECT g, AVG(v) AS m FROM t GROUP BY g", {"accuracy": 1}, "depends on the data"),
        (COUNT, {"accuracy": -3}, "positive"),
        ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(accuracy=5, confidence=1.5) " + COUNT[7:], {},
         "confidence"),
    ],
)  # fmt: skip
def test_refusals_charge_nothing(db: Path, rng, sql, kwargs, fragment) -> None:
    with seeded_connect(db, analyst="ann", rng=rng) as session:
        with pytest.raises(ParameterError, match=fragment):
            session.execute(sql, **kwargs)
        assert session.ledger() == []


def test_a_target_beyond_the_allocation_is_refused_naming_what_it_would_take(
    demo_db: Path, rng
) -> None:
    with seeded_connect(demo_db, analyst="alice", rng=rng) as session:
        with pytest.raises(ParameterError, match=r"±0\.5 cannot be met: even epsilon=4 .* gives ±"):
            session.execute("SELECT COUNT(*) AS n FROM requests", accuracy=0.5)
        assert session.ledger() == []


def test_a_sum_target_is_met_in_the_sum_units(db: Path, rng) -> None:
    with seeded_connect(db, analyst="ann", rng=rng) as session:
        result = session.execute("SELECT g, SUM(v) AS s FROM t GROUP BY g", accuracy=25)
    assert all(hi - lo <= 50 for lo, hi in result.intervals["s"])


def _coverage(epsilon: float, sensitivity: int, target: float, rng, draws: int = 40_000) -> float:
    noise = release_counts(np.zeros(draws, dtype=np.int64), epsilon=epsilon,
                           sensitivity=sensitivity, rng=rng).values  # fmt: skip
    return float(np.mean(np.abs(noise) <= target))


def test_the_target_is_met_at_the_confidence_and_not_far_beyond(db: Path, rng) -> None:
    """40,000 draws of the noise the chosen plan adds: |noise| <= target with probability at
    least 0.95 (tolerance 4 sigma = 0.0044), and not much more (the epsilon is the least)."""
    with seeded_connect(db, analyst="ann", rng=rng) as session:
        plan = session.plan(COUNT, accuracy=50)
    (m,) = plan.measurements
    coverage = _coverage(m.epsilon, m.sensitivity_units, 50, rng)
    assert 0.95 - 0.0044 <= coverage <= 0.95 + 0.008


def test_a_twin_that_ignores_the_contribution_bound_misses_the_target(db: Path, rng) -> None:
    """The broken twin prices the target for one row per person (sensitivity 1) while the
    policy lets a person add 5 rows: its noise covers ±50 far less often than 95%."""
    with seeded_connect(db, analyst="ann", rng=rng) as session:
        plan = session.plan(COUNT, accuracy=50)
    (m,) = plan.measurements
    twin_epsilon = m.epsilon / m.sensitivity_units  # what sensitivity 1 would need
    assert _coverage(twin_epsilon, m.sensitivity_units, 50, rng) < 0.6


@pytest.mark.slow
def test_end_to_end_answers_are_within_the_target_at_the_confidence(db: Path, rng) -> None:
    """150 accuracy-first queries x 4 groups: |answer - true count| <= 30 in at least 92.3% of
    600 answers (0.95 less 3 sigma = 0.027; the 40,000-draw test above is the tight one)."""
    hits = []
    with seeded_connect(db, analyst="ann", rng=rng) as session:
        for _ in range(150):
            result = session.execute(COUNT, accuracy=30)
            hits += [abs(n - TRUE[g]) <= 30 for g, n in result.rows]
    assert np.mean(hits) >= 0.95 - 0.027


def _average_frame() -> pd.DataFrame:
    rng = np.random.default_rng(11)
    keys = np.repeat(GROUPS, [TRUE[g] for g in GROUPS])
    return pd.DataFrame(
        {"uid": np.arange(len(keys)), "g": keys, "v": rng.uniform(0, 10, len(keys)), "w": 1.0}
    )


def test_an_average_has_an_expected_error_from_a_public_count_guess(tmp_path: Path) -> None:
    """AVG with OPTIONS(expected_count=N): a numeric expected error in EXPLAIN; accuracy-first
    answers within the target in at least 90% of seeded runs when the count is at least N. The
    broken twin (the count's noise left out of the bound) states a smaller error that the
    answers miss more often."""
    from dpsql.engine.plans import base

    database = make_database(tmp_path / "avg.duckdb", {"t": _average_frame()}, POLICY)
    truth = float(_average_frame()["v"].mean())
    sql = (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(accuracy=0.25, expected_count=1000) "
        "AVG(v) AS m FROM t"
    )

    def hits(runs: int) -> tuple[float, float]:
        inside = 0
        for seed in range(runs):
            with seeded_connect(database, analyst="ann", rng=np.random.default_rng(seed)) as db:
                result = db.execute(sql)
            inside += abs(result.rows[0][0] - truth) <= 0.25
        with seeded_connect(database, analyst="ann", rng=np.random.default_rng(0)) as db:
            epsilon = db.explain(sql)["cost"]["epsilon"]
        return inside / runs, epsilon

    with seeded_connect(database, analyst="ann", rng=np.random.default_rng(0)) as db:
        shown = db.explain(sql)
    assert 0 < shown["expected_error"]["m"] <= 0.25
    covered, epsilon = hits(60)
    assert covered >= 0.9, covered
    original = base.average_error

    def without_the_count(plan, column, level):  # twin: pretends the count is exact
        sums = [m for m in plan.measurements if m.measure.kind.value == "sum"]
        total = next(m for m in sums if m.measure.column == column)
        half = float(base.interval_half_width(total.scale, (1 + level) / 2)) * total.grid
        return half / base.count_guess(plan)[0]

    try:
        base.average_error = without_the_count
        twin_covered, twin_epsilon = hits(60)
    finally:
        base.average_error = original
    assert twin_epsilon < epsilon and twin_covered < covered


def test_a_simultaneous_target_holds_for_the_whole_table(db: Path) -> None:
    """OPTIONS(simultaneous=true): every cell within ±accuracy at once in at least 90% of seeded
    runs (the per-cell level is split across the cells); the twin without it (each cell at the
    table's level) misses whole tables more often."""

    def whole_tables(options: str, runs: int = 80) -> float:
        sql = (
            f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS({options}) g, COUNT(*) AS n FROM t "
            "GROUP BY g"
        )
        met = 0
        for seed in range(runs):
            with seeded_connect(db, analyst="ann", rng=np.random.default_rng(seed)) as session:
                rows = session.execute(sql).rows
            met += all(abs(n - TRUE[g]) <= 10 for g, n in rows)
        return met / runs

    together = whole_tables("accuracy=10, simultaneous=true")
    apart = whole_tables("accuracy=10")
    assert together >= 0.9, together
    assert apart < together, (apart, together)
    with seeded_connect(db, analyst="ann", rng=np.random.default_rng(1)) as session:
        plan = session.explain(
            "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(accuracy=10, simultaneous=true) "
            "g, COUNT(*) AS n FROM t GROUP BY g"
        )["plan"]
    assert plan["simultaneous"]["cells"] == 4
    assert plan["simultaneous"]["cell_confidence"] == pytest.approx(1 - 0.05 / 4)


def test_simultaneous_targets_need_cells_known_before_the_data(db: Path) -> None:
    with (
        seeded_connect(db, analyst="ann", rng=np.random.default_rng(1)) as session,
        pytest.raises(ParameterError, match="cells are known"),
    ):
        session.explain(
            "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, simultaneous=true) "
            "MEDIAN(v) AS m FROM t"
        )
