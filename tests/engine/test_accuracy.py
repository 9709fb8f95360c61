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
