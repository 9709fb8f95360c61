"""Query streams end to end: opened with one charge, answered as zero-cost ledger entries,
exhausted with a clear error, persisted between sessions, per analyst unless shared, in EXPLAIN,
``dpsql synopses`` and ``dpsql stream open``."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpsql.cli import main
from dpsql.engine.backends import DuckDBBackend
from dpsql.engine.session import Session, database_synopses, ledger_path, show_policy
from dpsql.engine.stream_desk import StreamDesk
from dpsql.engine.streams import StreamColumn, StreamExhaustedError, StreamStore, stream_params
from dpsql.errors import ParameterError, UnsupportedQueryError
from dpsql.mechanisms.pmw import PMWState
from tests.conftest import make_database, seeded, seeded_connect

ROWS = 20_000

POLICY = """
[dataset]
epsilon = 10.0
delta = 1e-6
{shared}
[analysts.alice]
epsilon = 5.0
delta = 1e-6
[analysts.bob]
epsilon = 5.0

[tables.people]
privacy_unit = "uid"
[tables.people.columns.age]
bounds = [0, 99]
[tables.people.columns.income]
bounds = [0, 199]
[tables.people.columns.score]
bounds = [0, 1]
"""


def _frame() -> pd.DataFrame:
    rng = np.random.default_rng(11)
    return pd.DataFrame(
        {
            "uid": np.arange(ROWS),
            "age": rng.integers(0, 100, ROWS),
            "income": rng.gamma(2.0, 20.0, ROWS).astype(int).clip(0, 199),
            "score": rng.random(ROWS),
            "city": rng.choice(["a", "b"], ROWS),
        }
    )


@pytest.fixture
def people(tmp_path: Path) -> tuple[Path, pd.DataFrame]:
    frame = _frame()
    return make_database(tmp_path / "p.duckdb", {"people": frame}, POLICY.format(shared="")), frame


def _connect(database: Path, analyst: str = "alice", seed: int = 1):
    return seeded_connect(database, analyst=analyst, rng=np.random.default_rng(seed))


def test_a_range_tree_is_charged_once_and_answers_for_free(people) -> None:
    database, frame = people
    with _connect(database) as session:
        opened = session.open_stream("people", [("age", 1)], epsilon=1.0, mechanism="range_tree")
        assert session.budget().for_analyst("alice").epsilon_spent == pytest.approx(1.0)
        ranges = [(30, 39), (0, 99), (17, 17), (50, 80)]
        for low, high in ranges:
            sql = f"SELECT COUNT(*) AS n FROM people WHERE age BETWEEN {low} AND {high}"
            result = session.execute(sql)
            truth = int(frame.age.between(low, high).sum())
            ((lower, upper),) = result.intervals["n"]
            assert lower <= truth <= upper and upper - lower < 200
            assert result.epsilon == 0 and result.mechanism == f"stream:{opened['name']}"
        assert session.budget().for_analyst("alice").epsilon_spent == pytest.approx(1.0)
        entries = session.ledger()
    assert [e["mechanism"] for e in entries] == ["stream:range_tree"] + ["stream"] * len(ranges)
    assert all(e["payload"]["source"] == f"stream:{opened['name']}" for e in entries[1:])


def test_explain_names_the_stream_and_laplace_bypasses_it(people) -> None:
    database, _ = people
    with _connect(database) as session:
        opened = session.open_stream(
            "people", [("age", 1), ("income", 1)], epsilon=1.0, mechanism="pmw"
        )
        sql = "SELECT COUNT(*) FROM people WHERE age < 40 AND income >= 20"
        plan = session.explain(sql)
        assert plan["plan"]["mechanism"] == "stream"
        assert plan["plan"]["stream"]["name"] == opened["name"] and plan["cost"]["epsilon"] == 0
        other = session.explain("SELECT COUNT(*) FROM people WHERE city = 'a'", epsilon=0.1)
        assert other["plan"]["mechanism"] != "stream"
        fresh = session.execute(sql, mechanism="laplace", epsilon=0.1)
        assert fresh.epsilon == 0.1 and fresh.mechanism == "discrete_laplace"
        grouped = session.explain(
            "SELECT city, COUNT(*) FROM people GROUP BY city", epsilon=0.1, delta=1e-7
        )
        assert grouped["plan"]["mechanism"] != "stream"


def test_pmw_answers_within_alpha_and_records_its_state_before_answering(people) -> None:
    database, frame = people
    with _connect(database) as session:
        opened = session.open_stream("people", [("age", 1), ("income", 1)], epsilon=1.0, updates=20)
        for low in range(0, 90, 10):
            sql = f"SELECT COUNT(*) AS n FROM people WHERE age BETWEEN {low} AND {low + 9}"
            result = session.execute(sql)
            truth = int(frame.age.between(low, low + 9).sum())
            ((lower, upper),) = result.intervals["n"]
            assert lower <= truth <= upper
            # the warm-start tree's interval where it is narrower than alpha (never wider)
            assert (upper - lower) / 2 <= result.details["alpha"] * (1 + 1e-12)
            assert "warm-start tree" in result.details["guarantee"]
            store = StreamStore(ledger_path(database))
            (stored,) = store.all()
            store.close()
            state = PMWState.from_parts(stored.state, stored.data)
            # The committed state already counts this query and its update, if any.
            assert state.sparse[2] == stored.answered == low // 10 + 1
            assert 20 - state.sparse[1] == result.details["updates_left"]
    assert opened["updates_left"] == 20


def test_an_exhausted_stream_says_so_and_stops(people) -> None:
    database, _ = people
    with _connect(database) as session:
        opened = session.open_stream("people", [("age", 1)], epsilon=1.0, updates=2, threshold=1e-9)
        # With a threshold far below the error, queries spend updates until none are left.
        left = [
            session.execute(f"SELECT COUNT(*) FROM people WHERE age < {a}").details["updates_left"]
            for a in range(5, 45)
            if session.synopses()[0]["updates_left"] > 0
        ]
        assert left[-1] == 0 and set(left) <= {0, 1}
        assert session.synopses()[0]["updates_left"] == 0
        entries = len(session.ledger())
        with pytest.raises(StreamExhaustedError, match=f"{opened['name']}.*spent its 2 updates"):
            session.execute("SELECT COUNT(*) FROM people WHERE age < 30")
        with pytest.raises(StreamExhaustedError):
            session.explain("SELECT COUNT(*) FROM people WHERE age < 30")
        assert len(session.ledger()) == entries
        assert (
            session.execute(
                "SELECT COUNT(*) FROM people WHERE age < 30", mechanism="laplace", epsilon=0.1
            ).epsilon
            == 0.1
        )


def test_a_stream_persists_between_sessions(people) -> None:
    database, _ = people
    with _connect(database, seed=1) as session:
        session.open_stream("people", [("age", 1)], epsilon=1.0, updates=30)
        session.execute("SELECT COUNT(*) FROM people WHERE age < 50")
    store = StreamStore(ledger_path(database))
    before = PMWState.from_parts(store.all()[0].state, store.all()[0].data)
    with _connect(database, seed=2) as session:
        result = session.execute("SELECT COUNT(*) FROM people WHERE age < 50")
    after = PMWState.from_parts(store.all()[0].state, store.all()[0].data)
    store.close()
    assert after.n_hat == before.n_hat
    assert after.sparse[2] == before.sparse[2] + 1
    if not result.details["updated"]:
        assert after.sparse[:2] == before.sparse[:2]  # same epoch, same noisy threshold
        np.testing.assert_array_equal(after.log_weights, before.log_weights)


def test_streams_are_per_analyst_unless_the_policy_shares_them(people, tmp_path: Path) -> None:
    database, _ = people
    sql = "SELECT COUNT(*) FROM people WHERE age < 50"
    with _connect(database) as session:
        session.open_stream("people", [("age", 1)], epsilon=1.0, mechanism="range_tree")
        assert len(session.synopses()) == 1
    with _connect(database, "bob") as session:
        assert session.synopses() == []
        assert session.explain(sql, epsilon=0.1)["plan"]["mechanism"] != "stream"
    assert database_synopses(database, "bob") == []
    assert [s["kind"] for s in database_synopses(database)] == ["stream"]
    shared = make_database(
        tmp_path / "s.duckdb", {"people": _frame()}, POLICY.format(shared="share_synopses = true")
    )
    with _connect(shared) as session:
        session.open_stream("people", [("age", 1)], epsilon=1.0, mechanism="range_tree")
    with _connect(shared, "bob") as session:
        assert session.explain(sql)["plan"]["mechanism"] == "stream"
        assert session.execute(sql).epsilon == 0


def test_binned_columns_answer_only_cell_aligned_ranges(people) -> None:
    database, frame = people
    with _connect(database) as session:
        session.open_stream("people", [("age", 10)], epsilon=1.0, mechanism="range_tree")
        aligned = session.execute("SELECT COUNT(*) AS n FROM people WHERE age BETWEEN 30 AND 59")
        ((lower, upper),) = aligned.intervals["n"]
        assert lower <= int(frame.age.between(30, 59).sum()) <= upper
        also = session.execute("SELECT COUNT(*) FROM people WHERE age >= 30 AND age < 60")
        assert also.rows == aligned.rows
        entries = len(session.ledger())
        for sql, message in [
            ("SELECT COUNT(*) FROM people WHERE age BETWEEN 30 AND 35", "splits a cell"),
            ("SELECT COUNT(*) FROM people WHERE age < 35", "splits a cell"),
            ("SELECT COUNT(*) FROM people WHERE age = 30", "=, <> and IN"),
            ("SELECT COUNT(*) FROM people WHERE age IN (30, 40)", "=, <> and IN"),
            ("SELECT COUNT(*) FROM people WHERE age > 30 AND age < 40", "splits a cell"),
        ]:
            with pytest.raises(UnsupportedQueryError, match=message):
                session.execute(sql)
        assert len(session.ledger()) == entries


@pytest.mark.parametrize(
    ("table", "columns", "kwargs", "message"),
    [
        ("nope", [("age", 1)], {}, "unknown table"),
        ("people", [("nope", 1)], {}, "unknown column"),
        ("people", [("city", 1)], {}, "streams take integer"),
        ("people", [("uid", 1)], {}, "privacy unit"),
        ("people", [("score", 1)], {}, "streams take integer"),
        ("people", [("age", 0)], {}, "bin width"),
        ("people", [("age", 1), ("age", 2)], {}, "twice"),
        ("people", [("age", 1), ("income", 1)], {"mechanism": "range_tree"}, "exactly one"),
        ("people", [("age", 1)], {"mechanism": "mwem"}, "unknown stream mechanism"),
        ("people", [("age", 1)], {"updates": 0}, "updates"),
        ("people", [("age", 1)], {"warm_share": 1.0}, "warm_share"),
        ("people", [("age", 1)], {"warm_share": True}, "warm_share"),
        ("people", [("age", 1)], {"warm_share": 0.5, "mechanism": "range_tree"}, "warm_share"),
        ("people", [("age", 1)], {"epsilon": -1.0}, "epsilon"),
        ("people", [("age", 1)], {"epsilon": 100.0}, "budget exceeded"),
    ],
)
def test_bad_streams_are_refused_and_charge_nothing(people, table, columns, kwargs, message):
    database, _ = people
    arguments = {"epsilon": 1.0, **kwargs}
    with _connect(database) as session:
        with pytest.raises(Exception, match=message) as raised:
            session.open_stream(table, columns, **arguments)
        assert raised.type.__module__.startswith("dpsql")
        assert session.budget().for_analyst("alice").epsilon_spent == 0
        assert session.synopses() == []


def test_stream_names_are_unique_per_analyst_and_refused_before_the_charge(people) -> None:
    database, _ = people
    with _connect(database) as session:
        session.open_stream("people", [("age", 1)], epsilon=0.5, name="ages")
        entries = session.ledger()
        with pytest.raises(ParameterError, match="a stream named 'ages' exists already"):
            session.open_stream("people", [("age", 1)], epsilon=0.5, name="ages")
        assert session.ledger() == entries
        # Two openings of one name both pass the check before either is charged (as in two
        # sessions): the second charge's own transaction refuses it, and records nothing.
        desk = session._streams
        plans = [
            desk.plan(
                "people",
                [(column, 1)],
                mechanism="range_tree",
                epsilon=0.5,
                delta=0.0,
                updates=None,
                threshold=None,
                expected_queries=1000,
                name="incomes",
            )
            for column in ("income", "age")
        ]
        assert desk.build(plans[0], desk.charge(plans[0]))["name"] == "incomes"
        plan = plans[1]
        entries = session.ledger()
        with pytest.raises(ParameterError, match="a stream named 'incomes' exists already"):
            desk.charge(plan)
        assert session.ledger() == entries
        assert session.budget().for_analyst("alice").epsilon_spent == pytest.approx(1.0)
    with _connect(database, "bob") as session:
        # bob's names are his own: alice's "ages" neither blocks nor shows.
        mine = session.open_stream("people", [("age", 1)], epsilon=0.5, name="ages")
        assert mine["name"] == "ages"
        with pytest.raises(ParameterError) as refused:
            session.open_stream("people", [("nope", 1)], epsilon=0.5, name="incomes")
        assert "incomes" not in str(refused.value)
        assert [s["name"] for s in session.synopses()] == ["ages"]
        assert session.budget().for_analyst("bob").epsilon_spent == pytest.approx(0.5)


def _next_seq(database: Path) -> int:
    connection = sqlite3.connect(ledger_path(database))
    try:
        return connection.execute("SELECT MAX(seq) FROM entries").fetchone()[0] + 1
    finally:
        connection.close()


def test_another_analyst_cannot_take_an_automatic_name(people) -> None:
    """bob registers the name alice's next automatic stream will have: alice's opening still
    succeeds under that name, and each answers from their own stream."""
    database, frame = people
    with _connect(database, "bob") as bob:
        taken = f"people_age_range_tree_{_next_seq(database) + 1}"
        bob.open_stream("people", [("age", 10)], epsilon=0.5, mechanism="range_tree", name=taken)
    with _connect(database) as alice:
        opened = alice.open_stream("people", [("age", 1)], epsilon=0.5, mechanism="range_tree")
        assert opened["name"] == taken
        result = alice.execute("SELECT COUNT(*) AS n FROM people WHERE age BETWEEN 31 AND 33")
        assert result.mechanism == f"stream:{taken}" and result.epsilon == 0
        ((lower, upper),) = result.intervals["n"]
        assert lower <= int(frame.age.between(31, 33).sum()) <= upper
        # alice's own stream, not bob's (whose cells of 10 cannot answer 31..33).
        assert alice.ledger()[-1]["plan"] == {"stream": taken, "owner": "alice"}
    with _connect(database, "bob") as bob:
        assert [s["cells"] for s in bob.synopses()] == [10]


def test_an_automatic_name_the_analyst_holds_gets_a_suffix(people) -> None:
    database, _ = people
    with _connect(database) as session:
        taken = f"people_age_range_tree_{_next_seq(database) + 1}"
        session.open_stream(
            "people", [("income", 1)], epsilon=0.5, mechanism="range_tree", name=taken
        )
        opened = session.open_stream("people", [("age", 1)], epsilon=0.5, mechanism="range_tree")
        assert opened["name"] == f"{taken}_2"
        assert session.budget().for_analyst("alice").epsilon_spent == pytest.approx(1.0)


def test_a_store_with_global_names_is_keyed_by_analyst_on_opening(people) -> None:
    """A ledger file whose ``streams`` table predates per-analyst names (``name`` its primary
    key, no ``analyst``) opens; each stream belongs to the analyst who paid for it."""
    database, _ = people
    with _connect(database) as session:
        session.open_stream("people", [("age", 1)], epsilon=0.5, mechanism="range_tree", name="a")
    connection = sqlite3.connect(ledger_path(database))
    old = (
        "name, created, source_table, columns, mechanism, epsilon, delta, ledger_entry, params, "
        "data, state, answered"
    )
    connection.executescript(
        "ALTER TABLE streams RENAME TO newer;"
        "CREATE TABLE streams (name TEXT PRIMARY KEY, created TEXT NOT NULL, source_table TEXT "
        "NOT NULL, columns TEXT NOT NULL, mechanism TEXT NOT NULL, epsilon REAL NOT NULL, delta "
        "REAL NOT NULL, ledger_entry INTEGER NOT NULL, params TEXT NOT NULL, data BLOB NOT NULL, "
        "state TEXT NOT NULL, answered INTEGER NOT NULL DEFAULT 0);"
        f"INSERT INTO streams SELECT {old} FROM newer; DROP TABLE newer;"
    )
    connection.close()
    sql = "SELECT COUNT(*) FROM people WHERE age < 40"
    with _connect(database) as session:
        assert session.execute(sql).mechanism == "stream:a"
    with _connect(database, "bob") as session:
        assert session.synopses() == []
        assert session.open_stream("people", [("age", 1)], epsilon=0.5, name="a")["name"] == "a"
    (owner,) = StreamStore(ledger_path(database)).all("alice")
    assert (owner.name, owner.analyst) == ("a", "alice")


def test_cli_stream_open_and_synopses(people, capsys) -> None:
    database, _ = people
    args = ["stream", "open", "--db", str(database), "--analyst", "alice", "--table", "people"]
    assert (
        main(
            [
                *args,
                "--column",
                "age:5",
                "--mechanism",
                "range_tree",
                "--epsilon",
                "0.5",
                "--format",
                "json",
            ]
        )
        == 0
    )
    opened = json.loads(capsys.readouterr().out)
    assert opened["columns"][0]["width"] == 5 and opened["cells"] == 20
    assert main(["synopses", "--db", str(database), "--format", "json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["name"] == opened["name"] and listed["mechanism"] == "range_tree"
    assert main([*args, "--column", "age:x", "--epsilon", "0.5"]) == 1  # the engine refuses
    cold = ["--column", "income:1", "--epsilon", "0.05", "--warm-share", "0"]
    assert main([*args, *cold]) == 0
    out = capsys.readouterr().out
    assert "it will state errors of about" in out and "warning: this stream will state" in out


def _ask_ten(database: str) -> int:
    """Ten stream answers in one process (module level: picklable for a process pool)."""
    import dpsql

    with dpsql.connect(database, analyst="alice") as session:
        for low in range(0, 80, 8):
            session.execute(f"SELECT COUNT(*) FROM people WHERE age BETWEEN {low} AND 99")
    return 10


def test_processes_in_parallel_share_one_stream_state(people) -> None:
    """Two processes answer from one PMW stream at the same time: every answer is one committed
    step of the same stored state (queries seen = answers given = ledger entries)."""
    import multiprocessing

    database, _ = people
    with _connect(database) as session:
        session.open_stream("people", [("age", 1)], epsilon=1.0, updates=40)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        assert pool.map(_ask_ten, [str(database)] * 2) == [10, 10]
    store = StreamStore(ledger_path(database))
    (stored,) = store.all()
    store.close()
    state = PMWState.from_parts(stored.state, stored.data)
    assert stored.answered == state.sparse[2] == 20
    assert len(state.measurements) == state.sparse[1] <= 40
    with _connect(database) as session:
        assert [e["mechanism"] for e in session.ledger()].count("stream") == 20


def test_options_mechanism_opens_a_stream_on_a_first_query(people) -> None:
    """OPTIONS(mechanism='range_tree'|'pmw') on a COUNT(*) no stream answers opens one over the
    WHERE's columns at the query's epsilon (one charge), answers from it, and later queries use
    it for free; EXPLAIN says what would be opened and what it costs."""
    database, frame = people
    first = (
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=0.5, mechanism='range_tree') "
        "COUNT(*) AS n FROM people WHERE age BETWEEN 20 AND 29"
    )
    with _connect(database) as session:
        plan = session.explain(first)
        assert plan["plan"]["opens"]["columns"][0]["name"] == "age"
        assert plan["cost"]["epsilon"] == 0.5
        assert session.budget().for_analyst("alice").epsilon_spent == 0
        answer = session.execute(first)
        opened = answer.details["opened_stream"]
        assert (
            opened["mechanism"] == "range_tree" and answer.mechanism == f"stream:{opened['name']}"
        )
        ((lower, upper),) = answer.intervals["n"]
        assert lower <= int(frame.age.between(20, 29).sum()) <= upper
        later = session.execute(
            "SELECT COUNT(*) FROM people WHERE age >= 50", mechanism="range_tree"
        )
        assert "opened_stream" not in later.details and later.epsilon == 0
        assert session.budget().for_analyst("alice").epsilon_spent == pytest.approx(0.5)
        pmw = session.execute(
            "SELECT COUNT(*) FROM people WHERE age < 50 AND income < 40",
            mechanism="pmw",
            epsilon=0.5,
        )
        assert pmw.details["opened_stream"]["key_column"] == "age, income"
        total = session.execute("SELECT COUNT(*) FROM people", mechanism="pmw")
        assert total.mechanism == pmw.mechanism  # the new PMW stream answers the total too
        with pytest.raises(UnsupportedQueryError, match="opens a stream"):
            session.execute(
                "SELECT age, COUNT(*) FROM people GROUP BY age", mechanism="pmw", epsilon=0.5
            )
        with pytest.raises(UnsupportedQueryError, match="declared bounds"):
            session.execute(
                "SELECT COUNT(*) FROM people WHERE city = 'a'", mechanism="pmw", epsilon=0.5
            )
        assert session.budget().for_analyst("alice").epsilon_spent == pytest.approx(1.0)


def test_pmw_streams_have_bounded_state(people) -> None:
    database, _ = people
    with _connect(database) as session:
        wide = (StreamColumn("a", "BIGINT", 0, 999, 1), StreamColumn("b", "BIGINT", 0, 99, 1))
        with pytest.raises(ParameterError, match="at most 65536 cells"):
            stream_params(
                "pmw",
                wide,
                epsilon=1.0,
                delta=0.0,
                sensitivity=1,
                updates=None,
                threshold=None,
                expected_queries=1000,
            )
        with pytest.raises(ParameterError, match=r"updates must be an integer in \[1, 1000\]"):
            session.open_stream("people", [("age", 1)], epsilon=1.0, updates=1001)


class _LockWatchingBackend:
    """The database, noting every ``run`` made while a connection holds the ledger file's write
    lock (found by trying to take that lock without waiting)."""

    def __init__(self, database: Path):
        self._inner = DuckDBBackend.for_policy(database, show_policy(database))
        self._ledger = ledger_path(database)
        self.dialect = self._inner.dialect
        self.reads: list[tuple[str, bool]] = []

    def catalog(self) -> dict[str, dict[str, str]]:
        return self._inner.catalog()

    def run(self, sql: str) -> pd.DataFrame:
        probe = sqlite3.connect(self._ledger, timeout=0, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            locked = False
        except sqlite3.OperationalError:
            locked = True
        finally:
            probe.close()
        self.reads.append((sql, locked))
        return self._inner.run(sql)

    def close(self) -> None:
        self._inner.close()


class _ReadsInsideTheLock(StreamDesk):
    """The deliberately broken twin: the old ordering, reading the histogram inside the step
    that ``StreamStore.advance`` runs under the ledger file's write lock."""

    def _ask(self, stream, selected, confidence):
        advance = self._store.advance

        def reading_inside(name, step):
            def step_reading(current):
                self._histograms.clear()  # as before: nothing read before the lock
                self._histogram_for(current)
                return step(current)

            return advance(name, step_reading)

        self._store.advance = reading_inside  # type: ignore[method-assign]
        try:
            return super()._ask(stream, selected, confidence)
        finally:
            self._store.advance = advance  # type: ignore[method-assign]


