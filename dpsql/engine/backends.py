"""The backend seam: where the generated SQL runs. DuckDB (embedded) is the default.

A backend answers two questions: what tables and column types exist (metadata, read before
charging), and what a generated, already-charged query returns. It never sees the user's SQL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import duckdb
import pandas as pd

from dpsql.errors import ExecutionError, ParameterError

__all__ = ["DUCKDB_CONFIG", "Backend", "DuckDBBackend"]

DUCKDB_CONFIG = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}
"""How dpsql opens a database: no file or network access beyond the database itself."""


class Backend(Protocol):
    """What the engine needs from a database."""

    dialect: str

    def catalog(self) -> dict[str, dict[str, str]]:
        """Table name -> column name -> type name."""
        ...

    def run(self, sql: str) -> pd.DataFrame:
        """Run generated SQL and return its (aggregated) rows."""
        ...

    def close(self) -> None: ...


class DuckDBBackend:
    """A DuckDB database file opened read-only, with external file and network access disabled.

    The catalog is read once per backend: a read-only connection sees a fixed snapshot.
    """

    dialect = "duckdb"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._catalog: dict[str, dict[str, str]] | None = None
        if not self.path.is_file():
            raise ParameterError(f"database file {str(self.path)!r} does not exist")
        try:
            self._connection = duckdb.connect(
                str(self.path),
                read_only=True,
                config=dict(DUCKDB_CONFIG),
            )
            self._connection.execute("SET lock_configuration = true")
        except duckdb.ConnectionException:
            raise ExecutionError(
                f"cannot open database {str(self.path)!r}: this process already has it open "
                "with another configuration; close that connection, or open it with "
                "read_only=True and dpsql.engine.backends.DUCKDB_CONFIG"
            ) from None
        except duckdb.Error as error:
            raise ExecutionError(
                f"cannot open database {str(self.path)!r}: {type(error).__name__}"
            ) from None

    def catalog(self) -> dict[str, dict[str, str]]:
        if self._catalog is None:
            self._catalog = self._read_catalog()
        return self._catalog

    def _read_catalog(self) -> dict[str, dict[str, str]]:
        rows = self._connection.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position"
        ).fetchall()
        tables: dict[str, dict[str, str]] = {}
        for table, column, type_name in rows:
            tables.setdefault(table, {})[column] = type_name
        return tables

    def run(self, sql: str) -> pd.DataFrame:
        try:
            return self._connection.execute(sql).df()
        except duckdb.Error as error:
            # The message may quote row values; report only the error class.
            raise ExecutionError(
                f"the database failed while running the planned query "
                f"({type(error).__name__}); the charge stands"
            ) from None

    def close(self) -> None:
        self._connection.close()
