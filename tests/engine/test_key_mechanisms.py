"""The default key-release mechanism, its names, and weighted selection end to end."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dpsql.engine.key_mechanisms import candidates, choose_default
from dpsql.engine.policy import parse_policy
from dpsql.mechanisms import (
    adaptive_selection,
    gaussian_threshold,
    joint_selection,
    threshold,
    weighted_selection,
)
from dpsql.sql.analyze import analyze
from dpsql.sql.exclusion import without_keys
from dpsql.sql.generate import Bounds, Measure, MeasureKind, bounded_aggregate
from dpsql.sql.parse import parse
from tests.conftest import make_database, seeded_connect

POLICY = """
[dataset]
epsilon = 100.0
delta = 1e-4
[analysts.a]
epsilon = 100.0
delta = 1e-4
[tables.visits]
privacy_unit = "user_id"
max_groups_per_unit = 10
max_rows_per_group = 1
max_rows_per_unit = 10
"""


def zipf_visits(users: int, seed: int = 3) -> pd.DataFrame:
    """The benchmark's shape, smaller: users with 1-10 distinct URLs each, Zipf(1) URLs."""
    rng = np.random.default_rng(seed)
    per_user = rng.integers(1, 11, users)
    ranks = np.arange(1, 20_001)
    ids = rng.choice(ranks.size, size=per_user.sum(), p=(1 / ranks) / np.sum(1 / ranks))
    frame = pd.DataFrame({"user_id": np.repeat(np.arange(users), per_user), "url": ids})
    frame = frame.drop_duplicates()
    frame["url"] = "/p/" + frame["url"].astype(str)
    return frame


def _expected_keys(frame: pd.DataFrame, epsilon: float, delta: float) -> dict[str, float]:
    """Analytic expected released keys per mechanism on ``frame`` (normal approximation)."""
    bounds = threshold.Contribution(10, 1, 10)
    counts = frame.groupby("url").size().to_numpy()
    laplace_tau = threshold.tau_for_delta(
        epsilon=epsilon, delta=delta, max_groups_per_unit=10, max_rows_per_group=1,
        max_rows_per_unit=10,
    )  # fmt: skip
    rule = threshold.ThresholdRule(
        laplace_tau,
        threshold.noise_scale_for(epsilon=epsilon, max_groups_per_unit=10, max_rows_per_group=1),
    )
    gauss = gaussian_threshold.plan(epsilon, delta, bounds)
    weighted = weighted_selection.plan(epsilon, delta, bounds)
    per_user = frame.groupby("user_id").size()
    unit_weight = np.array(weighted.weights)[frame["user_id"].map(per_user).to_numpy() - 1]
    key_weights = pd.Series(unit_weight).groupby(frame["url"].to_numpy()).sum().to_numpy()
    share = choose_default(epsilon, delta, bounds).selection_share or 0.2
    joint = joint_selection.plan(epsilon, delta, bounds, share)
    counted = frame.groupby("url").size().reindex(
        pd.Series(unit_weight).groupby(frame["url"].to_numpy()).sum().index
    )
    statistic = key_weights + joint.multiplier * counted.to_numpy()
    spread = np.sqrt(float(joint.selection_sigma_squared) + joint.multiplier**2 * float(
        joint.count_sigma_squared
    ))
    return {
        "mad2r": _expected_mad2r(frame, epsilon, delta),
        "threshold": float(sum(rule.release_probability(int(c)) for c in counts)),
        "threshold_gaussian": float(stats.norm.sf((gauss.tau - 0.5 - counts) / gauss.sigma).sum()),
        "weighted": float(
            stats.norm.sf((weighted.tau - 0.5 - key_weights) / weighted.selection_sigma).sum()
        ),
        "joint": float(stats.norm.sf((joint.tau - 0.5 - statistic) / spread).sum()),
    }


def _expected_mad2r(frame: pd.DataFrame, epsilon: float, delta: float) -> float:
    """mad2r's expected released keys: round 1 drawn (2 draws, Gaussian noise), round 2 in
    expectation given it."""
    chosen = adaptive_selection.plan(epsilon, delta, threshold.Contribution(10, 1, 10))
    rng = np.random.default_rng(0)
    per_user = frame.groupby("user_id").size()
    unit_weight = np.array(chosen.weights)[frame["user_id"].map(per_user).to_numpy() - 1]
    weights = pd.Series(unit_weight).groupby(frame["url"].to_numpy()).sum()
    totals = []
    for _ in range(2):
        noisy = weights + rng.normal(0, chosen.first_sigma, weights.size)
        first = weights.index[noisy >= chosen.first_tau].to_numpy()
        _, second = adaptive_selection.second_round_weights(
            frame["user_id"].to_numpy(), frame["url"].to_numpy(), first, chosen.weights
        )
        tail = stats.norm.sf((chosen.tau - 0.5 - second) / chosen.selection_sigma).sum()
        totals.append(first.size + tail)
    return float(np.mean(totals))