@pytest.mark.parametrize("twin", [False, True])
def test_a_pmw_stream_in_a_new_session_reads_no_data_inside_the_ledger_lock(people, twin):
    """A new session answering from a stored PMW stream re-reads its histogram before the
    state's write transaction: no backend ``run`` happens while the ledger file is locked. The
    broken twin (``_ReadsInsideTheLock``, twin=True) reads inside it and is caught."""
    database, _ = people
    with _connect(database) as session:
        session.open_stream("people", [("age", 1)], epsilon=1.0, updates=20)
    backend = _LockWatchingBackend(database)
    rng = np.random.default_rng(3)
    with seeded(Session, database, analyst="alice", backend=backend, rng=rng) as session:
        if twin:
            session._streams.__class__ = _ReadsInsideTheLock
        result = session.execute("SELECT COUNT(*) FROM people WHERE age < 50")
        assert result.mechanism.startswith("stream:") and result.epsilon == 0
    histogram_reads = [locked for sql, locked in backend.reads if "row_number()" in sql]
    assert histogram_reads  # the histogram was read in this session
    assert any(locked for _, locked in backend.reads) == twin


def test_queries_go_to_the_stream_stating_the_smallest_error(people) -> None:
    """A 1-D range tree, then a 2-D PMW over the same column: 1-D ranges stay with the tree,
    with the same intervals as before the PMW was opened (the PMW's larger stated error is
    named), 2-D queries go to the PMW; no PMW interval is wider than the table."""
    database, frame = people
    ranges = [(30, 39), (0, 49), (17, 17), (50, 80)]

    def ask(session, low, high):
        sql = f"SELECT COUNT(*) AS n FROM people WHERE age BETWEEN {low} AND {high}"
        return session.execute(sql)

    with _connect(database) as session:
        tree = session.open_stream("people", [("age", 1)], epsilon=1.0, mechanism="range_tree")
        before = [ask(session, *r) for r in ranges]
        pmw = session.open_stream("people", [("age", 1), ("income", 1)], epsilon=1.0)
        assert pmw["stated_error"]["stated"] < ROWS and not pmw["stated_error"]["warnings"]
        after = [ask(session, *r) for r in ranges]
        for first, second in zip(before, after, strict=True):
            assert second.details["routing"]["answered_by"] == tree["name"]
            assert second.intervals == first.intervals
            stated = second.details["routing"]["stated_errors"]
            assert stated[tree["name"]] < stated[pmw["name"]]
            assert pmw["name"] in second.details["routing"]["why"]
        two = session.execute("SELECT COUNT(*) AS n FROM people WHERE age < 40 AND income >= 20")
        assert two.details["routing"]["answered_by"] == pmw["name"]
        ((low, high),) = two.intervals["n"]
        truth = int(((frame.age < 40) & (frame.income >= 20)).sum())
        assert 0 <= low <= truth <= high and high - low < ROWS
        plan = session.explain("SELECT COUNT(*) FROM people WHERE age < 40")
        assert "smallest error" in plan["plan"]["why"] and plan["plan"]["stated_error"] > 0


