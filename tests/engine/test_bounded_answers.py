"""Answers an analyst can trust when contribution bounds bind.

Each person keeps their own random groups (the bounded count of every group is an unbiased share),
the noise of a key release is the one EXPLAIN and the ledger record, and the intervals cover the
bounded quantity they name.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dpsql
from dpsql.engine.session import database_ledger
from tests.conftest import make_database, seeded_connect

PANEL_POLICY = """
[dataset]
epsilon = 1000.0
delta = 1e-3
[analysts.alice]
epsilon = 1000.0
delta = 1e-3
[tables.panel]
privacy_unit = "person"
max_groups_per_unit = {groups}
max_rows_per_group = {rows}
max_rows_per_unit = {per_unit}
[tables.panel.columns.year]
public_keys = [1980, 1981, 1982, 1983, 1984, 1985, 1986, 1987]
"""


def _panel(tmp_path: Path, persons: int, rows_per_year: int, groups: int, rows: int,
           per_unit: int) -> Path:
    """``persons`` persons, each with ``rows_per_year`` rows in each of 8 years; ``url`` takes
    8 values per person-year row (no public keys)."""
    person = np.repeat(np.arange(persons), 8 * rows_per_year)
    year = np.tile(np.repeat(np.arange(1980, 1988), rows_per_year), persons)
    url = np.array([f"/page{i % 8}" for i in range(person.size)], dtype=object)
    frame = pd.DataFrame({"person": person, "year": year, "url": url})
    policy = PANEL_POLICY.format(groups=groups, rows=rows, per_unit=per_unit)
    return make_database(tmp_path / "panel.duckdb", {"panel": frame}, policy)


# --- item 1: each person keeps their own groups ------------------------------------------------


def test_every_year_is_estimated_without_bias_when_one_group_per_person(tmp_path: Path) -> None:
    """545 persons × 8 years, max_groups_per_unit = 1: each year's count estimates 545/8 = 68.1
    (binomial sd 7.7, noise sd 1.4 at ε = 1); over 10 queries the mean per year is within 4 sd
    (2.5) of 68.1 and the 8 years sum to about 545. Before, one year got about 545 and the
    others about 0."""
    database = _panel(tmp_path, 545, 1, groups=1, rows=1, per_unit=1)
    sql = "SELECT year, COUNT(*) AS n FROM panel GROUP BY year"
    runs = []
    with seeded_connect(database, analyst="alice", rng=np.random.default_rng(17)) as db:
        for _ in range(10):
            runs.append([row[1] for row in db.execute(sql, epsilon=1.0).rows])
    counts = np.array(runs, dtype=float)
    assert np.all(np.abs(counts.mean(axis=0) - 545 / 8) < 4 * 7.8 / np.sqrt(10))
    assert np.all(counts > 30)
    assert abs(counts.sum(axis=1).mean() - 545) < 15


# --- item 3: the noise used is the noise recorded ----------------------------------------------


@pytest.mark.parametrize("mechanism", ["threshold", "alp"])
def test_key_release_noise_scale_is_the_one_explained_and_recorded(
    tmp_path: Path, mechanism: str
) -> None:
    """8 groups × 8 rows per group but 8 rows per person: Δ = min(64, 8) = 8, so at ε = 0.3 the
    threshold's noise scale is 26.67 (the combined structure's threshold gets the share of ε that
    ``sketch_split.choose`` picks from the sensitivity; here the sketch cannot beat answering 0,
    so 0.95 of it: 28.07)."""
    database = _panel(tmp_path, 1000, 1, groups=8, rows=8, per_unit=8)
    sql = "SELECT url, COUNT(*) AS n FROM panel GROUP BY url"
    with seeded_connect(database, analyst="alice", rng=np.random.default_rng(3)) as db:
        explained = db.explain(sql, epsilon=0.3, delta=1e-5, mechanism=mechanism)
        result = db.execute(sql, epsilon=0.3, delta=1e-5, mechanism=mechanism)
    release = explained["plan"]["key_release"]
    expected = 8 / 0.3 if mechanism == "threshold" else 8 / (0.95 * 0.3)
    assert release["noise_scale"] == pytest.approx(expected, rel=1e-6)
    assert release["l1_sensitivity"] == 8
    assert result.noise_scale["n"] == release["noise_scale"]
    assert explained["plan"]["measurements"][0]["noise_scale"] == release["noise_scale"]
    assert explained["plan"]["measurements"][0]["epsilon"] == release["threshold_epsilon"]
    if mechanism == "alp":
        assert release["sketch"]["threshold_share"] == 0.95
        assert release["sketch"]["sketch_beats_zero"] is False
        assert "CANNOT beat answering 0" in release["sketch"]["note"]
    entry = database_ledger(database)[-1]
    (leaf,) = entry["payload"]["events"]
    params = leaf["params"]
    assert params["noise_scale"] == release["noise_scale"]
    assert params["tau"] == release["tau"] == entry["plan"]["key_release"]["tau"]
    # τ is shown before anything is spent, with the smallest numbers of persons (4 rows to the
    # key each: half of L∞' = 8) whose key is released at 50% and 95%.
    assert release["reference_person"] == "4 keys, adding 4 rows to the key"
    assert release["persons_released_half_the_time"] == -(-release["tau"] // 4)
    assert 4 * release["persons_released_with_probability_0.95"] > release["tau"]
    # 8,000 rows, 1,000 per url and person-bounded counts of 1,000: τ (about 370 with Δ = 8; it
    # was about 2,800 with Δ = 64) lets every url through.
    if mechanism == "threshold":
        assert release["tau"] < 400
        assert sorted(row[0] for row in result.rows) == [f"/page{i}" for i in range(8)]


# --- item 2: intervals name and cover the bounded quantity -------------------------------------


def test_intervals_cover_the_bounded_quantity_they_name(tmp_path: Path) -> None:
    """300 persons × 3 rows in each of 8 years; at most 1 row per person per year (8 years per
    person, 8 rows in all): each year's bounded count is 300 while SQL's COUNT(*) is 900, and
    without GROUP BY (2 rows per person) it is 600 against 7,200. Over 200 seeded queries the
    95% intervals cover the bounded value at least 92% of the time (binomial sd 1.5%) and never
    the SQL answer; the answer says which quantity it measures."""
    database = _panel(tmp_path, 300, 3, groups=8, rows=1, per_unit=8)
    grouped, covered_grouped = "SELECT year, COUNT(*) AS n FROM panel GROUP BY year", []
    overall, covered_overall = "SELECT COUNT(*) AS n FROM panel", []
    with seeded_connect(database, analyst="alice", rng=np.random.default_rng(29)) as db:
        first = db.execute(grouped, epsilon=0.5)
        assert first.measures == {
            "n": "rows, at most 1 per person per group, in at most 8 groups per person"
        }
        for _ in range(25):
            result = db.execute(grouped, epsilon=0.5)
            covered_grouped += [low <= 300 <= high for low, high in result.intervals["n"]]
            assert not any(low <= 900 <= high for low, high in result.intervals["n"])
    narrow = tmp_path / "narrow"
    narrow.mkdir()
    database = _panel(narrow, 300, 3, groups=8, rows=1, per_unit=2)
    with seeded_connect(database, analyst="alice", rng=np.random.default_rng(31)) as db:
        for _ in range(200):
            result = db.execute(overall, epsilon=0.5)
            ((low, high),) = result.intervals["n"]
            covered_overall.append(low <= 600 <= high)
            assert not low <= 7200 <= high
        assert result.measures == {"n": "rows, at most 2 per person"}
        explained = db.explain(overall, epsilon=0.5)
        assert explained["plan"]["measures"] == result.measures
    assert np.mean(covered_grouped) >= 0.92 and np.mean(covered_overall) >= 0.92


# --- item 2: how much bounding cuts, and suggested bounds, privately ---------------------------


def test_contribution_report_counts_persons_over_each_bound_and_is_charged(
    tmp_path: Path,
) -> None:
    """545 persons × 8 years, 1 row each, bounds 1/1/1: every person is over the rows and groups
    bounds, none over rows per group. At ε = 2 (0.5 per count, noise sd 2.8) each count is within
    its interval, and the ledger charges ε = 2 under the analyst."""
    database = _panel(tmp_path, 545, 1, groups=1, rows=1, per_unit=1)
    with seeded_connect(database, analyst="alice", rng=np.random.default_rng(5)) as db:
        report = db.contributions("panel", group_by=["year"], epsilon=2.0)
        entries = db.ledger()
    truth = {
        "persons": 545,
        "persons over max_rows_per_unit": 545,
        "persons over max_groups_per_unit": 545,
        "persons over max_rows_per_group": 0,
    }
    for (label, value), (low, high) in zip(report.rows, report.intervals["persons"], strict=True):
        assert low <= truth[label] <= high and abs(value - truth[label]) < 20
    assert entries[-1]["query"] == "CONTRIBUTIONS FOR panel GROUP BY year"
    assert entries[-1]["epsilon"] == pytest.approx(2.0)
    assert report.epsilon == pytest.approx(2.0)


def test_suggested_bounds_cover_the_persons(tmp_path: Path) -> None:
    """300 persons with 3 rows in each of 8 years (24 rows, 8 groups, 3 per group): the smallest
    powers of two covering 95% are 32, 8 and 4."""
    database = _panel(tmp_path, 300, 3, groups=1, rows=1, per_unit=1)
    with seeded_connect(database, analyst="alice", rng=np.random.default_rng(6)) as db:
        out = db.contributions("panel", group_by=["year"], epsilon=1.0, suggest=True)
    assert out.details["suggested"] == {
        "max_rows_per_unit": 32,
        "max_groups_per_unit": 8,
        "max_rows_per_group": 4,
    }


@pytest.mark.parametrize(
    ("table", "changes", "message"),
    [
        ("nope", {}, "not covered by the privacy policy"),
        ("panel", {"group_by": ["missing"]}, "'missing' is not a column"),
        ("panel", {"coverage": 1.5}, "coverage must be in (0, 1)"),
        ("panel", {"epsilon": -1.0}, "epsilon"),
    ],
)
def test_bad_contribution_requests_charge_nothing(
    tmp_path: Path, table: str, changes: dict, message: str
) -> None:
    database = _panel(tmp_path, 10, 1, groups=1, rows=1, per_unit=1)
    with dpsql.connect(database, analyst="alice") as db:
        with pytest.raises(dpsql.DpsqlError, match=re.escape(message)):
            db.contributions(table, **changes)
        assert db.ledger() == []
