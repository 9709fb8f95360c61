"""The backend seam: where the generated SQL runs. DuckDB (embedded) is the default; Spark is in
``dpsql.engine.spark``.

A backend answers two questions: what tables and column types exist (metadata, read before
charging), and what a generated, already-charged query returns. It never sees the user's SQL.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import duckdb
import numpy as np
from sqlglot import exp

from dpsql import deadline
from dpsql.engine.policy import MEMORY_PATTERN, Policy
from dpsql.engine.progress import Progress, run_duckdb
from dpsql.engine.sources import FileSource, allowed_files, policy_sources
from dpsql.errors import FAILED_AFTER_CHARGE, ExecutionError, ParameterError, PolicyError

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "DUCKDB_CONFIG",
    "SCRATCH_PREFIX",
    "Backend",
    "DuckDBBackend",
    "ReadsRows",
    "Rows",
    "Scratch",
    "rows_of",
]

DUCKDB_CONFIG = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}
"""How dpsql opens a database: no file or network access beyond the database itself."""

SCRATCH_PREFIX = "__dpsql_scratch_"
"""Names of a query's private temporary tables (``DuckDBBackend.scratch``): never in the catalog,
and refused by ``register``."""


class Backend(Protocol):
    """What the engine needs from a database."""

    dialect: str

    def catalog(self) -> dict[str, dict[str, str]]:
        """Table name -> column name -> type name."""
        ...

    def run(self, sql: str) -> pd.DataFrame:
        """Run generated SQL and return its (aggregated) rows.

        A backend may also accept ``progress`` (a ``dpsql.engine.progress.Progress``) as a
        keyword; the session passes it only to backends whose ``run`` names that parameter.
        """
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Rows:
    """A small result as plain Python values: its column names and one tuple per row (what a
    DB-API ``fetchall`` returns). The release stages read aggregated answers this way: building
    a DataFrame for a one-row answer costs more than the rest of the release."""

    columns: tuple[str, ...]
    data: list[tuple[Any, ...]]

    @classmethod
    def of_frame(cls, frame: pd.DataFrame) -> Rows:
        """The rows of a DataFrame (a backend that only has ``run``)."""
        return cls(
            tuple(str(c) for c in frame.columns),
            list(frame.itertuples(index=False, name=None)),
        )

    def column(self, name: str) -> list[Any]:
        """The values of column ``name``, in row order."""
        index = self.columns.index(name)
        return [row[index] for row in self.data]


@runtime_checkable
class ReadsRows(Protocol):
    """A backend that returns small results as :class:`Rows` without building a DataFrame."""

    def rows(self, sql: str, progress: Progress | None = None) -> Rows:
        """Run generated SQL whose result is small (an aggregated answer); its rows."""
        ...


_READS_ROWS: dict[type, bool] = {}


def rows_of(backend: Backend, sql: str, progress: Progress | None = None) -> Rows:
    """The rows of generated ``sql`` on ``backend``: from its ``rows`` when it has one (see
    :class:`ReadsRows`), else from its ``run``'s DataFrame (``progress`` is given to ``run``
    only when not None: backends written against ``run(sql)`` take no such keyword)."""
    reads = _READS_ROWS.get(type(backend))
    if reads is None:  # a protocol check is slow next to a small query: once per backend type
        reads = _READS_ROWS[type(backend)] = isinstance(backend, ReadsRows)
    if reads:
        return backend.rows(sql, progress)  # type: ignore[attr-defined]
    if progress is None:
        return Rows.of_frame(backend.run(sql))
    return Rows.of_frame(backend.run(sql, progress=progress))  # type: ignore[call-arg]


class DuckDBBackend:
    """A DuckDB database opened read-only, with external file and network access disabled.

    ``path`` is a database file (``None``: an empty in-memory database). ``sources`` are Parquet
    or CSV files exposed as views named after their tables (see ``dpsql.engine.sources``); DuckDB
    is told their exact paths (``allowed_paths``) before external access is switched off and the
    configuration locked, so those files, and no others, stay readable. ``register`` adds pandas
    DataFrames and Arrow tables from Python.

    The catalog is read once per backend (and again after ``register``): a read-only connection
    sees a fixed snapshot, and the source files are listed when the backend opens.
    """

    dialect = "duckdb"
    settings_locked = True
    """Opened with ``lock_configuration``: no setting (time zone, collation) changes later."""

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        sources: Iterable[FileSource] = (),
        memory_limit: str | None = None,
    ):
        self.path = Path(path) if path is not None else None
        self.sources = tuple(sources)
        self._catalog: dict[str, dict[str, str]] | None = None
        self._registered: dict[str, object] = {}
        self._spill: tempfile.TemporaryDirectory[str] | None = None
        self._undropped: list[tuple[str, bool]] = []
        """Scratch tables (True) and registered values (False) whose drop failed: retried."""
        if self.path is not None and not self.path.is_file():
            raise ParameterError(f"database file {str(self.path)!r} does not exist")
        config = dict(DUCKDB_CONFIG)
        if memory_limit is not None:
            if not re.fullmatch(MEMORY_PATTERN, memory_limit):
                raise ParameterError(f"memory_limit must look like '6GB', got {memory_limit!r}")
            # Beyond the limit DuckDB spills to a private temporary directory, removed on close.
            self._spill = tempfile.TemporaryDirectory(prefix="dpsql-spill-")
            config |= {"memory_limit": memory_limit, "temp_directory": self._spill.name}
        try:
            if self.path is not None and not self.sources:
                self._connection = self._open_file(self.path, config)
            else:
                self._connection = self._open_with_sources(config)
        except BaseException:
            self._remove_spill()
            raise
        if self.sources:
            self._check_sources_are_new()

    @classmethod
    def for_policy(cls, database: str | Path | None, policy: Policy) -> DuckDBBackend:
        """The database with the policy's file sources attached and its memory limit. Without a
        database file (it does not exist, or is ``None``), an in-memory database holds only the
        sources."""
        sources = policy_sources(policy, database)
        if database is None or (sources and not Path(database).is_file()):
            database = None
        return cls(database, sources=sources, memory_limit=policy.dataset.memory_limit)

    @staticmethod
    def _open_file(path: Path, config: dict[str, object]) -> duckdb.DuckDBPyConnection:
        try:
            connection = duckdb.connect(str(path), read_only=True, config=config)
            _track_progress(connection)
            connection.execute("SET lock_configuration = true")
        except duckdb.ConnectionException:
            raise ExecutionError(
                f"cannot open database {str(path)!r}: this process already has it open "
                "with another configuration; close that connection, or open it with "
                "read_only=True and dpsql.engine.backends.DUCKDB_CONFIG"
            ) from None
        except duckdb.Error as error:
            raise ExecutionError(f"cannot open database {str(path)!r}: {_why(error)}") from None
        return connection

    def _open_with_sources(self, config: dict[str, object]) -> duckdb.DuckDBPyConnection:
        """A private in-memory DuckDB: the database file attached read-only, the source files
        allowed by exact path, then external access off and the configuration locked.

        DuckDB accepts ``allowed_paths`` only while external access is on, and refuses to turn
        it back on once off, so nothing after this method can widen what is readable.
        """
        config = {k: v for k, v in config.items() if k != "enable_external_access"}
        connection = duckdb.connect(":memory:", config=config)
        step = "open an in-memory database"
        try:
            if self.path is not None:
                step = f"attach {str(self.path)!r} read-only"
                connection.execute(f"ATTACH {_string(str(self.path))} AS {_ATTACHED} (READ_ONLY)")
                connection.execute(f"USE {_ATTACHED}")
            files = allowed_files(self.sources)
            if files:
                step = "allow the source files"
                connection.execute(f"SET allowed_paths = [{', '.join(_string(f) for f in files)}]")
            connection.execute("SET enable_external_access = false")
            for source in self.sources:
                step = f"read the source of table {source.table!r}"
                connection.execute(
                    f"CREATE TEMP VIEW {_quoted(source.table)} AS {source.duckdb_select()}"
                )
            if any(source.format == "csv" for source in self.sources):
                step = "keep declared CSV types"
                _keep_try_cast(connection)
            step = "set up progress reporting"
            _track_progress(connection)
            connection.execute("SET lock_configuration = true")
        except duckdb.Error as error:
            connection.close()
            # The message may quote file contents (CSV sniffing); report only the error class.
            raise ExecutionError(f"cannot {step}: {_why(error)}") from None
        return connection

    def _check_sources_are_new(self) -> None:
        rows = self._connection.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' "
            "AND table_catalog = current_database()"
        ).fetchall()
        stored = {name.lower() for (name,) in rows}
        for source in self.sources:
            if source.table.lower() in stored:
                self.close()
                raise PolicyError(
                    f"table {source.table!r} has a source in the policy and is also a table of "
                    "the database; rename one of them"
                )

    def check_sources(self) -> None:
        """Read every CSV source once, whole; ``PolicyError`` naming the first problem (for the
        administrator, who may see the files: the message quotes DuckDB's)."""
        for source in self.sources:
            if source.format != "csv":
                continue
            if source.header:
                self._check_header(source)
            try:
                self._connection.execute(f"SELECT COUNT(*) FROM {_quoted(source.table)}").fetchall()
            except duckdb.Error as error:
                first = str(error).strip().splitlines()[0] if str(error).strip() else ""
                raise PolicyError(
                    f"the CSV source of table {source.table!r} does not parse with its declared "
                    f"columns and dialect: {type(error).__name__}: {first}"
                ) from None

    def _check_header(self, source: FileSource) -> None:
        declared = [name for name, _ in source.columns]
        for path in source.files:
            try:
                found = self._connection.execute(source.duckdb_header(path)).fetchall()
            except duckdb.Error as error:
                raise PolicyError(
                    f"cannot read the header of {str(path)!r}: {type(error).__name__}"
                ) from None
            names = [str(v) if v is not None else "" for v in (found[0] if found else ())]
            if names != declared:
                raise PolicyError(
                    f"the header of {str(path)!r} names columns {names}; source_columns of "
                    f"table {source.table!r} declares {declared}, in this order"
                )

    def register(self, name: str, data: object) -> None:
        """Expose a pandas DataFrame or an Arrow table as table ``name`` (scanned in place).

        The object is read when queries run, so later changes to it are seen; do not change it
        while a session uses it.
        """
        if not isinstance(name, str) or not name:
            raise ParameterError(f"name must be a non-empty table name, got {name!r}")
        if name.lower().startswith(SCRATCH_PREFIX):
            raise ParameterError(f"table names starting with {SCRATCH_PREFIX!r} are dpsql's own")
        if name.lower() in {table.lower() for table in self.catalog()}:
            raise ParameterError(f"a table named {name!r} already exists; choose another name")
        try:
            self._connection.register(name, data)
        except (duckdb.Error, TypeError, ValueError) as error:
            raise ParameterError(
                f"cannot register {type(data).__name__} as table {name!r}: "
                f"{type(error).__name__} (pass a pandas DataFrame or an Arrow table)"
            ) from None
        self._registered[name] = data
        self._catalog = None

    def catalog(self) -> dict[str, dict[str, str]]:
        if self._catalog is None:
            self._catalog = self._read_catalog()
        return self._catalog

    def _read_catalog(self) -> dict[str, dict[str, str]]:
        rows = self._connection.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = 'main' AND table_catalog IN (current_database(), 'temp') "
            "ORDER BY table_name, ordinal_position"
        ).fetchall()
        tables: dict[str, dict[str, str]] = {}
        for table, column, type_name in rows:
            if not table.lower().startswith(SCRATCH_PREFIX):
                tables.setdefault(table, {})[column] = type_name
        return tables

    def run(self, sql: str, progress: Progress | None = None) -> pd.DataFrame:
        """Run generated SQL; with ``progress``, report DuckDB's estimate of how far it is
        (the query then runs in a worker thread, see ``dpsql.engine.progress.run_duckdb``)."""
        try:
            with deadline.watching(self._connection):
                if progress is None:
                    return self._connection.execute(sql).df()
                return run_duckdb(self._connection, sql, progress)
        except duckdb.Error:
            pass
        # Raised outside the handler, so no exception chain carries the database's message (which
        # may quote row values) or its class (which may depend on them).
        raise ExecutionError(FAILED_AFTER_CHARGE)

    def rows(self, sql: str, progress: Progress | None = None) -> Rows:
        """Run generated SQL whose result is small and return its rows as Python values
        (``fetchall``: no DataFrame is built); with ``progress``, as ``run`` does."""
        if progress is not None:
            return Rows.of_frame(self.run(sql, progress))
        try:
            with deadline.watching(self._connection):
                cursor = self._connection.execute(sql)
                data = cursor.fetchall()
                columns = tuple(d[0] for d in cursor.description or ())
            return Rows(columns, data)
        except duckdb.Error:
            pass
        raise ExecutionError(FAILED_AFTER_CHARGE)

    @contextlib.contextmanager
    def scratch(self) -> Iterator[Scratch]:
        """Private temporary tables for one query, dropped when the block ends, however it
        ends (an error, an interrupt). Each gets a fresh random name under
        :data:`SCRATCH_PREFIX`, so queries of sessions sharing this backend never meet, and the
        catalog (hence every analyst) never sees them. One whose drop fails (the connection
        interrupted meanwhile) is dropped at the start of the next scratch."""
        self._drop_undropped()
        scratch = Scratch(self)
        try:
            yield scratch
        finally:
            scratch.drop()

    def _drop_undropped(self) -> None:
        for name, table in list(self._undropped):
            if _dropped(self._connection, name, table):
                self._undropped.remove((name, table))

    def interrupt(self) -> None:
        """Stop the running query from another thread (it then raises ``ExecutionError``)."""
        self._connection.interrupt()

    def close(self) -> None:
        self._connection.close()
        self._remove_spill()

    def _remove_spill(self) -> None:
        if self._spill is not None:
            self._spill.cleanup()
            self._spill = None