def test_the_default_releases_the_most_keys_its_count_error_allows() -> None:
    """The choice uses no data. On the benchmark's shape, ``prefer='keys'`` is the mechanism
    with the most expected keys; the default, the one with the most among those whose count
    error is within 1.3x the best; ``prefer='counts'``, the best count error."""
    frame = zipf_visits(200_000)
    bounds = threshold.Contribution(10, 1, 10)
    for epsilon in (0.5, 1.0, 2.0):
        expected = _expected_keys(frame, epsilon, 1e-6)
        found = {c.mechanism: c for c in candidates(epsilon, 1e-6, bounds)}
        best = min(found[n].count_error for n in ("threshold", "threshold_gaussian"))
        allowed = {n: k for n, k in expected.items() if found[n].count_error <= 1.3 * best}
        assert set(allowed) == {"threshold", "threshold_gaussian", "joint"}
        assert choose_default(epsilon, 1e-6, bounds).mechanism == max(allowed, key=allowed.get)
        assert choose_default(epsilon, 1e-6, bounds, "keys").mechanism == max(
            expected, key=expected.get
        )
        assert choose_default(epsilon, 1e-6, bounds, "counts").mechanism == "threshold"


def test_weights_summed_in_sql_are_each_persons_bounded_weights(tmp_path: Path) -> None:
    frame = zipf_visits(3_000, seed=5)
    extra = pd.DataFrame({"user_id": 10**6, "url": [f"/many/{i}" for i in range(25)]})
    frame = pd.concat([frame, extra], ignore_index=True)
    policy = parse_policy(POLICY)
    shape = analyze(
        parse("SELECT url, COUNT(*) FROM visits GROUP BY url"),
        {"visits": {"user_id": "BIGINT", "url": "VARCHAR"}},
    )
    assert shape is not None and policy is not None
    weights = weighted_selection.unit_weights(10)
    sql = bounded_aggregate(
        shape,
        measures=[Measure("m0", MeasureKind.ROWS, None)],
        bounds=Bounds("user_id", 10, 1, 10, None),
        public_keys={},
        salt=7,
        weights=weights,
    )
    con = duckdb.connect()
    con.register("visits", frame)
    out = con.execute(sql).df().set_index("url")
    ordinary = frame[frame.user_id != 10**6]
    per_user = ordinary.groupby("user_id").size()
    expected = (
        pd.Series(np.array(weights)[ordinary["user_id"].map(per_user).to_numpy() - 1])
        .groupby(ordinary["url"].to_numpy())
        .sum()
    )
    assert (out.loc[expected.index, "weight"] == expected).all()
    many = out.loc[out.index.str.startswith("/many/"), "weight"]
    assert many.size == 10 and (many == weights[9]).all()  # 25 keys: 10 kept, w_10 each
    assert many.size * weights[9] ** 2 <= weighted_selection.WEIGHT_SCALE**2


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("threshold", "threshold"),
        ("threshold_laplace", "threshold"),
        ("threshold_gaussian", "threshold_gaussian"),
        ("weighted", "weighted"),
        ("mad2r", "mad2r"),
        ("joint", "joint"),
        ("alp", "combined"),
    ],
)
def test_every_mechanism_name_releases_the_heavy_keys(tmp_path: Path, name, shown) -> None:
    frame = zipf_visits(20_000, seed=8)
    database = make_database(tmp_path / "v.duckdb", {"visits": frame}, POLICY)
    sql = (
        f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-6, mechanism='{name}') "
        "url, COUNT(*) AS n FROM visits GROUP BY url"
    )
    with seeded_connect(database, analyst="a", rng=np.random.default_rng(2)) as db:
        explained = db.explain(sql)
        result = db.execute(sql)
    truth = frame.groupby("url").size()
    assert result.mechanism == shown == explained["plan"]["mechanism"]
    assert result.noise_scale["n"] == explained["plan"]["key_release"]["noise_scale"]
    released = dict(result.rows)
    assert set(truth.nlargest(5).index) <= set(released)
    errors = [abs(released[k] - truth[k]) for k in released]
    assert np.mean(errors) < 4 * result.noise_scale["n"]
    for (key, value), (low, high) in zip(result.rows, result.intervals["n"], strict=True):
        assert low <= value <= high and key in truth.index


