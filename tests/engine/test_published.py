"""Publishing a user×item table with compressed randomized response, end to end on DuckDB files:
charge before data, refusals that charge and write nothing, public universe and cap, accuracy of
the post-processing estimators against the true table (stated tolerances), and decoding."""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dpsql.engine import publishing as published
from dpsql.engine.backends import DUCKDB_CONFIG, DuckDBBackend
from dpsql.engine.policy import parse_policy
from dpsql.engine.publishing import (
    DELTA_TARGET,
    MAX_CHUNK_LOG_RATIO,
    list_releases,
    load_release,
    overflow_delta,
    plan_release,
    publish_rr,
    release_common_items,
    release_decode,
    release_popularity,
)
from dpsql.engine.publishing import plan as release_planning
from dpsql.engine.publishing import publish as publishing_stage
from dpsql.engine.session import database_budget, database_ledger
from dpsql.errors import BudgetExceededError, ExecutionError, ParameterError, PolicyError
from dpsql.mechanisms import ppr
from dpsql.mechanisms.compressed_rr import CompressedRR, common_items
from tests.conftest import make_database, seeded

PERSONS = 1500
LOW, N_ITEMS, CAP = 100, 120, 6
POLICY = f"""
[dataset]
epsilon = 1000000.0
delta = 1e-6
[analysts.alice]
epsilon = 1000000.0
delta = 1e-6
[analysts.bob]
epsilon = 1.0
delta = 1e-6
[tables.events]
privacy_unit = "user_id"
max_rows_per_unit = {CAP}
[tables.events.columns.item_id]
bounds = [{LOW}, {LOW + N_ITEMS - 1}]
[tables.events.columns.score]
bounds = [0.5, 2.5]
[tables.likes]
privacy_unit = "user"
max_rows_per_unit = 3
[tables.likes.columns.item]
public_keys = ["apple", "pear", "plum", "fig"]
"""


