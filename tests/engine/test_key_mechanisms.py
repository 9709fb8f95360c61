"""The default key-release mechanism, its names, and weighted selection end to end."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dpsql.engine.key_mechanisms import choose_default
from dpsql.engine.policy import parse_policy
from dpsql.mechanisms import adaptive_selection, gaussian_threshold, threshold, weighted_selection
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
    return {
        "mad2r": _expected_mad2r(frame, epsilon, delta),
        "threshold": float(sum(rule.release_probability(int(c)) for c in counts)),
        "threshold_gaussian": float(stats.norm.sf((gauss.tau - 0.5 - counts) / gauss.sigma).sum()),
        "weighted": float(
            stats.norm.sf((weighted.tau - 0.5 - key_weights) / weighted.selection_sigma).sum()
        ),
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


def test_the_default_releases_the_most_keys_on_the_benchmarks_shape() -> None:
    """The choice uses no data; on the benchmark's shape it is the one with most expected keys."""
    frame = zipf_visits(200_000)
    for epsilon in (0.5, 1.0, 2.0):
        expected = _expected_keys(frame, epsilon, 1e-6)
        chosen = choose_default(epsilon, 1e-6, threshold.Contribution(10, 1, 10)).mechanism
        assert chosen == max(expected, key=expected.get)


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
    with seeded_connect(database, analyst="a", rng=np.random.default_rng(2)) as db:
        plan = db.explain("SELECT url, COUNT(*) FROM visits GROUP BY url", epsilon=1, delta=1e-6)
    release = plan["plan"]["key_release"]
    assert plan["plan"]["mechanism"] == "mad2r"
    assert all(
        name in release["default_choice"]
        for name in ("threshold_gaussian", "weighted", "mad2r", "mad2r_worst")
    )
    assert "round 1" in release["selection"]["rounds"]
    assert release["selection"]["noise_delta"] + release["selection"]["threshold_delta"] <= 1e-6


def test_delta_zero_refuses_gaussian_mechanisms(tmp_path: Path) -> None:
    from dpsql.errors import UnsupportedQueryError

    database = make_database(tmp_path / "v.duckdb", {"visits": zipf_visits(500)}, POLICY)
    with seeded_connect(database, analyst="a", rng=np.random.default_rng(2)) as db:
        for name in ("threshold_gaussian", "weighted", "mad2r"):
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