class Scratch:
    """One query's temporary tables on a ``DuckDBBackend`` (see ``DuckDBBackend.scratch``)."""

    def __init__(self, backend: DuckDBBackend):
        self.backend = backend
        self._made: list[tuple[str, bool]] = []

    def table(self, sql: str, progress: Progress | None = None) -> str:
        """Materialise what generated ``sql`` selects as a temporary table; its name."""
        name = _scratch_name()
        self._made.append((name, True))
        self.backend.run(f"CREATE TEMP TABLE {_quoted(name)} AS {sql}", progress)
        return name

    def values(self, column: str, values: np.ndarray, *, text: bool) -> str:
        """``values`` as a one-column table (text, or 64-bit integers), read where queries run:
        the database compares them in its own semantics, and no value is written into SQL."""
        name = _scratch_name()
        import pandas as pd
        series = pd.Series(values, dtype="string" if text else "int64")
        try:
            self.backend._connection.register(name, pd.DataFrame({column: series}))
        except duckdb.Error:
            raise ExecutionError(FAILED_AFTER_CHARGE) from None
        self._made.append((name, False))
        return name

    def run(self, sql: str, progress: Progress | None = None) -> pd.DataFrame:
        """The backend's rows for generated ``sql`` (which may read this scratch's tables)."""
        return self.backend.run(sql, progress)

    def drop(self) -> None:
        """Drop every table made here (those a failed statement never created included); the
        backend keeps those it could not drop, and the rest if this is interrupted."""
        made, self._made = self._made, []
        while made:
            try:
                gone = _dropped(self.backend._connection, *made[0])
            except BaseException:
                self.backend._undropped.extend(made)
                raise
            left = made.pop(0)
            if not gone:
                self.backend._undropped.append(left)