def test_explain_says_which_default_and_why(tmp_path: Path) -> None:
    database = make_database(tmp_path / "v.duckdb", {"visits": zipf_visits(2_000)}, POLICY)
    sql = (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-6{}) url, COUNT(*) "
        "FROM visits GROUP BY url"
    )
    with seeded_connect(database, analyst="a", rng=np.random.default_rng(2)) as db:
        plan = db.explain(sql.format(""))
        keys = db.explain(sql.format(", prefer='keys'"))
        counts = db.explain(sql.format(", prefer='counts'"))
    release = plan["plan"]["key_release"]
    assert plan["plan"]["mechanism"] == "joint"
    assert all(name in release["default_choice"] for name in ("threshold_gaussian", "joint"))
    assert "count error" in release["default_choice"]
    assert release["selection"]["noise_delta"] + release["selection"]["threshold_delta"] <= 1e-6
    assert keys["plan"]["mechanism"] == "mad2r"
    shown = keys["plan"]["key_release"]
    assert all(
        name in shown["default_choice"]
        for name in ("threshold_gaussian", "weighted", "mad2r", "mad2r_worst")
    )
    assert "round 1" in shown["selection"]["rounds"]
    assert counts["plan"]["mechanism"] == "threshold"
    # Every mechanism in persons, the chosen one's own numbers beside them.
    table = release["mechanisms"]
    assert set(table) == {"threshold", "threshold_gaussian", "joint", "weighted", "mad2r"}
    for name, row in table.items():
        half = row["persons_released_half_the_time"]
        assert 1 <= half < row["persons_released_with_probability_0.95"] < 300, name
    assert release["persons_released_half_the_time"] == table["joint"][
        "persons_released_half_the_time"
    ]
    assert release["reference_person"] == "5 keys, adding 1 rows to the key"
    # mad2r's τ is in weight units (thousands); its persons are tens.
    assert shown["tau"] > 1000 > 10 * shown["persons_released_half_the_time"]


@pytest.mark.parametrize("mechanism", ["joint", "weighted", "threshold_gaussian"])
def test_persons_stated_are_released_at_the_stated_rates(mechanism: str) -> None:
    """Keys held by N persons with 5 keys each (one row each): released at least half the time
    at the stated N, less than half the time one person fewer; at least 95% at the stated N95."""
    bounds = threshold.Contribution(10, 1, 10)
    (row,) = [c for c in candidates(1.0, 1e-6, bounds) if c.mechanism == mechanism]
    half = row.persons_released_with_probability(0.5, 5, 1)
    high = row.persons_released_with_probability(0.95, 5, 1)
    weight = weighted_selection.unit_weights(10)[4]
    trials, rng = 4_000, np.random.Generator(np.random.PCG64(3))
    rates = {}
    for persons in (half - 1, half, high):
        keys = np.arange(trials)
        counts = np.full(trials, persons)
        if mechanism == "threshold_gaussian":
            out = gaussian_threshold.release(
                keys, counts, epsilon=1.0, delta=1e-6, bounds=bounds, rng=rng
            )
        else:
            module = joint_selection if mechanism == "joint" else weighted_selection
            out = module.release(
                keys, counts, counts * weight, epsilon=1.0, delta=1e-6, bounds=bounds, rng=rng,
                selection_share=row.selection_share,
            )  # fmt: skip
        rates[persons] = out.keys.size / trials
    margin = 3 * np.sqrt(0.25 / trials)
    assert rates[half] >= 0.5 - margin and rates[half - 1] < 0.5 + margin, rates
    assert rates[high] >= 0.95 - 3 * np.sqrt(0.05 * 0.95 / trials), rates


def test_delta_zero_refuses_gaussian_mechanisms(tmp_path: Path) -> None:
    from dpsql.errors import UnsupportedQueryError

    database = make_database(tmp_path / "v.duckdb", {"visits": zipf_visits(500)}, POLICY)
    with seeded_connect(database, analyst="a", rng=np.random.default_rng(2)) as db:
        for name in ("threshold_gaussian", "weighted", "mad2r", "joint"):
            with pytest.raises(UnsupportedQueryError, match="needs delta > 0"):
                db.explain(
                    "SELECT url, COUNT(*) FROM visits GROUP BY url",
                    epsilon=1,
                    delta=0,
                    mechanism=name,
                )


