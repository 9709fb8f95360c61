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

__all__ = ["Backend", "DuckDBBackend"]


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
    """A DuckDB database file opened read-only, with external file and network access disabled."""

    dialect = "duckdb"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise ParameterError(f"database file {str(self.path)!r} does not exist")
        try:
            self._connection = duckdb.connect(
                str(self.path),
                read_only=True,
                config={
                    "enable_external_access": False,
                    "autoinstall_known_extensions": False,
                    "autoload_known_extensions": False,
                },
            )
            self._connection.execute("SET lock_configuration = true")
        except duckdb.Error as error:
            raise ExecutionError(
                f"cannot open database {str(self.path)!r}: {type(error).__name__}"
            ) from None

    def catalog(self) -> dict[str, dict[str, str]]:
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