def _dropped(connection: duckdb.DuckDBPyConnection, name: str, table: bool) -> bool:
    """Whether scratch table (or registered values) ``name`` is gone after dropping it."""
    try:
        if table:
            connection.execute(f"DROP TABLE IF EXISTS temp.main.{_quoted(name)}")
        else:
            connection.unregister(name)
    except duckdb.Error:
        return False
    return True


def _scratch_name() -> str:
    return f"{SCRATCH_PREFIX}{uuid.uuid4().hex}"


_ATTACHED = "__dpsql_database"
"""Catalog name of the database file inside a backend's private in-memory DuckDB."""


def _track_progress(connection: duckdb.DuckDBPyConnection) -> None:
    """Let ``query_progress`` report from a query's start, and never let DuckDB print its own bar.

    These settings are per connection and cannot be given to ``duckdb.connect`` (they are not
    global options) nor changed once the configuration is locked, so they are set just before.
    With the defaults (``progress_bar_time`` 2000 ms, printing on) DuckDB 2.0's
    ``query_progress`` stays at -1 however long the query runs.
    """
    connection.execute("SET enable_progress_bar = true")
    connection.execute("SET enable_progress_bar_print = false")
    connection.execute("SET progress_bar_time = 0")


def _keep_try_cast(connection: duckdb.DuckDBPyConnection) -> None:
    """Switch off DuckDB's ``type_pushdown`` optimizer where it exists: it pushes the CSV views'
    ``TRY_CAST`` into the reader as a plain cast, so one unconvertible value would fail every
    query (seen in DuckDB 2.0) instead of reading as NULL."""
    rows = connection.execute("SELECT name FROM duckdb_optimizers()").fetchall()
    if ("type_pushdown",) in rows:
        connection.execute("SET disabled_optimizers = 'type_pushdown'")


def _why(error: duckdb.Error) -> str:
    """What to tell the user about a DuckDB error opening a file: a lock held by another process
    in plain words, else only the error's class (its message may quote file contents)."""
    if isinstance(error, duckdb.IOException) and "lock" in str(error).lower():
        return (
            "another process has it open for writing (DuckDB lets one process write a file, or "
            "several read it); close that program, e.g. a DuckDB shell or notebook, and retry"
        )
    return type(error).__name__


def _string(value: str) -> str:
    return exp.Literal.string(value).sql(dialect="duckdb")


def _quoted(name: str) -> str:
    return exp.to_identifier(name, quoted=True).sql(dialect="duckdb")