def test_round_two_sql_weights_are_each_persons_weights_outside_round_one(tmp_path: Path) -> None:
    """The engine's round 2 (round 1's SQL without the found keys, same salt) sums the weights
    ``adaptive_selection.second_round_weights`` gives; a person with 25 keys re-chooses 10 among
    the rest, still of L2 norm at most W."""
    frame = zipf_visits(3_000, seed=5)
    extra = pd.DataFrame({"user_id": 10**6, "url": [f"/many/{i}" for i in range(25)]})
    frame = pd.concat([frame, extra], ignore_index=True)
    shape = analyze(
        parse("SELECT url, COUNT(*) FROM visits GROUP BY url"),
        {"visits": {"user_id": "BIGINT", "url": "VARCHAR"}},
    )
    weights = weighted_selection.unit_weights(10)
    counts = frame.groupby("url").size()
    found = [*counts.nlargest(30).index, "/many/0", "/many/1", "/many/2"]
    sql = bounded_aggregate(
        without_keys(shape, "url", found),
        measures=[],
        bounds=Bounds("user_id", 10, 1, 10, None),
        public_keys={},
        salt=7,
        weights=weights,
    )
    con = duckdb.connect()
    con.register("visits", frame)
    out = con.execute(sql).df().set_index("url")["weight"]
    ordinary = frame[frame.user_id != 10**6]
    keys, expected = adaptive_selection.second_round_weights(
        ordinary["user_id"].to_numpy(), ordinary["url"].to_numpy(), np.array(found), weights
    )
    assert not set(found) & set(out.index)
    assert (out.loc[keys].to_numpy() == expected).all()
    many = out.loc[out.index.str.startswith("/many/")]
    assert many.size == 10 and (many == weights[9]).all()


def test_mad_is_refused_with_the_reason(tmp_path: Path) -> None:
    from dpsql.errors import ParameterError

    database = make_database(tmp_path / "v.duckdb", {"visits": zipf_visits(300)}, POLICY)
    with (
        seeded_connect(database, analyst="a", rng=np.random.default_rng(2)) as db,
        pytest.raises(ParameterError, match=r"one-round MAD.*use 'mad2r'"),
    ):
        db.explain(
            "SELECT url, COUNT(*) FROM visits GROUP BY url", epsilon=1, delta=1e-6, mechanism="mad"
        )


def test_the_selection_share_is_an_option_of_weighted_only(tmp_path: Path) -> None:
    from dpsql.errors import ParameterError

    database = make_database(tmp_path / "v.duckdb", {"visits": zipf_visits(500)}, POLICY)
    sql = (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-6, mechanism='{}', "
        "selection_share=0.6) url, COUNT(*) FROM visits GROUP BY url"
    )
    with seeded_connect(database, analyst="a", rng=np.random.default_rng(2)) as db:
        plan = db.explain(sql.format("weighted"))["plan"]["key_release"]
        with pytest.raises(ParameterError, match="selection_share applies to mechanism"):
            db.explain(sql.format("threshold"))
    assert plan["selection"]["selection_share_of_rho"] == 0.6
    default = weighted_selection.plan(1.0, 1e-6, threshold.Contribution(10, 1, 10))
    assert plan["selection"]["count_sigma"] < default.count_sigma  # more of ρ to the counts


def test_zcdp_composition_admits_more_gaussian_queries_and_budget_names_it(tmp_path: Path) -> None:
    policy = POLICY.replace("epsilon = 100.0", "epsilon = 10.0").replace(
        "delta = 1e-4\n[analysts",
        'delta = 1e-4\ncomposition = "zcdp"\nadvanced_delta = 1e-6\n[analysts',
    )
    database = make_database(tmp_path / "v.duckdb", {"visits": zipf_visits(300)}, policy)
    sql = "SELECT url, COUNT(*) FROM visits GROUP BY url"
    with seeded_connect(database, analyst="a", rng=np.random.default_rng(2)) as db:
        for _ in range(25):  # 25 × (ε = 1, δ = 1e-6): basic composition would stop at 10
            db.execute(sql, epsilon=1.0, delta=1e-6, mechanism="threshold_gaussian")
        report = db.budget()
    assert report.dataset.rule == "zcdp" and report.dataset.epsilon_spent < 10.0