def test_opening_states_the_error_and_warns_when_it_is_wider_than_the_table(people) -> None:
    """Without a warm start, a PMW's bound after its expected queries is far wider than the
    table: opening says so (before the charge, in EXPLAIN of an opening, and after)."""
    database, _ = people
    with _connect(database) as session:
        opened = session.open_stream(
            "people", [("age", 1)], epsilon=0.05, warm_share=0.0, expected_queries=500
        )
        stated = opened["stated_error"]
        assert stated["alpha_after_expected_queries"] == stated["stated"] > ROWS
        (warning,) = stated["warnings"]
        assert "released total" in warning and "range_tree" in warning
        tree = session.open_stream("people", [("income", 1)], epsilon=1.0, mechanism="range_tree")
        assert not tree["stated_error"]["warnings"]
        assert tree["stated_error"]["tree_whole_domain"] < tree["stated_error"]["tree_inner_range"]


@pytest.mark.parametrize(
    "where",
    [
        "",
        "WHERE age BETWEEN 1 AND 5",
        "WHERE (age < 5 AND age > 1)",
        "WHERE NOT (age < 5)",
        "WHERE age < 5 AND city = 'a'",
        "WHERE age < 5 OR city = 'a'",
        "WHERE city = 'a'",
        "WHERE income < 5 AND age > 1",
    ],
)
def test_a_stream_answers_exactly_the_queries_its_fixed_filter_matches(people, where) -> None:
    """``answerable``: the WHERE's conjuncts outside the stream's columns, in canonical form,
    are the stream's fixed filter (none without one, which is decided without writing them)."""
    from dpsql.engine.streams import answerable, fixed_filter, split_where

    database, _ = people
    with _connect(database) as session:
        session.open_stream("people", [("age", 1)], epsilon=1.0, mechanism="range_tree")
        session.open_stream(
            "people", [("age", 1)], epsilon=1.0, mechanism="range_tree", filter="city = 'a'"
        )
        streams = session._streams._store.for_table("people")
        assert sorted(len(fixed_filter(s)) for s in streams) == [0, 1]
        shape = session.bind(f"SELECT COUNT(*) FROM people {where}").bound.shape
        for stream in streams:
            _, fixed = split_where(shape.where, {c.name for c in stream.columns})
            assert answerable(shape, stream) == (fixed == fixed_filter(stream))
