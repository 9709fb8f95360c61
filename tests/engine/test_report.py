"""Reports: pricing a batch without reading data, exact allocations, all-or-nothing charging."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql.accountant import periods
from dpsql.accountant.units import Cost
from dpsql.engine import report as report_module
from dpsql.engine.accuracy import plan_error
from dpsql.engine.allocation import least_units, split_units
from dpsql.engine.demo import DEMO_POLICY
from dpsql.engine.report import plan_report, run_report
from dpsql.engine.report_spec import parse_report_spec
from dpsql.engine.session import database_ledger, set_policy
from dpsql.errors import (
    FAILED_AFTER_CHARGE,
    BudgetExceededError,
    ExecutionError,
    ParameterError,
    UnsupportedQueryError,
)
from tests.conftest import seeded_connect

SPEC = """
title = "Monthly traffic"
epsilon = 1.0
allocation = "{rule}"

[queries.by_country]
sql = "SELECT country, COUNT(*) AS requests FROM requests GROUP BY country"
weight = 2
expected = 700
accuracy = 40

[queries.bytes_by_country]
sql = "SELECT country, SUM(bytes) AS bytes FROM requests GROUP BY country"
expected = 1e7
accuracy = 2e6
chart = "dot"

[queries.adults]
sql = "SELECT COUNT(*) AS adults FROM requests WHERE age BETWEEN 30 AND 50"
expected = 7000
accuracy = 300
format = "json"