@pytest.mark.parametrize("share", ["1.5", "0", "-0.2"])
def test_a_bad_selection_share_is_refused_before_any_charge(tmp_path: Path, share: str) -> None:
    from dpsql.engine.session import database_ledger
    from dpsql.errors import ParameterError

    database = make_database(tmp_path / "v.duckdb", {"visits": zipf_visits(300)}, POLICY)
    sql = (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-6, mechanism='weighted', "
        f"selection_share={share}) url, COUNT(*) FROM visits GROUP BY url"
    )
    with (
        seeded_connect(database, analyst="a", rng=np.random.default_rng(2)) as db,
        pytest.raises(ParameterError, match="selection_share"),
    ):
        db.execute(sql)
    assert [e["kind"] for e in database_ledger(database)] == ["policy"]


def test_mad2r_records_both_rounds_and_the_counts_in_its_zcdp_curve(tmp_path: Path) -> None:
    from dpsql.engine.session import database_ledger

    database = make_database(tmp_path / "v.duckdb", {"visits": zipf_visits(300)}, POLICY)
    with seeded_connect(database, analyst="a", rng=np.random.default_rng(2)) as db:
        db.execute(
            "SELECT url, COUNT(*) FROM visits GROUP BY url",
            epsilon=1,
            delta=1e-6,
            mechanism="mad2r",
        )
    params = database_ledger(database)[-1]["payload"]["events"][0]["params"]
    chosen = adaptive_selection.plan(1.0, 1e-6, threshold.Contribution(10, 1, 10))
    rounds = sum(
        weighted_selection.WEIGHT_SCALE**2 / (2 * float(s))
        for s in (chosen.first_sigma_squared, chosen.selection_sigma_squared)
    )
    counts = 10 / (2 * float(chosen.count_sigma_squared))
    assert params["zcdp_rho"] == pytest.approx(rounds + counts, rel=1e-12)
    assert params["zcdp_delta"] == chosen.threshold_delta


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("prefer='most'", "prefer must be one of 'keys', 'counts', got 'most'"),
        ("prefer='keys', mechanism='threshold'", "mechanism 'threshold' is named"),
        ("prefer='keys', delta=0", "delta is 0|needs delta > 0"),
    ],
)
def test_a_bad_preference_is_refused_before_any_charge(
    tmp_path: Path, options: str, message: str
) -> None:
    from dpsql.engine.session import database_ledger
    from dpsql.errors import DpsqlError

    database = make_database(tmp_path / "v.duckdb", {"visits": zipf_visits(300)}, POLICY)
    sql = (
        f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-6, {options}) url, "
        "COUNT(*) FROM visits GROUP BY url"
    ).replace("delta=1e-6, prefer='keys', delta=0", "prefer='keys', delta=0")
    with (
        seeded_connect(database, analyst="a", rng=np.random.default_rng(2)) as db,
        pytest.raises(DpsqlError, match=message),
    ):
        db.execute(sql)
    assert [e["kind"] for e in database_ledger(database)] == ["policy"]


def test_prefer_on_a_query_releasing_no_keys_is_refused(tmp_path: Path) -> None:
    from dpsql.errors import ParameterError

    policy = POLICY + '[tables.visits.columns.url]\npublic_keys = ["/p/1", "/p/2"]\n'
    database = make_database(tmp_path / "v.duckdb", {"visits": zipf_visits(300)}, policy)
    sql = (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, prefer='counts') url, COUNT(*) "
        "FROM visits GROUP BY url"
    )
    with seeded_connect(database, analyst="a", rng=np.random.default_rng(2)) as db:
        with pytest.raises(ParameterError, match="this query has none"):
            db.explain(sql)
        assert db.ledger() == []


def test_prefer_moves_along_the_frontier(tmp_path: Path) -> None:
    """On the same data and seed: 'keys' releases more keys than the default, which releases
    more than 'counts'; the stated count noise goes the other way."""
    database = make_database(tmp_path / "v.duckdb", {"visits": zipf_visits(60_000)}, POLICY)
    released, noise = {}, {}
    for prefer in ("counts", None, "keys"):
        option = "" if prefer is None else f", prefer='{prefer}'"
        sql = (
            f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-6{option}) url, "
            "COUNT(*) AS n FROM visits GROUP BY url"
        )
        with seeded_connect(database, analyst="a", rng=np.random.default_rng(4)) as db:
            result = db.execute(sql)
        released[prefer], noise[prefer] = len(result.rows), result.noise_scale["n"]
    assert released["counts"] < released[None] < released["keys"], released
    assert noise["counts"] < noise[None] < noise["keys"], noise
