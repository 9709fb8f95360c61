"""End-to-end behaviour of sessions on real DuckDB files: answers, charges, refusals, accuracy."""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

import dpsql
from dpsql.engine.session import database_budget, database_ledger, set_policy
from dpsql.errors import (
    BudgetExceededError,
    ExecutionError,
    ParameterError,
    PolicyError,
    SchemaError,
    SqlSyntaxError,
    UnsupportedQueryError,
)
from tests.conftest import make_database, seeded_connect

BUCKETS = 200
STATS_POLICY = f"""
[dataset]
epsilon = 1000000.0
[analysts.tester]
epsilon = 1000000.0
[tables.events]
privacy_unit = "user_id"
max_groups_per_unit = 2
max_rows_per_group = 1
max_rows_per_unit = 3
[tables.events.columns.bucket]
public_keys = {list(range(BUCKETS))}
[tables.events.columns.amount]
bounds = [0, 100]
"""


@pytest.fixture
def stats_db(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """One row per user; bucket b holds 3*b users (bucket 0 is empty). Returns the true counts."""
    buckets = np.repeat(np.arange(BUCKETS), 3 * np.arange(BUCKETS))
    frame = pd.DataFrame(
        {
            "user_id": np.arange(len(buckets)),
            "bucket": buckets.astype(np.int32),
            "amount": (buckets % 101).astype(np.float64),
        }
    )
    database = make_database(tmp_path / "stats.duckdb", {"events": frame}, STATS_POLICY)
    return database, 3 * np.arange(BUCKETS)


def test_grouped_count_answers_every_public_key_and_is_charged(demo_db: Path, rng) -> None:
    with seeded_connect(demo_db, analyst="alice", rng=rng) as db:
        before = db.budget().for_analyst("alice")
        result = db.execute(
            "SELECT country, COUNT(*) AS n FROM requests GROUP BY country", epsilon=0.5
        )
        after = db.budget().for_analyst("alice")
    assert result.columns == ["country", "n"]
    assert [row[0] for row in result.rows] == ["DK", "NO", "SE", "FI", "IS"]  # IS has no rows
    assert all(isinstance(row[1], int) for row in result.rows)
    assert (result.epsilon, result.delta, result.mechanism) == (0.5, 0.0, "discrete_laplace")
    lows, highs = zip(*result.intervals["n"], strict=True)
    assert all(lo < v < hi for (_, v), lo, hi in zip(result.rows, lows, highs, strict=True))
    assert before is not None and after is not None
    assert after.epsilon_spent == pytest.approx(before.epsilon_spent + 0.5, abs=1e-12)
    frame = result.to_pandas(intervals=True)
    assert list(frame.columns) == ["country", "n", "n_low", "n_high"]
    entries = database_ledger(demo_db)
    assert entries[-1]["kind"] == "charge" and entries[-1]["epsilon"] == 0.5
    assert entries[-1]["analyst"] == "alice"


def test_bigquery_options_set_the_budget(demo_db: Path, rng) -> None:
    with seeded_connect(demo_db, analyst="alice", rng=rng) as db:
        result = db.execute(
            "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=0.25, delta=1e-9) COUNT(*) "
            "FROM requests WHERE url = '/home'"
        )
        assert result.epsilon == 0.25
        with pytest.raises(ParameterError, match="both in OPTIONS"):
            db.execute(
                "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=0.25) COUNT(*) FROM requests",
                epsilon=0.5,
            )


def test_policy_default_epsilon_and_missing_epsilon(tmp_path: Path, demo_db: Path) -> None:
    with dpsql.connect(demo_db, analyst="alice") as db:
        assert db.execute("SELECT COUNT(*) FROM requests").epsilon == 0.5  # demo default
    frame = pd.DataFrame({"u": [1, 2, 3]})
    policy = (
        '[dataset]\nepsilon = 1.0\n[analysts.a]\nepsilon = 1.0\n[tables.t]\nprivacy_unit = "u"\n'
    )
    database = make_database(tmp_path / "t.duckdb", {"t": frame}, policy)
    with (
        dpsql.connect(database, analyst="a") as db,
        pytest.raises(ParameterError, match="no epsilon"),
    ):
        db.execute("SELECT COUNT(*) FROM t")


REFUSED = [
    ("SELECT COUNT(* FROM requests", {}, SqlSyntaxError),
    ("SELECT MAX(bytes) FROM requests", {}, UnsupportedQueryError),
    ("SELECT url, COUNT(*) FROM requests GROUP BY url", {}, UnsupportedQueryError),
    ("SELECT COUNT(*) FROM requests WHERE nope = 1", {}, SchemaError),
    ("SELECT COUNT(*) FROM nope", {}, SchemaError),
    ("SELECT SUM(age) FROM requests", {}, PolicyError),
    ("SELECT COUNT(*) FROM requests", {"epsilon": 0.0}, ParameterError),
    ("SELECT COUNT(*) FROM requests", {"epsilon": -1.0}, ParameterError),
    ("SELECT COUNT(*) FROM requests", {"epsilon": math.nan}, ParameterError),
    ("SELECT COUNT(*) FROM requests", {"epsilon": math.inf}, ParameterError),
    ("SELECT COUNT(*) FROM requests", {"delta": 1.0}, ParameterError),
    ("SELECT COUNT(*) FROM requests", {"delta": -0.1}, ParameterError),
    ("SELECT COUNT(*) FROM requests", {"epsilon": 3.9}, None),  # allowed, spends most
    ("SELECT COUNT(*) FROM requests", {"epsilon": 0.2}, BudgetExceededError),
]


def test_refused_queries_charge_nothing(demo_db: Path) -> None:
    with dpsql.connect(demo_db, analyst="alice") as db:
        for sql, kwargs, error in REFUSED:
            entries = len(database_ledger(demo_db))
            if error is None:
                db.execute(sql, **kwargs)
                continue
            with pytest.raises(error):
                db.execute(sql, **kwargs)
            assert len(database_ledger(demo_db)) == entries, sql
    status = database_budget(demo_db, "alice").for_analyst("alice")
    assert status is not None and status.epsilon_spent == 3.9


def test_exhausted_budget_says_requested_and_remaining(demo_db: Path) -> None:
    with dpsql.connect(demo_db, analyst="bob") as db:
        db.execute("SELECT COUNT(*) FROM requests", epsilon=1.5)
        with pytest.raises(BudgetExceededError) as info:
            db.execute("SELECT COUNT(*) FROM requests", epsilon=0.75)
    message = str(info.value)
    assert "epsilon=0.75" in message and "analyst 'bob' allocation" in message
    assert "epsilon=0.5 " in message or "epsilon=0.5," in message


def test_unknown_analyst_and_missing_policy(tmp_path: Path, demo_db: Path) -> None:
    with pytest.raises(PolicyError, match="analyst 'mallory'"):
        dpsql.connect(demo_db, analyst="mallory")
    bare = tmp_path / "bare.duckdb"
    duckdb.connect(str(bare)).close()
    with pytest.raises(PolicyError, match="no privacy policy"):
        dpsql.connect(bare, analyst="alice")


def test_ledger_survives_reopen(demo_db: Path) -> None:
    with dpsql.connect(demo_db, analyst="alice") as db:
        db.execute("SELECT COUNT(*) FROM requests", epsilon=1.0)
    with dpsql.connect(demo_db, analyst="alice") as db:
        status = db.budget().for_analyst("alice")
        assert status is not None and status.epsilon_spent == 1.0
        assert [e["kind"] for e in db.ledger()] == ["charge"]  # own entries only


def test_the_policy_sets_the_memory_limit_not_the_analyst(demo_db: Path) -> None:
    """A limit the analyst chooses would turn one person's rows into a failure: there is none."""
    from dpsql.engine.demo import DEMO_POLICY

    with pytest.raises(TypeError, match="memory_limit"):
        dpsql.connect(demo_db, analyst="alice", memory_limit="8MB")
    set_policy(demo_db, DEMO_POLICY.replace("[dataset]\n", '[dataset]\nmemory_limit = "256MB"\n'))
    with dpsql.connect(demo_db, analyst="alice") as db:
        limit = db.backend.run("SELECT current_setting('memory_limit') AS m")["m"][0]
        assert limit in {"256.0 MB", "244.1 MiB"}
        assert db.execute("SELECT COUNT(*) FROM requests", epsilon=0.5).rows
    bad = DEMO_POLICY.replace("[dataset]\n", '[dataset]\nmemory_limit = "lots"\n')
    with pytest.raises(PolicyError, match=r"dataset\.memory_limit"):
        set_policy(demo_db, bad)
    assert [e["kind"] for e in database_ledger(demo_db)] == ["policy", "policy", "charge"]


def test_a_policy_set_between_planning_and_the_charge_charges_nothing(
    demo_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session plans under the policy it last read; one set after that read and before the
    charge (another process, just then) refuses the charge with the file locked, so no answer
    is released under bounds the policy in force no longer declares. Asked again, the query
    is planned under the new policy."""
    from dpsql.accountant.ledger import Ledger
    from dpsql.engine.demo import DEMO_POLICY
    from dpsql.engine.policy import parse_policy
    from dpsql.engine.session import _limits as policy_limits
    from dpsql.engine.session import ledger_path

    sql = "SELECT SUM(bytes) FROM requests"
    with dpsql.connect(demo_db, analyst="alice") as db:
        assert db.plan(sql, epsilon=0.5).measurements[0].sensitivity_units
        planned_under = db.ledger_store.policy_entry()
        tighter = parse_policy(DEMO_POLICY.replace("bounds = [0, 100000]", "bounds = [0, 1000]"))
        other = Ledger(ledger_path(demo_db), dataset="demo")  # another process's ledger
        other.set_policy(tighter.model_dump(mode="json"), policy_limits(tighter))
        other.close()
        # The race: the session's own check ran before the new policy landed.
        monkeypatch.setattr(db.ledger_store, "policy_entry", lambda: planned_under)
        entries = len(database_ledger(demo_db))
        with pytest.raises(PolicyError, match="policy changed while this query was planned"):
            db.execute(sql, epsilon=0.5)
        assert len(database_ledger(demo_db)) == entries
        monkeypatch.undo()
        result = db.execute(sql, epsilon=0.5)
    assert result.ledger_entry == entries + 1
    shown = database_ledger(demo_db)[-1]["plan"]["measures"]["SUM(bytes)"]
    assert "clamped to [0, 1000]" in shown


def test_noise_has_the_stated_scale(stats_db, rng) -> None:
    """Errors of 200 groups x 15 runs match discrete Laplace(scale = L1 sens / eps).

    The sample standard deviation must be within 8% of the theoretical one: a mechanism whose scale
    is 30% off (std off by ~30%) fails. Sensitivity here is min(L0 * Linf, max_rows_per_unit) = 2.
    """
    database, truth = stats_db
    epsilon, scale = 0.4, 2 / 0.4
    errors = []
    with seeded_connect(database, analyst="tester", rng=rng) as db:
        for _ in range(15):
            result = db.execute(
                "SELECT bucket, COUNT(*) FROM events GROUP BY bucket", epsilon=epsilon
            )
            errors.append(np.array([row[1] for row in result.rows]) - truth)
    errors = np.concatenate(errors)
    a = math.exp(-1 / scale)
    expected_std = math.sqrt(2 * a) / (1 - a)
    assert abs(errors.mean()) < 0.5
    assert abs(errors.std() / expected_std - 1) < 0.08
    assert np.all(errors == np.round(errors))  # integer noise


def test_intervals_cover_at_their_nominal_rate(stats_db, rng) -> None:
    """95% intervals of COUNT and SUM cover the true bounded value in 95% +- 1.5% of 3000 cases."""
    database, truth = stats_db
    true_sums = np.array([3 * b * (b % 101) for b in range(BUCKETS)], dtype=float)
    covered = {"n": 0, "s": 0}
    total = 0
    with seeded_connect(database, analyst="tester", rng=rng) as db:
        for _ in range(15):
            result = db.execute(
                "SELECT bucket, COUNT(*) AS n, SUM(amount) AS s FROM events GROUP BY bucket",
                epsilon=0.3,
            )
            for name, exact in (("n", truth), ("s", true_sums)):
                low, high = np.array(result.intervals[name]).T
                covered[name] += int(np.sum((low <= exact) & (exact <= high)))
            total += BUCKETS
    for name in covered:
        assert 0.935 <= covered[name] / total <= 0.99, (name, covered[name] / total)


def test_average_interval_covers(stats_db, rng) -> None:
    database, _ = stats_db
    true_avg = np.array([b % 101 for b in range(BUCKETS)], dtype=float)
    hits = total = 0
    with seeded_connect(database, analyst="tester", rng=rng) as db:
        for _ in range(10):
            result = db.execute(
                "SELECT bucket, AVG(amount) AS a FROM events GROUP BY bucket", epsilon=1.0
            )
            low, high = np.array(result.intervals["a"]).T
            values = np.array([row[1] for row in result.rows])
            assert np.all((values >= 0) & (values <= 100))
            mask = np.arange(BUCKETS) > 0  # bucket 0 is empty: its true average is undefined
            hits += int(np.sum(((low <= true_avg) & (true_avg <= high))[mask]))
            total += int(mask.sum())
    assert hits / total >= 0.95


SECRET = "SECRET-VALUE-8d1f"


@pytest.fixture
def adversarial_db(tmp_path: Path) -> Path:
    frame = pd.DataFrame(
        {
            "user_id": [1, 1, 2, None, 3, 4],
            "label": [SECRET, "x", "y", SECRET, None, "z"],
            "amount": [np.nan, np.inf, -np.inf, 1e308, None, 5.0],
            "big": np.array([2**62, 2**62, 2**62, 2**62, -(2**62), 1], dtype=np.int64),
        }
    )
    policy = """
[dataset]
epsilon = 100.0
[analysts.a]
epsilon = 100.0
[tables.t]
privacy_unit = "user_id"
max_rows_per_unit = 10
[tables.t.columns.amount]
bounds = [-10, 10]
[tables.t.columns.big]
bounds = [0, 1e18]
[tables.t.columns.label]
public_keys = ["x", "y", "z"]
"""
    return make_database(tmp_path / "adv.duckdb", {"t": frame}, policy)


def test_adversarial_values_never_make_a_query_fail(adversarial_db: Path, rng) -> None:
    with seeded_connect(adversarial_db, analyst="a", rng=rng) as db:
        for sql in [
            "SELECT SUM(amount), AVG(amount), COUNT(amount) FROM t",
            "SELECT SUM(big), AVG(big) FROM t",
            "SELECT label, COUNT(*), SUM(amount) FROM t GROUP BY label",
            "SELECT COUNT(*) FROM t WHERE amount > 1.5 AND label IN ('x', 'q') OR big < 3",
            "SELECT COUNT(*) FROM t WHERE big = 99999999999999999",
        ]:
            result = db.execute(sql, epsilon=1.0)
            assert all(v is None or math.isfinite(v) for row in result.rows for v in row[-1:])


def test_errors_never_quote_data(adversarial_db: Path) -> None:
    bad = [
        "SELECT COUNT(*) FROM t WHERE label = 5",
        "SELECT SUM(label) FROM t",
        "SELECT label FROM t",
        "SELECT COUNT(*) FROM t WHERE CAST(label AS INT) = 1",
        f"SELECT COUNT(*) FROM t WHERE label = '{SECRET[:-1]}' GROUP BY amount",
    ]
    with dpsql.connect(adversarial_db, analyst="a") as db:
        for sql in bad:
            with pytest.raises(dpsql.DpsqlError) as info:
                db.execute(sql, epsilon=1.0)
            assert SECRET not in str(info.value)


def test_database_has_no_file_access(demo_db: Path) -> None:
    with dpsql.connect(demo_db, analyst="alice") as db:
        with pytest.raises(ExecutionError) as info:
            db.backend.run("SELECT * FROM read_csv('/etc/hostname')")
        assert "hostname" not in str(info.value)


def test_explain_reads_no_data_and_charges_nothing(demo_db: Path) -> None:
    with dpsql.connect(demo_db, analyst="alice") as db:
        report = db.explain(
            "SELECT country, SUM(bytes), AVG(latency_ms) FROM requests GROUP BY country",
            epsilon=0.9,
        )
    assert report["cost"] == {"epsilon": 0.9, "delta": 0.0}
    measurements = report["plan"]["measurements"]
    assert [m["label"] for m in measurements] == [
        "SUM(bytes)",
        "SUM(latency_ms)",
        "COUNT(latency_ms) within bounds",
    ]
    assert measurements[0]["l1_sensitivity"] >= 5 * 100_000  # L0 * Linf * max |bound|
    assert len(database_ledger(demo_db)) == 1


def test_queries_may_be_written_in_another_dialect(demo_db: Path, rng) -> None:
    with seeded_connect(demo_db, analyst="alice", dialect="bigquery", rng=rng) as db:
        result = db.execute("SELECT COUNT(*) AS n FROM `requests` WHERE age >= 30", epsilon=0.2)
    assert result.columns == ["n"]
    with (
        dpsql.connect(demo_db, analyst="alice", dialect="nosuch") as db,
        pytest.raises(ParameterError, match="unknown SQL dialect"),
    ):
        db.execute("SELECT 1")


def test_policy_file_sources_are_queried_through_connect(tmp_path: Path, rng) -> None:
    frame = pd.DataFrame({"user_id": np.arange(300), "country": ["DK", "NO", "SE"] * 100})
    (tmp_path / "lake").mkdir()
    frame.iloc[:150].to_parquet(tmp_path / "lake" / "part-1.parquet")
    frame.iloc[150:].to_parquet(tmp_path / "lake" / "part-2.parquet")
    policy = """
[dataset]
epsilon = 10.0
[analysts.a]
epsilon = 10.0
[tables.visits]
privacy_unit = "user_id"
source = "lake/*.parquet"
[tables.visits.columns.country]
public_keys = ["DK", "NO", "SE"]
"""
    database = tmp_path / "lake.duckdb"  # no database file: the policy's files are the data
    dpsql.set_policy(database, policy)
    with seeded_connect(database, analyst="a", rng=rng) as db:
        result = db.execute("SELECT country, COUNT(*) FROM visits GROUP BY country", epsilon=5.0)
        with pytest.raises(ExecutionError):
            db.backend.run("SELECT * FROM read_csv('/etc/hostname')")
    assert all(abs(n - 100) < 10 for _, n in result.rows)