[queries.latency]
sql = "SELECT status, AVG(latency_ms) AS mean_latency FROM requests GROUP BY status"
epsilon = 0.1
"""


def spec(rule: str = "weights", **replace: str):
    text = SPEC.format(rule=rule)
    for old, new in replace.items():
        text = text.replace(old, new)
    return parse_report_spec(text)


@given(
    total=st.integers(min_value=10**7, max_value=10**13),
    weights=st.lists(st.floats(min_value=1e-3, max_value=1e3), min_size=1, max_size=40),
)
@settings(max_examples=200, deadline=None)
def test_shares_sum_exactly_to_the_total_and_follow_the_weights(total, weights) -> None:
    shares = split_units(total, weights)
    assert sum(shares) == total
    whole = sum(weights)
    for share, weight in zip(shares, weights, strict=True):
        assert abs(share - total * weight / whole) < 1 + 1e-9 * total  # within one unit (+ float)


def test_least_units_is_the_least_that_meets() -> None:
    calls: list[int] = []

    def meets(units: int) -> bool:
        calls.append(units)
        return units >= 123_456_789

    assert least_units(meets, ceiling=10**12) == 123_456_789
    assert len(calls) < 100
    assert least_units(lambda u: False, ceiling=10**9) is None


def test_the_spec_refuses_unknown_keys_and_inconsistent_rules() -> None:
    with pytest.raises(ParameterError, match=r"unknown key 'queries.adults.acuracy'"):
        spec(**{"format = \"json\"": "acuracy = 3"})
    with pytest.raises(ParameterError, match="give epsilon"):
        parse_report_spec('title = "t"\n[queries.a]\nsql = "SELECT 1"\n')
    with pytest.raises(ParameterError, match="missing: q"):
        parse_report_spec('title = "t"\nallocation = "accuracy"\n[queries.q]\nsql = "SELECT 1"\n')


def test_weights_split_the_total_exactly_in_ledger_units(demo_db: Path, rng) -> None:
    with seeded_connect(demo_db, analyst="bob", rng=rng) as session:
        before = len(session.ledger_store.entries())
        plan = plan_report(session, spec())
        assert len(session.ledger_store.entries()) == before  # priced, not charged
    costs = {q.name: q.cost.epsilon_units for q in plan.queries}
    assert costs["latency"] == Cost.of(0.1).epsilon_units  # a fixed share
    assert plan.total.epsilon_units == Cost.of(1.0).epsilon_units  # exactly the total
    assert costs["by_country"] == 2 * costs["adults"] == 2 * costs["bytes_by_country"]
    assert not plan.shortfalls()


def test_minimax_equalises_relative_errors_and_beats_weights(demo_db: Path, rng) -> None:
    with seeded_connect(demo_db, analyst="bob", rng=rng) as session:
        plans = {rule: plan_report(session, spec(rule)) for rule in ("weights", "minimax")}
    relative = {
        rule: [
            plan_error(q.plan, None) / q.spec.expected
            for q in plan.queries
            if q.spec.epsilon is None
        ]
        for rule, plan in plans.items()
    }
    assert plans["minimax"].total == plans["weights"].total
    assert max(relative["minimax"]) < max(relative["weights"])
    assert max(relative["minimax"]) / min(relative["minimax"]) < 1.01  # equal up to rounding


def test_plans_show_relative_errors_and_the_minimax_driver(demo_db: Path, rng) -> None:
    """Each output's error relative to its expected value beside the absolute one; under
    minimax the query that takes the largest share is named, with the common relative error."""
    with seeded_connect(demo_db, analyst="bob", rng=rng) as session:
        plan = plan_report(session, spec("minimax"))
        weights = plan_report(session, spec("weights"))
    shown = plan.to_dict()
    by_name = {q["name"]: q for q in shown["queries"]}
    assert by_name["adults"]["relative_error"]["adults"] == pytest.approx(
        by_name["adults"]["expected_error"]["adults"] / 7000
    )
    assert by_name["latency"]["relative_error"] == {"mean_latency": None}  # no expected value
    driver = shown["minimax_driver"]
    biggest = max((q for q in plan.queries if q.spec.epsilon is None), key=lambda q: q.cost)
    assert driver["query"] == biggest.name
    assert driver["share_of_epsilon"] > 1 / 3
    assert driver["relative_error"] == pytest.approx(
        plan_error(biggest.plan, None) / biggest.spec.expected
    )
    assert biggest.name in driver["why"]
    assert weights.to_dict()["minimax_driver"] is None


def test_accuracy_gets_the_least_epsilon_meeting_each_target(demo_db: Path, rng) -> None:
    with seeded_connect(demo_db, analyst="bob", rng=rng) as session:
        plan = plan_report(session, spec("accuracy"))
        for q in plan.queries:
            if q.spec.accuracy is None:
                continue
            assert plan_error(q.plan, None) <= q.spec.accuracy
            one_less = Cost(q.cost.epsilon_units - 1).epsilon
            cheaper = session.plan(q.spec.sql, epsilon=one_less, delta=0.0)
            assert plan_error(cheaper, None) > q.spec.accuracy


def test_accuracy_is_refused_for_an_average(demo_db: Path, rng) -> None:
    text = spec("accuracy", **{"epsilon = 0.1\n": "accuracy = 5\n"})
    with (
        seeded_connect(demo_db, analyst="bob", rng=rng) as session,
        pytest.raises(ParameterError, match=r"'latency'.*depends on the data"),
    ):
        plan_report(session, text)


def test_a_refused_query_is_named_with_its_position(demo_db: Path, rng) -> None:
    bad = spec(**{"AVG(latency_ms)": "MAX(latency_ms)"})
    with (
        seeded_connect(demo_db, analyst="bob", rng=rng) as session,
        pytest.raises(UnsupportedQueryError, match=r"^query 'latency': .*line 1"),
    ):
        plan_report(session, bad)


def test_a_batch_that_does_not_fit_charges_nothing(demo_db: Path, rng, tmp_path: Path) -> None:
    big = spec(**{"epsilon = 1.0": "epsilon = 2.5"})
    with seeded_connect(demo_db, analyst="bob", rng=rng) as session:
        before = session.ledger_store.entries()
        plan = plan_report(session, big)
        assert plan.shortfalls() == [
            "analyst 'bob' has epsilon=2, delta=0 remaining: short by epsilon=0.5"
        ]
        with pytest.raises(BudgetExceededError, match=r"by epsilon=0\.5; nothing was charged"):
            run_report(session, big, tmp_path / "out")
        assert session.ledger_store.entries() == before
    assert not (tmp_path / "out").exists()


def test_a_failure_after_the_charge_is_recorded_once_with_one_message(
    demo_db: Path, rng, tmp_path: Path, monkeypatch
) -> None:
    with seeded_connect(demo_db, analyst="bob", rng=rng) as session:
        before = len(session.ledger_store.entries())
        answered = []

        def failing(plan, entry, context):
            answered.append(plan)
            if len(answered) == 2:
                raise RuntimeError("row-dependent detail that must not leak")
            return original(plan, entry, context)

        original = report_module.release_answer
        monkeypatch.setattr(report_module, "release_answer", failing)
        with pytest.raises(ExecutionError) as caught:
            run_report(session, spec(), tmp_path / "out")
        assert str(caught.value) == FAILED_AFTER_CHARGE
        assert caught.value.__context__ is None and caught.value.__cause__ is None
        entries = session.ledger_store.entries()
        assert len(entries) == before + 1
        assert entries[-1].cost == Cost.of(1.0) and entries[-1].mechanism == "report"
        assert session.budget().for_analyst("bob").epsilon_spent == 1.0
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out-*"))  # nothing half-written


def test_a_report_is_one_ledger_entry_and_writes_every_file(
    demo_db: Path, rng, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    with seeded_connect(demo_db, analyst="bob", rng=rng) as session:
        done = run_report(session, spec(), out)
    entries = database_ledger(demo_db, "bob")
    assert [e["seq"] for e in entries] == [done.ledger_entry["seq"]]
    (entry,) = entries
    assert entry["epsilon_units"] == Cost.of(1.0).epsilon_units
    assert len(entry["payload"]["events"]) == 4  # one subtree per query, sequential
    assert sorted(p.name for p in out.iterdir()) == [
        "adults.json", "by_country.csv", "bytes_by_country.csv", "latency.csv", "report.html",
        "results.json",
    ]  # fmt: skip
    document = json.loads((out / "results.json").read_text())
    assert document["ledger_entry"]["hash"] == entry["hash"]
    assert document["verify"]["verified"] is True
    for q in done.plan.queries:
        result = done.results[q.name]
        assert result.epsilon == q.cost.epsilon
        for column, error in q.errors.items():
            if error is None:
                continue
            raw = result.details.get("unclamped", {}).get(column) or [
                row[result.columns.index(column)] for row in result.rows
            ]
            for (low, high), value in zip(result.intervals[column], raw, strict=True):
                # counts and sums of non-negative values are clamped at 0 (and say so)
                assert high == pytest.approx(max(value + error, 0))
                assert low == pytest.approx(max(value - error, 0))
    html = (out / "report.html").read_text()
    assert html.count("<svg") == 4
    # self-contained: no script, stylesheet link or external resource, links stay in the page
    assert "<script" not in html and "<link" not in html and " src=" not in html
    assert set(re.findall(r'href="(.)', html)) == {"#"}
    assert entry["hash"] in html and "verified" in html


def test_an_existing_directory_is_refused_before_the_charge(
    demo_db: Path, rng, tmp_path: Path
) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    with seeded_connect(demo_db, analyst="bob", rng=rng) as session:
        with pytest.raises(ParameterError, match="exists and is not empty"):
            run_report(session, spec(), tmp_path / "out")
        assert session.budget().for_analyst("bob").epsilon_spent == 0


def test_a_report_states_the_budget_period_it_spent(demo_db: Path, rng, tmp_path: Path) -> None:
    monthly = DEMO_POLICY.replace("[dataset]\n", '[dataset]\nperiod = "month"\n')
    set_policy(demo_db, monthly)
    with seeded_connect(demo_db, analyst="bob", rng=rng) as session:
        month = session.ledger_store.current_period()
        assert month == periods.label("month", dt.datetime.now(dt.UTC))
        plan = plan_report(session, spec())
        assert plan.to_dict()["period"] == month
        run_report(session, spec(), tmp_path / "out")
        assert session.budget().for_analyst("bob").period == month
    document = json.loads((tmp_path / "out" / "results.json").read_text())
    assert document["period"] == document["ledger_entry"]["period"] == month
    assert f"budget period <b>{month}</b>" in (tmp_path / "out" / "report.html").read_text()


def test_a_simultaneous_query_is_priced_for_all_its_cells_before_the_charge(
    demo_db: Path, rng
) -> None:
    """``simultaneous = true`` (per query, or the report's default): each cell's level is split
    across the answer's cells before pricing, so meeting the same accuracy target for all five
    countries at once costs more; the plan says so, and the run's answer states the cell level."""
    text = SPEC.format(rule="accuracy").replace("weight = 2\n", "weight = 2\nsimultaneous = true\n")
    together, alone = parse_report_spec(text), spec("accuracy")
    with seeded_connect(demo_db, analyst="bob", rng=rng) as session:
        plans = {"together": plan_report(session, together), "alone": plan_report(session, alone)}
    by_name = {k: {q.name: q for q in p.queries} for k, p in plans.items()}
    joint, single = by_name["together"]["by_country"], by_name["alone"]["by_country"]
    assert joint.cost.epsilon_units > single.cost.epsilon_units
    assert plan_error(joint.plan, None) <= 40  # the target, at the cell level
    shown = joint.to_dict()["simultaneous"]
    assert shown["cells"] == 5 and shown["cell_confidence"] == pytest.approx(1 - 0.05 / 5)
    assert shown["confidence"] == pytest.approx(0.95)
    assert single.to_dict()["simultaneous"] is None
    assert by_name["together"]["adults"].cost == by_name["alone"]["adults"].cost  # untouched
    everything = parse_report_spec("simultaneous = true\n" + SPEC.format(rule="accuracy"))
    assert everything.simultaneous_for(everything.queries["adults"])
    refused = parse_report_spec(
        "simultaneous = true\n"
        + SPEC.format(rule="weights").replace(
            "SELECT COUNT(*) AS adults", "SELECT MEDIAN(latency_ms) AS adults", 1
        )
    )
    with (
        pytest.raises(ParameterError, match="simultaneous=true needs"),
        seeded_connect(demo_db, analyst="bob", rng=rng) as session,
    ):
        plan_report(session, refused)
