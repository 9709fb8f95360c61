"""Tables read from Parquet or CSV files instead of the database: which files, in which format.

A policy table may name its files (a path or glob, relative to the database's directory)::

    [tables.requests]
    privacy_unit = "user_id"
    source = "data/requests-*.parquet"
    source_format = "parquet"      # optional: read off the extension

The pattern is expanded once, when a backend opens, into a sorted list of files; the backend may
read those files and no others (see ``DuckDBBackend``). The files are scanned in place, never
copied. A CSV file's column types are inferred from its contents by the reading engine; a Parquet
file carries its own schema, so Parquet is the better choice when the schema must not depend on
the data.
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sqlglot import exp

from dpsql.engine.policy import Policy
from dpsql.errors import PolicyError

__all__ = [
    "FileSource",
    "SourceFormat",
    "allowed_files",
    "file_source",
    "infer_format",
    "policy_sources",
]

SourceFormat = Literal["parquet", "csv"]

_SUFFIXES: dict[str, SourceFormat] = {
    ".parquet": "parquet",
    ".parq": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".tsv": "csv",
    ".csv.gz": "csv",
    ".tsv.gz": "csv",
    ".csv.zst": "csv",
}

_GLOB_CHARACTERS = frozenset("*?[")


def infer_format(pattern: str) -> SourceFormat | None:
    """The format a file name or pattern implies by its extension, if any.

    >>> infer_format("data/part-*.parquet"), infer_format("x.CSV.gz"), infer_format("data/*")
    ('parquet', 'csv', None)
    """
    name = pattern.lower()
    for suffix, source_format in sorted(_SUFFIXES.items(), key=lambda item: -len(item[0])):
        if name.endswith(suffix):
            return source_format
    return None


@dataclass(frozen=True)
class FileSource:
    """A table's files, listed when the backend opened, and their format."""

    table: str
    files: tuple[Path, ...]
    format: SourceFormat

    def duckdb_scan(self) -> str:
        """DuckDB's table function reading exactly these files.

        >>> FileSource("t", (Path("/d/a.csv"), Path("/d/it's.csv")), "csv").duckdb_scan()
        "read_csv(['/d/a.csv', '/d/it''s.csv'])"
        """
        paths = ", ".join(exp.Literal.string(str(p)).sql(dialect="duckdb") for p in self.files)
        function = "read_parquet" if self.format == "parquet" else "read_csv"
        return f"{function}([{paths}])"


def file_source(
    table: str,
    pattern: str,
    *,
    base: str | Path = ".",
    source_format: SourceFormat | None = None,
) -> FileSource:
    """Expand ``pattern`` (relative to ``base``; ``**`` matches directories) into a source.

    Raises ``PolicyError`` when nothing matches, the format cannot be told from the extension, or
    a file name contains a glob character (the engines would read it as a pattern).
    """
    source_format = source_format or infer_format(pattern)
    if source_format is None:
        raise PolicyError(
            f"cannot tell the format of source {pattern!r} of table {table!r} from its "
            f"extension; set [tables.{table}] source_format = 'parquet' or 'csv'"
        )
    full = Path(pattern).expanduser()
    if not full.is_absolute():
        full = Path(base).expanduser().resolve() / full
    files = sorted(
        {Path(p).resolve() for p in glob.glob(str(full), recursive=True) if Path(p).is_file()}
    )
    if not files:
        raise PolicyError(f"source {pattern!r} of table {table!r} matches no files")
    for path in files:
        if _GLOB_CHARACTERS & set(str(path)):
            raise PolicyError(
                f"source file {str(path)!r} of table {table!r} has a glob character "
                "(* ? [) in its name; rename it"
            )
    return FileSource(table, tuple(files), source_format)


def policy_sources(policy: Policy, database: str | Path | None) -> list[FileSource]:
    """The file sources a policy declares; relative patterns resolve against the database's
    directory (the working directory without a database)."""
    base = Path(database).expanduser().resolve().parent if database is not None else Path.cwd()
    sources = []
    for name, table in policy.tables.items():
        if table.source is None:
            if table.source_format is not None:
                raise PolicyError(f"[tables.{name}] source_format is set but source is not")
            continue
        sources.append(
            file_source(name, table.source, base=base, source_format=table.source_format)
        )
    return sources


def allowed_files(sources: Sequence[FileSource]) -> list[str]:
    """Every file the sources may read, as the engine is told them."""
    return [str(path) for source in sources for path in source.files]
