"""Tables read from Parquet and CSV files: answered end to end, and no other file is readable."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

import dpsql
from dpsql.engine import session as session_module
from dpsql.engine.backends import DuckDBBackend
from dpsql.engine.policy import Policy, parse_policy
from dpsql.engine.sources import FileSource, file_source, infer_format, policy_sources
from dpsql.errors import ExecutionError, PolicyError, QueryError
from tests.conftest import seeded

EPSILON = 1000.0
"""Per query: counts get discrete Laplace noise of scale 1/1000, 0 with probability > 1 - 1e-9,
so counts below are exact; sums are within a fraction of a unit."""

POLICY = """
[dataset]
epsilon = 1000000.0
[analysts.alice]
epsilon = 1000000.0
[tables.events]
privacy_unit = "user_id"
source = "lake/events/part-*.parquet"
[tables.events.columns.country]
public_keys = ["DK", "NO", "SE", "IS"]
[tables.visits]
privacy_unit = "user_id"
source = "lake/visits.csv"
source_columns = [["user_id", "BIGINT"], ["seconds", "BIGINT"]]
[tables.visits.columns.seconds]
bounds = [0, 50]
"""


def set_policy_with(
    database: Path, policy: Policy | str, make_backend: Callable[[], DuckDBBackend]
) -> None:
    """``dpsql.set_policy``, checking the schema against ``make_backend()``.

    ``set_policy`` opens ``DuckDBBackend(database)``, which does not know a policy's sources or
    frames registered from Python; this stands in for it until the engine opens
    ``DuckDBBackend.for_policy(database, policy)`` there itself.
    """

    class Opened:
        def __new__(cls, *args: object, **kwargs: object) -> DuckDBBackend:  # type: ignore[misc]
            return make_backend()

        @staticmethod
        def for_policy(*args: object, **kwargs: object) -> DuckDBBackend:
            return make_backend()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(session_module, "DuckDBBackend", Opened)
        dpsql.set_policy(database, policy)


def _write(frame: pd.DataFrame, path: Path) -> None:
    """Write ``frame`` as Parquet or CSV (by extension) with DuckDB."""
    path.parent.mkdir(parents=True, exist_ok=True)
    connection = duckdb.connect()
    try:
        connection.register("frame", frame)
        options = "(FORMAT parquet)" if path.suffix == ".parquet" else "(FORMAT csv, HEADER)"
        connection.execute(f"COPY frame TO '{path}' {options}")
    finally:
        connection.close()


@pytest.fixture
def lake(tmp_path: Path) -> dict[str, pd.DataFrame]:
    """Two Parquet parts of ``events`` (plus a stray Parquet file the glob does not match), a CSV
    of ``visits``, and a secret CSV beside them. One row per user, so no bound binds."""
    rng = np.random.default_rng(7)
    events = pd.DataFrame(
        {
            "user_id": np.arange(600, dtype=np.int64),
            "country": rng.choice(["DK", "NO", "SE"], 600),
        }
    )
    visits = pd.DataFrame(
        {"user_id": np.arange(300, dtype=np.int64), "seconds": rng.integers(0, 80, 300)}
    )
    _write(events.iloc[:250], tmp_path / "lake" / "events" / "part-0.parquet")
    _write(events.iloc[250:], tmp_path / "lake" / "events" / "part-1.parquet")
    _write(events.iloc[:5], tmp_path / "lake" / "events" / "stray.parquet")
    _write(visits, tmp_path / "lake" / "visits.csv")
    _write(pd.DataFrame({"secret": [42]}), tmp_path / "lake" / "secret.csv")
    return {"events": events, "visits": visits}


def _session(database: Path, policy: str) -> dpsql.Session:
    parsed = parse_policy(policy)
    set_policy_with(database, parsed, lambda: DuckDBBackend.for_policy(database, parsed))
    return seeded(
        dpsql.Session,
        database,
        analyst="alice",
        backend=DuckDBBackend.for_policy(database, parsed),
        rng=np.random.default_rng(1),
    )


def test_parquet_glob_and_csv_answer_queries_end_to_end(tmp_path: Path, lake) -> None:
    database = tmp_path / "warehouse.duckdb"  # no such file: the sources are the whole dataset
    with _session(database, POLICY) as db:
        assert db.backend.catalog() == {
            "events": {"user_id": "BIGINT", "country": "VARCHAR"},
            "visits": {"user_id": "BIGINT", "seconds": "BIGINT"},
        }
        grouped = db.execute(
            "SELECT country, COUNT(*) AS n FROM events GROUP BY country", epsilon=EPSILON
        )
        total = db.execute("SELECT SUM(seconds) AS s FROM visits", epsilon=EPSILON)
        spent = db.budget().for_analyst("alice")
    truth = lake["events"]["country"].value_counts()
    assert grouped.rows == [(c, int(truth.get(c, 0))) for c in ("DK", "NO", "SE", "IS")]
    assert total.rows[0][0] == pytest.approx(lake["visits"]["seconds"].clip(0, 50).sum(), abs=1)
    assert spent is not None and spent.epsilon_spent == pytest.approx(2 * EPSILON)


def test_sources_sit_beside_the_tables_of_a_database(tmp_path: Path, lake) -> None:
    database = tmp_path / "warehouse.duckdb"
    connection = duckdb.connect(str(database))
    connection.execute("CREATE TABLE users AS SELECT range AS user_id FROM range(40)")
    connection.close()
    policy = POLICY + '[tables.users]\nprivacy_unit = "user_id"\n'
    with _session(database, policy) as db:
        assert set(db.backend.catalog()) == {"events", "users", "visits"}
        users = db.execute("SELECT COUNT(*) FROM users", epsilon=EPSILON)
        events = db.execute("SELECT COUNT(*) FROM events", epsilon=EPSILON)
    assert (users.rows, events.rows) == ([(40,)], [(600,)])


def test_no_other_file_is_readable(tmp_path: Path, lake) -> None:
    database = tmp_path / "warehouse.duckdb"
    lake_dir = tmp_path / "lake"
    with _session(database, POLICY) as db:
        before = db.budget().for_analyst("alice")
        for sql in (
            f"SELECT COUNT(*) FROM read_csv('{lake_dir / 'secret.csv'}')",
            f"SELECT COUNT(*) FROM '{lake_dir / 'secret.csv'}'",
        ):
            with pytest.raises(QueryError):
                db.execute(sql, epsilon=1.0)
        assert db.budget().for_analyst("alice") == before  # refused before any charge

        # Even SQL that reached the database directly could not read another file.
        for sql in (
            f"SELECT * FROM read_csv('{lake_dir / 'secret.csv'}')",
            f"SELECT * FROM read_parquet('{lake_dir / 'events' / 'stray.parquet'}')",
            f"SELECT * FROM read_parquet('{lake_dir / 'events' / '*.parquet'}')",
            f"SELECT * FROM glob('{lake_dir / '*'}')",
            f"SELECT * FROM read_csv('{lake_dir / 'events' / '..' / 'secret.csv'}')",
            "SET enable_external_access = true",
            f"SET allowed_paths = ['{lake_dir / 'secret.csv'}']",
            f"COPY (SELECT 1) TO '{lake_dir / 'visits.csv'}'",
        ):
            with pytest.raises(ExecutionError) as caught:
                db.backend.run(sql)
            assert "42" not in str(caught.value)
    assert (lake_dir / "visits.csv").read_text().startswith("user_id,seconds")


def test_files_are_listed_when_the_backend_opens(tmp_path: Path, lake) -> None:
    database = tmp_path / "warehouse.duckdb"
    with _session(database, POLICY) as db:
        _write(lake["events"].iloc[:10], tmp_path / "lake" / "events" / "part-2.parquet")
        assert db.execute("SELECT COUNT(*) FROM events", epsilon=EPSILON).rows == [(600,)]
    parsed = parse_policy(POLICY)
    backend = DuckDBBackend.for_policy(database, parsed)
    try:
        assert backend.run("SELECT COUNT(*) AS n FROM events")["n"].tolist() == [610]
    finally:
        backend.close()


def test_relative_sources_resolve_against_the_database_directory(tmp_path: Path, lake) -> None:
    sources = policy_sources(parse_policy(POLICY), tmp_path / "warehouse.duckdb")
    assert sources == [
        FileSource(
            "events",
            (
                (tmp_path / "lake/events/part-0.parquet").resolve(),
                (tmp_path / "lake/events/part-1.parquet").resolve(),
            ),
            "parquet",
        ),
        FileSource(
            "visits",
            ((tmp_path / "lake/visits.csv").resolve(),),
            "csv",
            (("user_id", "BIGINT"), ("seconds", "BIGINT")),
        ),
    ]
    assert file_source("t", str(tmp_path / "lake" / "*.csv"), columns=[("a", "INT")]).files == (
        (tmp_path / "lake/secret.csv").resolve(),
        (tmp_path / "lake/visits.csv").resolve(),
    )
    assert [infer_format(p) for p in ("a.parquet", "a.pq", "b.tsv.gz", "c.txt")] == [
        "parquet",
        "parquet",
        "csv",
        None,
    ]


def test_an_explicit_format_reads_files_without_an_extension(tmp_path: Path, lake) -> None:
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "visits.txt").write_text((tmp_path / "lake" / "visits.csv").read_text())
    policy = POLICY.replace('"lake/visits.csv"', '"raw/*"\nsource_format = "csv"')
    with _session(tmp_path / "warehouse.duckdb", policy) as db:
        assert db.execute("SELECT COUNT(*) FROM visits", epsilon=EPSILON).rows == [(300,)]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("lake/visits.csv", "lake/nothing-*.csv"), "matches no files"),
        (("lake/visits.csv", "lake/visits.*"), "cannot tell the format"),
        (('source = "lake/visits.csv"', 'source_format = "csv"'), "source_format is set but"),
    ],
)
def test_bad_sources_are_refused_when_the_policy_is_set(
    tmp_path: Path, lake, change: tuple[str, str], message: str
) -> None:
    policy = parse_policy(POLICY.replace(*change))
    with pytest.raises(PolicyError, match=message):
        DuckDBBackend.for_policy(tmp_path / "warehouse.duckdb", policy)


def test_a_source_may_not_shadow_a_table_of_the_database(tmp_path: Path, lake) -> None:
    database = tmp_path / "warehouse.duckdb"
    connection = duckdb.connect(str(database))
    connection.execute("CREATE TABLE Events AS SELECT 1 AS user_id")
    connection.close()
    with pytest.raises(PolicyError, match="also a table of the database"):
        DuckDBBackend.for_policy(database, parse_policy(POLICY))


def test_source_read_errors_do_not_quote_file_contents(tmp_path: Path) -> None:
    broken = tmp_path / "broken.parquet"
    broken.write_text("not parquet: secret 4242")
    with pytest.raises(ExecutionError, match="cannot read the source of table 't'") as caught:
        DuckDBBackend(None, sources=[file_source("t", str(broken))])
    assert "4242" not in str(caught.value)
