"""mad2r in one read of the data: round 1's ranked cells kept in a private temporary
table for the query, round 2 read from them. The release is the one the two-read path gives
(same seed), and the table is gone after the query however it ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import dpsql
from dpsql.engine.backends import SCRATCH_PREFIX, DuckDBBackend, Scratch
from dpsql.engine.plans import keys as keys_module
from dpsql.engine.session import database_ledger
from dpsql.errors import ExecutionError, ParameterError
from tests.conftest import make_database, seeded
from tests.engine.test_key_mechanisms import POLICY, zipf_visits

QUERY = "SELECT url, COUNT(*) FROM visits GROUP BY url"


class TwoReads:
    """A DuckDB backend without ``scratch``: the session falls back to reading the rows twice."""

    dialect = "duckdb"

    def __init__(self, backend: DuckDBBackend):
        self.backend = backend
        self.sqls: list[str] = []

    def catalog(self) -> dict[str, dict[str, str]]:
        return self.backend.catalog()

    def run(self, sql: str) -> pd.DataFrame:
        self.sqls.append(sql)
        return self.backend.run(sql)

    def close(self) -> None:
        self.backend.close()


def _leftovers(backend: DuckDBBackend) -> list[str]:
    frame = backend.run(
        "SELECT table_name AS name FROM duckdb_tables() UNION ALL "
        "SELECT view_name FROM duckdb_views() WHERE NOT internal"
    )
    return [n for n in frame["name"] if n.lower().startswith(SCRATCH_PREFIX)]


def _visits(integer: bool) -> pd.DataFrame:
    frame = zipf_visits(2_000, seed=11)
    # Persons with far more keys than max_groups_per_unit (10): round 2 re-chooses theirs.
    many = pd.DataFrame(
        {"user_id": np.repeat([10**6, 10**6 + 1], 30), "url": [f"/p/{i}" for i in range(60)]}
    )
    frame = pd.concat([frame, many], ignore_index=True).drop_duplicates()
    if integer:
        frame["url"] = frame["url"].str.slice(3).astype("int64") * 3 - 10**12
    return frame


def _session(database: Path, backend: Any, seed: int) -> dpsql.Session:
    """A session on ``backend`` (closing it closes the backend)."""
    rng = np.random.default_rng(seed)
    return seeded(dpsql.Session, database, analyst="a", backend=backend, rng=rng)


def _release(db: dpsql.Session) -> Any:
    return db.execute(QUERY, epsilon=2.0, delta=1e-6, mechanism="mad2r")


@pytest.mark.parametrize("integer", [False, True], ids=["text keys", "integer keys"])
def test_one_read_releases_what_two_reads_release_with_the_same_seed(
    tmp_path: Path, integer: bool
) -> None:
    database = make_database(tmp_path / "v.duckdb", {"visits": _visits(integer)}, POLICY)
    for seed in (1, 2, 3):
        one = DuckDBBackend(database)
        with _session(database, one, seed) as db:
            kept = _release(db)
            assert _leftovers(one) == []
        two = TwoReads(DuckDBBackend(database))
        with _session(database, two, seed) as db:
            read_twice = _release(db)
        reads = [sql for sql in two.sqls if "__group_rank" in sql]
        assert len(reads) == 2 and " NOT " in reads[1]  # the fallback read the rows again
        assert kept.rows == read_twice.rows and kept.intervals == read_twice.intervals
        assert kept.mechanism == "mad2r" and len(kept.rows) > 0


def test_the_cells_are_dropped_when_round_two_fails_and_the_charge_stands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = make_database(tmp_path / "v.duckdb", {"visits": _visits(False)}, POLICY)
    backend = DuckDBBackend(database)
    seen: list[list[str]] = []

    def broken(cells: str, found: str, column: str, weights: Any) -> str:
        seen.append(_leftovers(backend))  # both tables exist while round 2 runs
        return f'SELECT "no such column" FROM "{cells}"'

    monkeypatch.setattr(keys_module, "second_round_weights", broken)
    charged = len(database_ledger(database))
    with _session(database, backend, 4) as db:
        with pytest.raises(ExecutionError):
            _release(db)
        assert len(seen) == 1 and len(seen[0]) == 2
        assert _leftovers(backend) == []
    assert len(database_ledger(database)) == charged + 1


def test_the_cells_are_dropped_when_the_query_is_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = make_database(tmp_path / "v.duckdb", {"visits": _visits(False)}, POLICY)
    backend = DuckDBBackend(database)

    def interrupted(*args: Any) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(keys_module, "second_round_weights", interrupted)
    with _session(database, backend, 5) as db:
        with pytest.raises(KeyboardInterrupt):
            _release(db)
        assert _leftovers(backend) == []
        monkeypatch.undo()
        assert _release(db).mechanism == "mad2r"  # the backend still answers
        assert _leftovers(backend) == []


def test_sessions_sharing_a_backend_use_their_own_tables_which_analysts_cannot_see(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = POLICY + "[analysts.b]\nepsilon = 100.0\ndelta = 1e-4\n"
    database = make_database(tmp_path / "v.duckdb", {"visits": _visits(False)}, policy)
    backend = DuckDBBackend(database)
    names: list[str] = []
    catalogs: list[set[str]] = []
    table = Scratch.table

    def spy(self: Any, sql: str, progress: Any = None) -> str:
        name = table(self, sql, progress)
        names.append(name)
        catalogs.append(set(backend._read_catalog()))
        return name

    monkeypatch.setattr(Scratch, "table", spy)
    rng = np.random.default_rng(6)
    first = seeded(dpsql.Session, database, analyst="a", backend=backend, rng=rng)
    second = seeded(dpsql.Session, database, analyst="b", backend=backend, rng=rng)
    for db in (first, second, first):
        db.execute(QUERY, epsilon=1.0, delta=1e-6, mechanism="mad2r")
        assert _leftovers(backend) == []
        with pytest.raises(Exception, match=r"visits|table"):
            db.execute(f'SELECT COUNT(*) FROM "{names[-1]}"', epsilon=1.0)
    assert len(set(names)) == 3 and all(n.startswith(SCRATCH_PREFIX) for n in names)
    assert catalogs == [{"visits"}] * 3  # the cells exist, but not in the catalog
    with pytest.raises(ParameterError, match="dpsql's own"):
        backend.register(f"{SCRATCH_PREFIX}mine", pd.DataFrame({"x": [1]}))
    first.close()
    second.close()
    backend.close()


def test_nothing_is_left_when_materialising_the_cells_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = make_database(tmp_path / "v.duckdb", {"visits": _visits(True)}, POLICY)
    backend = DuckDBBackend(database)
    monkeypatch.setattr(keys_module, "ranked_cells", lambda *a, **k: "SELECT 1 / 'x'")
    with _session(database, backend, 7) as db:
        with pytest.raises(ExecutionError):
            _release(db)
        assert _leftovers(backend) == []


def test_a_progress_callback_sees_the_stages_and_the_cells_are_dropped(tmp_path: Path) -> None:
    """With a callback, DuckDB runs each statement (the materialising one too) in a worker
    thread that reports its progress."""
    database = make_database(tmp_path / "v.duckdb", {"visits": _visits(False)}, POLICY)
    backend = DuckDBBackend(database)
    stages: list[str] = []
    with _session(database, backend, 8) as db:
        db.progress = lambda stage, fraction: stages.append(stage)
        assert _release(db).mechanism == "mad2r"
        assert _leftovers(backend) == []
    assert list(dict.fromkeys(stages)) == [
        "reading data",
        "aggregating cells",
        "building mad2r release",
        "reading round 2",
        "done",
    ]
