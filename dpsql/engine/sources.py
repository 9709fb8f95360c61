"""Tables read from Parquet or CSV files instead of the database: which files, in which format.

A policy table may name its files (a path or glob, relative to the database's directory)::

    [tables.requests]
    privacy_unit = "user_id"
    source = "data/requests-*.parquet"
    source_format = "parquet"      # optional: read off the extension

The pattern is expanded once, when a backend opens, into a sorted list of files; the backend may
read those files and no others (see ``DuckDBBackend``). The files are scanned in place, never
copied. A Parquet file carries its own schema. A CSV file's columns and types are declared in
the policy (``source_columns = [["name", "TYPE"], ...]``, in file order) and its dialect given
(``csv_delimiter``, ``csv_header``; quotes and escapes are ``"``): nothing is sniffed from the
rows, so the schema an analyst sees cannot depend on anyone's data, and a value that does not
convert to its declared type reads as NULL rather than failing a query. ``dpsql policy set``
checks each CSV file's header and reads every CSV source once, refusing files that do not parse.
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sqlglot import exp
from sqlglot.errors import ParseError

from dpsql.engine.policy import Policy
from dpsql.errors import PolicyError

__all__ = [
    "FileSource",
    "SourceFormat",
    "allowed_files",
    "column_type",
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
    """A table's files, listed when the backend opened, and their format.

    A CSV file's ``columns`` (name and type, in file order) are declared, never sniffed: the
    schema an analyst sees must not depend on anyone's rows.
    """

    table: str
    files: tuple[Path, ...]
    format: SourceFormat
    columns: tuple[tuple[str, str], ...] = ()
    delimiter: str = ","
    header: bool = True

    def duckdb_scan(self) -> str:
        """DuckDB's table function reading exactly these files; a CSV file is read as text in
        the declared columns, with the dialect given (no sniffing).

        >>> FileSource("t", (Path("/d/a.pq"), Path("/d/it's.pq")), "parquet").duckdb_scan()
        "read_parquet(['/d/a.pq', '/d/it''s.pq'])"
        >>> print(FileSource("t", (Path("/d/a.csv"),), "csv", (("id", "BIGINT"),)).duckdb_scan())
        read_csv(['/d/a.csv'], columns={'id': 'VARCHAR'}, header=true, auto_detect=false, \
delim=',', quote='"', escape='"')
        """
        paths = ", ".join(_string(str(p)) for p in self.files)
        if self.format == "parquet":
            return f"read_parquet([{paths}])"
        columns = ", ".join(f"{_string(name)}: 'VARCHAR'" for name, _ in self.columns)
        return (
            f"read_csv([{paths}], columns={{{columns}}}, header={str(self.header).lower()}, "
            f"auto_detect=false, delim={_string(self.delimiter)}, quote='\"', escape='\"')"
        )

    def duckdb_header(self, path: Path) -> str:
        """DuckDB's reading of the first line of ``path`` as text fields (to check a header)."""
        names = ", ".join(f"{_string(f'c{i}')}: 'VARCHAR'" for i in range(len(self.columns)))
        return (
            f"SELECT * FROM read_csv({_string(str(path))}, columns={{{names}}}, header=false, "
            f"auto_detect=false, delim={_string(self.delimiter)}, quote='\"', escape='\"', "
            "null_padding=true, strict_mode=false) LIMIT 1"
        )

    def duckdb_select(self) -> str:
        """The SELECT a backend exposes as the table: Parquet as stored; CSV text converted to
        the declared types, a value that does not convert becoming NULL (never an error)."""
        if self.format == "parquet":
            return f"SELECT * FROM {self.duckdb_scan()}"
        converted = ", ".join(
            f"TRY_CAST({_identifier(name)} AS {type_name}) AS {_identifier(name)}"
            for name, type_name in self.columns
        )
        return f"SELECT {converted} FROM {self.duckdb_scan()}"


def _string(value: str) -> str:
    return exp.Literal.string(value).sql(dialect="duckdb")


def _identifier(name: str) -> str:
    return exp.to_identifier(name, quoted=True).sql(dialect="duckdb")


def column_type(type_name: str) -> str:
    """A declared column type in DuckDB's spelling, or ``PolicyError``.

    >>> column_type("decimal(10, 2)"), column_type("timestamp with time zone")
    ('DECIMAL(10, 2)', 'TIMESTAMPTZ')
    """
    try:
        parsed = exp.DataType.build(type_name, dialect="duckdb")
    except (ParseError, ValueError):
        parsed = None
    if parsed is None or parsed.this == exp.DataType.Type.USERDEFINED:
        raise PolicyError(f"{type_name!r} is not a DuckDB column type")
    return parsed.sql(dialect="duckdb")


def file_source(
    table: str,
    pattern: str,
    *,
    base: str | Path = ".",
    source_format: SourceFormat | None = None,
    columns: Sequence[tuple[str, str]] | None = None,
    delimiter: str = ",",
    header: bool = True,
) -> FileSource:
    """Expand ``pattern`` (relative to ``base``; ``**`` matches directories) into a source.

    Raises ``PolicyError`` when nothing matches, the format cannot be told from the extension, a
    CSV source does not declare its ``columns`` ((name, DuckDB type) in file order) or a
    Parquet source does, or a file name contains a glob character (the engines would read it as
    a pattern).
    """
    source_format = source_format or infer_format(pattern)
    if source_format is None:
        raise PolicyError(
            f"cannot tell the format of source {pattern!r} of table {table!r} from its "
            f"extension; set [tables.{table}] source_format = 'parquet' or 'csv'"
        )
    if source_format == "csv" and not columns:
        raise PolicyError(
            f"the CSV source of table {table!r} needs its columns declared, in file order: "
            f'[tables.{table}] source_columns = [["name", "TYPE"], ...] (types sniffed from the '
            "rows would let one person's value change the schema)"
        )
    if source_format == "parquet" and columns:
        raise PolicyError(
            f"source_columns of table {table!r} apply to CSV files; Parquet files carry their "
            "own schema"
        )
    declared = tuple((name, column_type(type_name)) for name, type_name in columns or ())
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
    return FileSource(table, tuple(files), source_format, declared, delimiter, header)


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
            file_source(
                name,
                table.source,
                base=base,
                source_format=table.source_format,
                columns=table.source_columns,
                delimiter=table.csv_delimiter,
                header=table.csv_header,
            )
        )
    return sources


def allowed_files(sources: Sequence[FileSource]) -> list[str]:
    """Every file the sources may read, as the engine is told them."""
    return [str(path) for source in sources for path in source.files]
