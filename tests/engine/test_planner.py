"""Sensitivities and costs come from the shape and the policy only."""

from __future__ import annotations

import pytest

from dpsql.accountant.events import total
from dpsql.engine.planner import plan_query
from dpsql.engine.plans.keys import Keys
from dpsql.engine.policy import parse_policy
from dpsql.errors import ParameterError, PolicyError, UnsupportedQueryError
from dpsql.sql.analyze import analyze
from dpsql.sql.generate import MeasureKind
from dpsql.sql.parse import parse

POLICY = parse_policy("""
[dataset]
epsilon = 10.0
[analysts.a]
epsilon = 10.0
[tables.t]
privacy_unit = "u"
max_groups_per_unit = 3
max_rows_per_group = 2
max_rows_per_unit = 4
[tables.t.columns.x]
bounds = [-50, 200]
[tables.t.columns.g]
public_keys = ["a", "b"]
[tables.t.columns.h]
public_keys = [1, 2, 3]
""")
CATALOG = {
    "t": {
        "u": "BIGINT",
        "g": "VARCHAR",
        "h": "INTEGER",
        "x": "DOUBLE",
        "y": "DOUBLE",
        "k": "VARCHAR",
    }
}


def plan(sql: str, epsilon: float = 1.0):
    return plan_query(analyze(parse(sql), CATALOG), POLICY, epsilon=epsilon, delta=0.0)


def test_ungrouped_count_uses_rows_per_unit() -> None:
    (m,) = plan("SELECT COUNT(*) FROM t").measurements
    assert (m.measure.kind, m.sensitivity_units, m.epsilon) == (MeasureKind.ROWS, 4, 1.0)


def test_grouped_count_uses_the_smaller_of_l0_linf_and_rows_per_unit() -> None:
    (m,) = plan("SELECT g, COUNT(*) FROM t GROUP BY g").measurements
    assert m.sensitivity_units == min(3 * 2, 4)
    p = plan("SELECT g, h, COUNT(*) FROM t GROUP BY g, h")
    assert p.groups == 6 and p.key_domain == {"g": ("a", "b"), "h": (1, 2, 3)}


def test_sum_sensitivity_is_rows_times_largest_bound_in_grid_units() -> None:
    (m,) = plan("SELECT SUM(x) FROM t", epsilon=0.5).measurements
    assert m.sensitivity_units * m.grid >= 4 * 200
    assert m.sensitivity_units * m.grid <= 4 * (200 + m.grid)
    assert 2**10 <= float(m.scale) < 2**11 + 1  # noise scale in grid units
    assert m.grid == 2.0 ** round(__import__("math").log2(m.grid))


def test_avg_is_a_sum_and_a_count_and_epsilon_splits_exactly() -> None:
    p = plan("SELECT COUNT(*), AVG(x), SUM(x) FROM t", epsilon=1.0)
    labels = [m.label for m in p.measurements]
    assert labels == ["COUNT(*)", "SUM(x)", "COUNT(x) within bounds"]
    assert total(p.event).epsilon == 1.0
    assert sum(m.epsilon for m in p.measurements) == pytest.approx(1.0, abs=1e-12)


def test_refusals_name_what_the_policy_lacks() -> None:
    with pytest.raises(PolicyError, match=r"SUM\(y\) needs declared bounds"):
        plan("SELECT SUM(y) FROM t")
    with pytest.raises(UnsupportedQueryError, match="without public keys needs delta > 0"):
        plan("SELECT k, COUNT(*) FROM t GROUP BY k")
    with pytest.raises(UnsupportedQueryError, match="single GROUP BY column with COUNT"):
        plan("SELECT k, SUM(x) FROM t GROUP BY k")
    with pytest.raises(UnsupportedQueryError, match="cannot be released"):
        plan("SELECT x, COUNT(*) FROM t GROUP BY x")
    with pytest.raises(ParameterError, match="too small to split"):
        plan("SELECT COUNT(*), COUNT(x), SUM(x) FROM t", epsilon=2e-9)
    other = {"s": {"u": "BIGINT"}}
    with pytest.raises(PolicyError, match="not covered by the privacy policy"):
        plan_query(analyze(parse("SELECT COUNT(*) FROM s"), other), POLICY, epsilon=1, delta=0)


def test_keys_without_a_public_set_are_released_by_threshold_or_combined() -> None:
    def release(sql: str, delta: float, mechanism: str | None = None):
        shape = analyze(parse(sql), CATALOG)
        return plan_query(shape, POLICY, epsilon=1.0, delta=delta, mechanism=mechanism)

    approximate = release("SELECT k, COUNT(*) FROM t GROUP BY k", 1e-6, "threshold")
    assert approximate.mechanism == "threshold" and isinstance(approximate.family, Keys)
    default = release("SELECT k, COUNT(*) FROM t GROUP BY k", 1e-6)
    assert isinstance(default.family, Keys) and default.family.spec.default is not None
    assert default.mechanism == default.family.spec.default.mechanism
    assert total(approximate.event).delta == pytest.approx(1e-6)
    assert release("SELECT k, COUNT(*) FROM t GROUP BY k", 1e-6, "alp").mechanism == "combined"
    options = (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(mechanism='alp') k, COUNT(*) FROM t GROUP BY k"
    )
    assert release(options, 1e-6).mechanism == "combined"
    with pytest.raises(ParameterError, match="unknown mechanism 'magic'"):
        release("SELECT k, COUNT(*) FROM t GROUP BY k", 1e-6, "magic")
    with pytest.raises(UnsupportedQueryError, match="this query has none"):
        release("SELECT g, COUNT(*) FROM t GROUP BY g", 1e-6, "alp")


def test_a_group_by_under_a_smaller_row_bound_warns_that_it_counts_persons() -> None:
    """max_rows_per_group (2) < max_rows_per_unit (4): a GROUP BY says, before any data is read,
    that a key fixed per person counts persons, not rows; an ungrouped query does not; a
    partition column is known to be fixed per person."""
    (warning,) = plan("SELECT g, COUNT(*) FROM t GROUP BY g").warnings()
    assert "max_rows_per_group = 2 < max_rows_per_unit = 4" in warning
    assert "counts persons" in warning and "wherever g is the same" in warning
    assert plan("SELECT g, COUNT(*) FROM t GROUP BY g").summary()["warnings"] == [warning]
    assert plan("SELECT COUNT(*) FROM t").warnings() == []
    partitioned = parse_policy(
        POLICY.model_dump_json().replace('"partition_column":null', '"partition_column":"g"', 1)
    )
    shape = analyze(parse("SELECT g, COUNT(*) FROM t GROUP BY g"), CATALOG)
    (fixed,) = plan_query(shape, partitioned, epsilon=1.0, delta=0.0).warnings()
    assert "g is fixed per person (the table's partition column)" in fixed
    equal = parse_policy(
        POLICY.model_dump_json().replace('"max_rows_per_group":2', '"max_rows_per_group":4', 1)
    )
    assert plan_query(shape, equal, epsilon=1.0, delta=0.0).warnings() == []