def _events(seed: int = 7) -> tuple[pd.DataFrame, np.ndarray]:
    """Persons 0..PERSONS-1 with 1..CAP distinct items (Zipf-like), plus rows the release must
    drop: items outside the universe, NULL items, NULL users, and person 10**6 who has only
    out-of-universe items (listed with an empty set). Returns the table and the true sets."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, N_ITEMS + 1) ** 0.8
    weights /= weights.sum()
    truth = np.zeros((PERSONS, N_ITEMS), dtype=bool)
    for person in range(PERSONS):
        truth[person, rng.choice(N_ITEMS, rng.integers(1, CAP + 1), replace=False, p=weights)] = 1
    person, item = np.nonzero(truth)
    frame = pd.DataFrame({"user_id": person, "item_id": (item + LOW).astype(np.int64)})
    extra = pd.DataFrame(
        {
            "user_id": [0, 1, 10**6, 10**6, None, 2],
            "item_id": [LOW - 1, LOW + N_ITEMS, 5, 7, LOW, None],
        }
    )
    frame = pd.concat([frame, extra], ignore_index=True).astype(
        {"user_id": "Int64", "item_id": "Int64"}
    )
    frame["score"] = 1.0
    return frame, truth


@pytest.fixture
def events_db(tmp_path: Path) -> tuple[Path, np.ndarray]:
    frame, truth = _events()
    likes = pd.DataFrame(
        {
            "user": ["ann", "ann", "bo", "cy", "cy", "cy", "cy"],
            "item": ["apple", "pear", "kiwi", "apple", "plum", "fig", "pear"],
        }
    )
    database = make_database(tmp_path / "rr.duckdb", {"events": frame, "likes": likes}, POLICY)
    return database, truth


def _publish(database: Path, name: str, epsilon: float, **kwargs) -> published.PublishedRelease:
    options = {"analyst": "alice", "table": "events", "unit": "user_id", "item": "item_id"}
    options.update(kwargs)
    return seeded(
        publish_rr, database, epsilon=epsilon, name=name, rng=np.random.default_rng(len(name)),
        **options,
    )  # fmt: skip


def _stored_tables(database: Path) -> set[str]:
    backend = DuckDBBackend(database)
    try:
        return {t for t in backend.catalog() if t.startswith("dpsql_rr")}
    finally:
        backend.close()


def test_charge_is_recorded_before_the_table_is_read(events_db, monkeypatch) -> None:
    database, _ = events_db
    seen: list[dict] = []
    original = publishing_stage._read_rows

    def spy(backend, plan):
        seen.append(database_ledger(database)[-1])
        return original(backend, plan)

    monkeypatch.setattr(publishing_stage, "_read_rows", spy)
    before = len(database_ledger(database))
    release = _publish(database, "first", 6.0)
    (charge,) = seen
    assert charge["seq"] == before + 1 == release.ledger_entry
    assert charge["mechanism"] == "compressed_rr" and charge["analyst"] == "alice"
    event = charge["payload"]
    assert event["type"] == "mechanism" and event["epsilon"] == 6.0
    params = event["params"]
    assert params["max_items"] == CAP and params["n"] == N_ITEMS
    assert params["hamming_bound"] == 2 * CAP and params["alpha"] == 2.0
    assert params["chunks"] == release.chunks and params["release"] == "first"
    assert params["epsilon_per_item"] * params["hamming_bound"] <= 6.0
    assert 0 < charge["delta"] <= DELTA_TARGET and charge["epsilon"] == 6.0
    assert release.epsilon == 6.0 and release.epsilon_rr <= release.epsilon_per_item / 4
    assert release.persons == PERSONS + 1  # the person with only outside items is listed
    assert [r.name for r in list_releases(database)] == ["first"]
    assert _stored_tables(database) == {"dpsql_rr_releases", "dpsql_rr_first"}
    assert len(database_ledger(database)) == before + 1


def test_progress_stages_come_after_the_charge_in_order(events_db) -> None:
    database, _ = events_db
    before = len(database_ledger(database))
    reports: list[tuple[str, float | None, int]] = []

    def progress(stage: str, fraction: float | None) -> None:
        reports.append((stage, fraction, len(database_ledger(database))))

    _publish(database, "staged", 6.0, progress=progress)
    stages = [stage for stage, _, _ in reports]
    assert stages == ["reading data", "encoding messages", "storing the release", "done"]
    assert all(entries == before + 1 for _, _, entries in reports)  # charged before reading
    assert reports[-1][1] == 1.0


def test_budget_refusal_reads_and_writes_nothing(events_db, monkeypatch) -> None:
    database, _ = events_db

    def fail(*args, **kwargs):
        raise AssertionError("data read after a refused charge")

    monkeypatch.setattr(publishing_stage, "_read_rows", fail)
    before = database_ledger(database)
    with pytest.raises(BudgetExceededError, match="remaining"):
        _publish(database, "toomuch", 2.0, analyst="bob")
    assert database_ledger(database) == before
    assert _stored_tables(database) == set()
    assert list_releases(database) == []


def test_duplicate_names_and_bad_names_are_refused_before_charging(events_db) -> None:
    database, _ = events_db
    _publish(database, "dup", 6.0)
    before = database_ledger(database)
    for name in ("dup", "DUP"):
        with pytest.raises(ParameterError, match="already exists"):
            _publish(database, name, 6.0)
    for name in ("1x", "a-b", "x" * 64, ""):
        with pytest.raises(ParameterError, match="name must start"):
            _publish(database, name, 6.0)
    assert database_ledger(database) == before


INVALID = [
    ({"item": "score"}, PolicyError, "integer or string column"),
    ({"table": "nope"}, PolicyError, "not in the policy"),
    ({"unit": "item_id", "item": "user_id"}, PolicyError, "not the privacy unit"),
    ({"item": "missing"}, ParameterError, "does not exist"),
    ({"max_items": 0}, ParameterError, "max_items"),
    ({"chunks": 0}, ParameterError, "chunks must be in"),
    ({"alpha": 1.0}, ParameterError, "alpha"),
    ({"epsilon": math.nan}, ParameterError, "epsilon"),
    ({"epsilon": 200.0, "max_items": 1}, ParameterError, "too large"),
    ({"epsilon": 60.0, "chunks": 1}, ParameterError, "crowd a chunk"),
    ({"analyst": "mallory"}, PolicyError, "no allocation"),
]


def test_invalid_requests_charge_nothing(events_db) -> None:
    database, _ = events_db
    before = database_ledger(database)
    for kwargs, error, message in INVALID:
        options = {"epsilon": 6.0, **kwargs}
        with pytest.raises(error, match=message):
            _publish(database, "bad", **options)
    assert database_ledger(database) == before
    assert _stored_tables(database) == set()


def test_item_universe_must_be_public(tmp_path: Path) -> None:
    frame = pd.DataFrame({"u": [1, 2], "i": [3, 4], "f": [0.5, 1.0]})
    base = "[dataset]\nepsilon = 10.0\ndelta = 1e-6\n[analysts.a]\nepsilon = 10.0\ndelta = 1e-6\n"
    base += '[tables.t]\nprivacy_unit = "u"\n'
    cases = [
        ("", "no public item universe"),
        ("[tables.t.columns.i]\nbounds = [0.5, 9]\n", "must be integers"),
        ("[tables.t.columns.i]\nbounds = [0, 100000000]\n", "at most"),
    ]
    for extra, message in cases:
        database = make_database(tmp_path / f"u{len(extra)}.duckdb", {"t": frame}, base + extra)
        with pytest.raises(PolicyError, match=message):
            publish_rr(database, analyst="a", table="t", unit="u", item="i", epsilon=1, name="r")
        assert [e["kind"] for e in database_ledger(database)] == ["policy"]


def test_chunks_come_from_public_values_only() -> None:
    """The plan needs the policy and the catalog, never rows; every automatic choice keeps the
    worst chunk's log-ratio (all D items in it) within bounds and δ below the target."""
    policy = parse_policy(POLICY)
    catalog = {"events": {"user_id": "BIGINT", "item_id": "BIGINT", "score": "DOUBLE"}}
    for epsilon in (0.5, 6.0, 24.0, 60.0):
        plan = plan_release(
            policy, catalog, name="p", table="events", unit="user_id", item="item_id",
            epsilon=epsilon,
        )  # fmt: skip
        size = -(-N_ITEMS // plan.chunks)
        bound = plan.epsilon_per_item / (2 * plan.alpha) * min(CAP, size)
        assert plan.chunk_log_ratio_bound == pytest.approx(bound)
        assert bound <= MAX_CHUNK_LOG_RATIO and 0 < plan.delta <= DELTA_TARGET
        assert plan.epsilon_per_item * plan.hamming_bound <= epsilon
        event = plan.event()
        assert (event.epsilon, event.delta) == (epsilon, plan.delta)


def test_overflow_delta_bounds_and_matches_the_encoder_limit() -> None:
    assert release_planning.INDEX_LIMIT_LOG2 * math.log(2.0) == pytest.approx(ppr._LOG_RANK_LIMIT)
    base = {"epsilon_per_item": 1.0, "alpha": 2.0, "chunks": 10, "n": 1000, "max_items": 5}
    delta = overflow_delta(**base)
    assert 0 < delta < 1e-9
    assert overflow_delta(**{**base, "epsilon_per_item": 2.0}) > delta
    assert overflow_delta(**{**base, "alpha": 1.5}) > 1e3 * delta
    assert overflow_delta(**{**base, "chunks": 1000}) < delta  # one item per chunk
    assert overflow_delta(**{**base, "epsilon_per_item": 60.0}) == 1.0


def test_cap_keeps_a_uniform_subset_of_each_persons_items() -> None:
    rng = np.random.default_rng(3)
    person = np.repeat(np.arange(4), [1, 3, 5, 8])
    item = np.concatenate([[7], [0, 1, 2], np.arange(5), np.arange(10, 18)])
    kept_person, kept_item = publishing_stage._cap_items(person, item, 3, rng)
    assert np.bincount(kept_person).tolist() == [1, 3, 3, 3]
    for p in range(4):
        assert set(kept_item[kept_person == p]) <= set(item[person == p])
    # One of 5 items kept, 5000 times: uniform (chi-square, p > 1e-4).
    counts = np.zeros(5)
    for _ in range(5000):
        _, chosen = publishing_stage._cap_items(np.zeros(5, np.int64), np.arange(5), 1, rng)
        counts[chosen[0]] += 1
    assert stats.chisquare(counts).pvalue > 1e-4


def test_popularity_is_unbiased_with_honest_intervals(events_db) -> None:
    """Per item, z = (estimate - true)/std_error. With 120 independent items: |Σz|/√120 < 4,
    Σz² inside the χ²(120) central 99.99% range, and the 95% intervals cover >= 85% of items."""
    database, truth = events_db
    release = _publish(database, "pop", 60.0)
    result = release_popularity(database, analyst="alice", name="pop")
    true = truth.sum(axis=0)
    assert result.items == list(range(LOW, LOW + N_ITEMS)) and result.persons == PERSONS + 1
    z = (result.estimate - true) / result.std_error
    assert abs(z.sum()) / math.sqrt(N_ITEMS) < 4
    low, high = stats.chi2.ppf([5e-5, 1 - 5e-5], N_ITEMS)
    assert low < (z**2).sum() < high
    assert np.mean((result.lower <= true) & (true <= result.upper)) >= 0.85
    assert result.confidence == 0.95 and result.std_error > 0
    top = release_popularity(database, analyst="alice", name="pop", top_k=5, confidence=0.9)
    assert len(top.items) == 5 and top.confidence == 0.9
    assert np.all(np.diff(top.estimate) <= 0) and top.estimate[0] == result.estimate.max()
    assert release.epsilon_rr == pytest.approx(60.0 / 12 / 4, rel=1e-9)


def test_decoded_rows_match_the_library_and_the_truth(events_db) -> None:
    """Decoding through the engine equals CompressedRR.decode of the stored message; at a large
    ε the decoded rows disagree with the true rows at the RR flip rate (within 5 sd), which a
    wrong item mapping (about 2 × 3.5/120 extra disagreements per entry) would break."""
    database, truth = events_db
    release = _publish(database, "dec", 60.0)
    persons = list(range(0, PERSONS, 3))
    rows = release_decode(database, analyst="alice", name="dec", persons=persons)
    with duckdb.connect(str(database), read_only=True, config=dict(DUCKDB_CONFIG)) as connection:
        stored = dict(connection.execute("SELECT user_id, message FROM dpsql_rr_dec").fetchall())
    codec = CompressedRR(
        n=N_ITEMS,
        epsilon=release.epsilon_per_item,
        chunks=release.chunks,
        public_seed=release.public_seed,
        alpha=release.alpha,
    )
    for row in rows[:50]:
        assert np.array_equal(row.row, codec.decode(bytes(stored[row.person]), user_id=row.person))
        assert row.items == [LOW + int(i) for i in np.flatnonzero(row.row)]
    decoded = np.array([row.row for row in rows])
    flip = codec.flip_probability
    observed = np.mean(decoded != truth[persons])
    assert abs(observed - flip) < 5 * math.sqrt(flip * (1 - flip) / decoded.size)
    (empty,) = release_decode(database, analyst="alice", name="dec", persons=["1000000"])
    assert empty.row.sum() < N_ITEMS * flip + 5 * math.sqrt(N_ITEMS * flip)
    with pytest.raises(ParameterError, match="not in release"):
        release_decode(database, analyst="alice", name="dec", persons=[PERSONS + 5])
    with pytest.raises(ParameterError, match="integer id"):
        release_decode(database, analyst="alice", name="dec", persons=["ann"])


def test_common_items_are_unbiased(events_db) -> None:
    """750 disjoint pairs: Σ(estimate - true)/sqrt(Σ std_error²) within ±4, and each estimate
    equals the library's estimator on the decoded rows."""
    database, truth = events_db
    release = _publish(database, "common", 24.0)
    order = np.random.default_rng(5).permutation(PERSONS)
    pairs = [(int(a), int(b)) for a, b in zip(order[0::2], order[1::2], strict=False)]
    results = release_common_items(database, analyst="alice", name="common", pairs=pairs)
    assert len(results) == len(pairs) and len({r.ledger_entry for r in results}) == 1
    true = np.array([truth[a] @ truth[b] for a, b in pairs], dtype=float)
    estimate = np.array([r.estimate for r in results])
    error = np.array([r.std_error for r in results])
    assert abs((estimate - true).sum()) / math.sqrt((error**2).sum()) < 4
    a, b = pairs[0]
    rows = release_decode(database, analyst="alice", name="common", persons=[a, b])
    library = common_items(rows[0].row, rows[1].row, epsilon_rr=release.epsilon_rr)
    assert results[0].estimate == library.estimate and results[0].std_error == library.std_error
    with pytest.raises(ParameterError, match="two different persons"):
        release_common_items(database, analyst="alice", name="common", pairs=[(a, a)])


def test_post_processing_is_free_and_recorded(events_db) -> None:
    database, _ = events_db
    release = _publish(database, "free", 6.0)
    spent = database_budget(database, "alice").for_analyst("alice")
    release_popularity(database, analyst="alice", name="FREE", top_k=3)
    release_common_items(database, analyst="alice", name="free", pairs=[(0, 1)])
    release_decode(database, analyst="bob", name="free", persons=[2])
    entries = database_ledger(database)[-3:]
    assert [e["payload"]["label"] for e in entries] == ["popularity", "common_items", "decode"]
    for entry in entries:
        assert entry["epsilon"] == 0 and entry["delta"] == 0
        assert entry["payload"]["type"] == "post_processing"
        assert entry["payload"]["source"] == f"compressed_rr release 'free' (ledger entry {2})"
        assert entry["plan"]["source_entry"] == release.ledger_entry
    assert database_budget(database, "alice").for_analyst("alice") == spent
    with pytest.raises(ParameterError, match="no release named"):
        release_popularity(database, analyst="alice", name="nope")
    with pytest.raises(PolicyError, match="no allocation"):
        release_popularity(database, analyst="mallory", name="free")


def test_string_keys_cap_and_roster(events_db) -> None:
    """Public keys index the items in policy order, unknown items ('kiwi') are dropped, bo (only
    'kiwi') is still listed, and cy's four items are capped to max_rows_per_unit = 3."""
    database, _ = events_db
    release = seeded(
        publish_rr, database, analyst="alice", table="LIKES", unit="user", item="item",
        epsilon=30.0, name="likes", rng=np.random.default_rng(1),
    )  # fmt: skip
    assert (release.table, release.unit_kind, release.persons) == ("likes", "string", 3)
    assert release.universe.keys == ("apple", "pear", "plum", "fig")
    assert release.max_items == 3 and release.hamming_bound == 4
    assert load_release(database, "LIKES") == release
    result = release_popularity(database, analyst="alice", name="likes")
    assert result.items == ["apple", "pear", "plum", "fig"] and result.persons == 3
    rows = release_decode(database, analyst="alice", name="likes", persons=["bo", "cy"])
    assert [r.person for r in rows] == ["bo", "cy"]
    assert all(set(r.items) <= {"apple", "pear", "plum", "fig"} for r in rows)
    with pytest.raises(ParameterError, match="string id"):
        release_decode(database, analyst="alice", name="likes", persons=[3])
    with pytest.raises(ParameterError, match="not in release"):
        release_decode(database, analyst="alice", name="likes", persons=["dan"])


def test_a_failure_after_the_charge_keeps_the_charge(events_db, monkeypatch) -> None:
    database, _ = events_db

    def broken(*args, **kwargs):
        raise ExecutionError("disk full")

    monkeypatch.setattr(publishing_stage, "_write_release", broken)
    before = len(database_ledger(database))
    with pytest.raises(ExecutionError):
        _publish(database, "lost", 6.0)
    assert len(database_ledger(database)) == before + 1
    assert list_releases(database) == []


def test_writing_needs_the_database_free(events_db) -> None:
    database, _ = events_db
    before = database_ledger(database)
    with (
        duckdb.connect(str(database), read_only=True, config=dict(DUCKDB_CONFIG)),
        pytest.raises(ExecutionError, match="for writing"),
    ):
        _publish(database, "busy", 6.0)
    assert database_ledger(database) == before
