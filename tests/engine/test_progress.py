"""Progress reporting: DuckDB's estimate from a worker thread, errors and Ctrl-C, session stages."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pandas as pd
import pytest

import dpsql
from dpsql.engine.backends import DuckDBBackend, Rows
from dpsql.engine.progress import accepts_progress, run_duckdb
from dpsql.engine.spark import SparkBackend
from dpsql.errors import ExecutionError
from tests.conftest import seeded, seeded_connect

# About a second in DuckDB on two cores: long enough to be polled a few times at 0.1 s.
SLOW_SQL = (
    "SELECT i % 1000 AS k, COUNT(*) AS n, SUM(i) AS s FROM range(40000000) t(i) "
    "GROUP BY k ORDER BY k"
)
# Minutes of work: only ever run to be interrupted.
ENDLESS_SQL = "SELECT i % 7 AS k, SUM(i) AS s FROM range(100000000000) t(i) GROUP BY k"


class Recorder:
    """A progress callback that keeps every report."""

    def __init__(self) -> None:
        self.reports: list[tuple[str, float | None]] = []

    def __call__(self, stage: str, fraction: float | None) -> None:
        self.reports.append((stage, fraction))

    def stages(self) -> list[str]:
        """Stages in the order first reported."""
        return list(dict.fromkeys(stage for stage, _ in self.reports))


def _query_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dpsql-duckdb-query"]


@pytest.fixture
def memory_backend() -> Iterator[DuckDBBackend]:
    backend = DuckDBBackend(None)
    yield backend
    backend.close()


def test_duckdb_reports_monotone_fractions_and_the_same_frame(memory_backend) -> None:
    recorder = Recorder()
    with_progress = memory_backend.run(SLOW_SQL, progress=recorder)
    without = memory_backend.run(SLOW_SQL)
    pd.testing.assert_frame_equal(with_progress, without)
    assert {stage for stage, _ in recorder.reports} == {"reading data"}
    assert recorder.reports[0] == ("reading data", None)
    fractions = [f for _, f in recorder.reports[1:]]
    assert None not in fractions
    assert all(0.0 <= f <= 1.0 for f in fractions)
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert any(0.0 < f < 1.0 for f in fractions), "DuckDB's estimate was never sampled"
    assert _query_threads() == []


def test_errors_propagate_unchanged_and_name_no_row_values(memory_backend) -> None:
    memory_backend.register("values", pd.DataFrame({"text": ["4242"]}))
    failing = "SELECT CAST(text AS INTEGER) / 0 * CAST(text AS DATE) FROM values"
    # Fails midway through a long scan, in the worker thread.
    midway = (
        "SELECT SUM(CAST(CASE WHEN i = 30000000 THEN 'x4242' ELSE '1' END AS INTEGER)) "
        "FROM range(40000000) t(i)"
    )
    for sql in (failing, midway):
        with pytest.raises(ExecutionError, match="the charge stands") as caught:
            memory_backend.run(sql, progress=Recorder())
        assert "4242" not in str(caught.value)
        assert caught.value.__context__ is None  # no chain carries the message
    with pytest.raises(duckdb.ConversionException, match="x4242"):  # the helper hides nothing
        run_duckdb(memory_backend._connection, midway, Recorder())
    assert _query_threads() == []
    assert memory_backend.run("SELECT 42 AS x", progress=Recorder())["x"].tolist() == [42]


def test_keyboard_interrupt_while_polling_stops_the_query(memory_backend) -> None:
    def interrupt_at_first_estimate(stage: str, fraction: float | None) -> None:
        if fraction is not None:
            raise KeyboardInterrupt

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        memory_backend.run(ENDLESS_SQL, progress=interrupt_at_first_estimate)
    assert time.monotonic() - started < 20.0  # the whole query would take minutes
    assert _query_threads() == []
    assert memory_backend.run("SELECT 1 AS x", progress=Recorder())["x"].tolist() == [1]


def test_ctrl_c_while_waiting_stops_the_query(memory_backend) -> None:
    """A real SIGINT, delivered to the main thread while it waits for the worker. Python's
    own handler is installed for the test: a process started in the background by a
    non-interactive shell inherits SIGINT ignored, and the signal would then never arrive."""
    main = threading.main_thread()
    assert threading.current_thread() is main
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.5, signal.pthread_kill, (main.ident, signal.SIGINT))
    started = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            memory_backend.run(ENDLESS_SQL, progress=Recorder())
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - started < 20.0
    assert _query_threads() == []
    assert memory_backend.run("SELECT 2 AS x")["x"].tolist() == [2]


def test_session_reports_stages_after_the_charge(demo_db: Path, rng) -> None:
    with seeded_connect(demo_db, analyst="alice", rng=rng) as db:
        spent_before = db.budget().for_analyst("alice").epsilon_spent
        spent: list[float] = []
        recorder = Recorder()

        def progress(stage: str, fraction: float | None) -> None:
            spent.append(db.budget().for_analyst("alice").epsilon_spent)
            recorder(stage, fraction)

        db.progress = progress
        db.execute("SELECT country, COUNT(*) FROM requests GROUP BY country", epsilon=0.5)
        assert recorder.stages() == ["reading data", "adding noise", "done"]
        assert spent[0] == pytest.approx(spent_before + 0.5)  # charged before any read
        assert recorder.reports[-1] == ("done", 1.0)

        recorder.reports.clear()
        db.execute(
            "SELECT url, COUNT(*) FROM requests GROUP BY url",
            epsilon=1.0,
            delta=1e-8,
            mechanism="threshold",
        )
        assert recorder.stages() == ["reading data", "building threshold release", "done"]


class SqlOnly:
    """A third-party backend written against ``run(sql)``: no progress keyword."""

    def __init__(self, inner: DuckDBBackend) -> None:
        self.inner = inner
        self.dialect = inner.dialect
        self.calls = 0

    def catalog(self) -> dict[str, dict[str, str]]:
        return self.inner.catalog()

    def run(self, sql: str) -> pd.DataFrame:
        self.calls += 1
        return self.inner.run(sql)

    def close(self) -> None:
        self.inner.close()


def test_a_backend_without_a_progress_keyword_still_works(demo_db: Path, rng) -> None:
    backend = SqlOnly(DuckDBBackend(demo_db))
    assert not accepts_progress(backend.run) and accepts_progress(backend.inner.run)
    recorder = Recorder()
    with seeded(
        dpsql.Session, demo_db, analyst="alice", backend=backend, rng=rng, progress=recorder
    ) as db:
        result = db.execute("SELECT COUNT(*) AS n FROM requests", epsilon=0.5)
    assert backend.calls == 1 and len(result.rows) == 1
    assert recorder.reports == [("reading data", None), ("adding noise", None), ("done", 1.0)]


class Spy(DuckDBBackend):
    """Records whether each run was given a progress callback."""

    given: list[bool]

    def run(self, sql: str, progress=None) -> pd.DataFrame:
        self.given = [*getattr(self, "given", []), progress is not None]
        return super().run(sql, progress=progress)

    def rows(self, sql: str, progress=None) -> Rows:
        if progress is not None:  # read through run, which records it
            return super().rows(sql, progress)
        self.given = [*getattr(self, "given", []), False]
        return super().rows(sql)


def test_without_a_callback_the_backend_runs_as_before(demo_db: Path, rng) -> None:
    sql = "SELECT COUNT(*) AS n FROM requests"
    for progress, given in ((None, [False]), (Recorder(), [True])):
        backend = Spy(demo_db)
        with seeded(
            dpsql.Session, demo_db, analyst="alice", backend=backend, rng=rng, progress=progress
        ) as db:
            db.execute(sql, epsilon=0.1)
        assert backend.given == given


class FakeSpark:
    """Just enough of a SparkSession for ``SparkBackend.run``."""

    def __init__(self, frame: pd.DataFrame | None) -> None:
        self.frame = frame

    def sql(self, sql: str) -> FakeSpark:
        return self

    def toPandas(self) -> pd.DataFrame:
        if self.frame is None:
            raise RuntimeError("row value 4242 is not a number")
        return self.frame


def test_spark_reports_unknown_then_done() -> None:
    frame = pd.DataFrame({"n": [3]})
    recorder = Recorder()
    backend = SparkBackend(FakeSpark(frame))  # type: ignore[arg-type]
    assert backend.run("SELECT 3 AS n", progress=recorder) is frame
    assert recorder.reports == [("reading data", None), ("reading data", 1.0)]
    assert backend.run("SELECT 3 AS n") is frame
    recorder.reports.clear()
    failing = SparkBackend(FakeSpark(None))  # type: ignore[arg-type]
    with pytest.raises(ExecutionError, match="the charge stands") as caught:
        failing.run("SELECT 1", progress=recorder)
    assert "4242" not in str(caught.value)
    assert recorder.reports == [("reading data", None)]
