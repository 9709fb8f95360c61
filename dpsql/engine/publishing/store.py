"""Stored releases: the ``dpsql_rr_releases`` table and one ``dpsql_rr_<name>`` table of
messages per release, in the DuckDB file."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import duckdb
import pandas as pd
from sqlglot import exp

from dpsql.engine.backends import DUCKDB_CONFIG, Backend, DuckDBBackend
from dpsql.engine.publishing.plan import (
    FORMAT,
    RELEASES_TABLE,
    TABLE_PREFIX,
    ItemUniverse,
    UserId,
    _check_name,
)
from dpsql.errors import DpsqlError, ExecutionError, ParameterError
from dpsql.mechanisms.compressed_rr import (
    CompressedRR,
)

__all__ = [
    "PublishedRelease",
    "list_releases",
    "load_release",
]

_CREATE_RELEASES = f"""
CREATE TABLE IF NOT EXISTS {RELEASES_TABLE} (
    name VARCHAR PRIMARY KEY,
    format VARCHAR NOT NULL,
    source_table VARCHAR NOT NULL,
    unit_column VARCHAR NOT NULL,
    item_column VARCHAR NOT NULL,
    unit_kind VARCHAR NOT NULL,
    universe VARCHAR NOT NULL,
    n BIGINT NOT NULL,
    persons BIGINT NOT NULL,
    chunks BIGINT NOT NULL,
    alpha DOUBLE NOT NULL,
    code VARCHAR NOT NULL,
    public_seed VARCHAR NOT NULL,
    epsilon DOUBLE NOT NULL,
    delta DOUBLE NOT NULL,
    epsilon_per_item DOUBLE NOT NULL,
    epsilon_rr DOUBLE NOT NULL,
    max_items BIGINT NOT NULL,
    hamming_bound BIGINT NOT NULL,
    message_bytes BIGINT NOT NULL,
    analyst VARCHAR NOT NULL,
    ledger_entry BIGINT NOT NULL,
    created VARCHAR NOT NULL
)
"""


T = TypeVar("T")


def _quote(name: str) -> str:
    return exp.to_identifier(name, quoted=True).sql(dialect="duckdb")


def _string(value: str) -> str:
    return exp.Literal.string(value).sql(dialect="duckdb")


@dataclass(frozen=True, kw_only=True)
class PublishedRelease:
    """A stored release: its public parameters (enough to decode every message) and its charge."""

    name: str
    table: str
    unit: str
    item: str
    unit_kind: Literal["integer", "string"]
    universe: ItemUniverse
    persons: int
    epsilon: float
    delta: float
    epsilon_per_item: float
    epsilon_rr: float
    max_items: int
    hamming_bound: int
    chunks: int
    alpha: float
    code: str
    public_seed: int
    message_bytes: int
    analyst: str
    ledger_entry: int
    created: str

    @property
    def codec(self) -> CompressedRR:
        """The codec that decodes this release's messages."""
        return CompressedRR(
            n=self.universe.size,
            epsilon=self.epsilon_per_item,
            chunks=self.chunks,
            public_seed=self.public_seed,
            alpha=self.alpha,
            code=self.code,  # type: ignore[arg-type]
        )

    @property
    def storage_table(self) -> str:
        return f"{TABLE_PREFIX}{self.name}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; the universe without its key list, the public seed in hex."""
        data = asdict(self)
        data["universe"] = self.universe.to_dict(with_keys=False)
        data["public_seed"] = f"{self.public_seed:064x}"
        data["bits_per_person"] = 8.0 * self.message_bytes / self.persons if self.persons else 0.0
        return data

    def _row(self) -> list[Any]:
        return [
            self.name,
            FORMAT,
            self.table,
            self.unit,
            self.item,
            self.unit_kind,
            json.dumps(self.universe.to_dict()),
            self.universe.size,
            self.persons,
            self.chunks,
            self.alpha,
            self.code,
            f"{self.public_seed:064x}",
            self.epsilon,
            self.delta,
            self.epsilon_per_item,
            self.epsilon_rr,
            self.max_items,
            self.hamming_bound,
            self.message_bytes,
            self.analyst,
            self.ledger_entry,
            self.created,
        ]

    @classmethod
    def _from_row(cls, row: dict[str, Any]) -> PublishedRelease:
        if row["format"] != FORMAT:
            raise ExecutionError(
                f"release {row['name']!r} has format {row['format']!r}; this dpsql reads {FORMAT}"
            )
        return cls(
            name=str(row["name"]),
            table=str(row["source_table"]),
            unit=str(row["unit_column"]),
            item=str(row["item_column"]),
            unit_kind=row["unit_kind"],
            universe=ItemUniverse.from_dict(json.loads(row["universe"])),
            persons=int(row["persons"]),
            epsilon=float(row["epsilon"]),
            delta=float(row["delta"]),
            epsilon_per_item=float(row["epsilon_per_item"]),
            epsilon_rr=float(row["epsilon_rr"]),
            max_items=int(row["max_items"]),
            hamming_bound=int(row["hamming_bound"]),
            chunks=int(row["chunks"]),
            alpha=float(row["alpha"]),
            code=str(row["code"]),
            public_seed=int(str(row["public_seed"]), 16),
            message_bytes=int(row["message_bytes"]),
            analyst=str(row["analyst"]),
            ledger_entry=int(row["ledger_entry"]),
            created=str(row["created"]),
        )


def _open_writable(database: str | Path) -> duckdb.DuckDBPyConnection:
    """The database opened read-write, with the engine's restrictions (no external access)."""
    path = Path(database)
    if not path.is_file():
        raise ParameterError(f"database file {str(path)!r} does not exist")
    try:
        connection = duckdb.connect(str(path), read_only=False, config=dict(DUCKDB_CONFIG))
        connection.execute("SET enable_progress_bar = false")  # never print over the CLI's output
        connection.execute("SET lock_configuration = true")
    except duckdb.Error as error:
        raise ExecutionError(
            f"cannot open database {str(path)!r} for writing ({type(error).__name__}): close "
            "other connections to it (in this or another process) and retry"
        ) from None
    return connection


def _stored_releases(backend: Backend) -> list[PublishedRelease]:
    if RELEASES_TABLE not in backend.catalog():
        return []
    frame = backend.run(f"SELECT * FROM {RELEASES_TABLE} ORDER BY created, name")
    return [PublishedRelease._from_row(row) for row in frame.to_dict("records")]


def _find(backend: Backend, name: str) -> PublishedRelease:
    name = _check_name(name)
    for release in _stored_releases(backend):
        if release.name.lower() == name.lower():
            return release
    raise ParameterError(f"no release named {name!r} in this database (see `dpsql rr list`)")


def _refuse_existing(backend: Backend, name: str) -> None:
    taken = {release.name.lower() for release in _stored_releases(backend)}
    tables = {table.lower() for table in backend.catalog()}
    if name.lower() in taken or f"{TABLE_PREFIX}{name}".lower() in tables:
        raise ParameterError(f"a release named {name!r} already exists; choose another name")


def list_releases(database: str | Path) -> list[PublishedRelease]:
    """Every stored release of ``database``, oldest first (public metadata; no charge)."""
    backend = DuckDBBackend(database)
    try:
        return _stored_releases(backend)
    finally:
        backend.close()


def load_release(database: str | Path, name: str) -> PublishedRelease:
    """The stored release ``name`` (matched case-insensitively)."""
    backend = DuckDBBackend(database)
    try:
        return _find(backend, name)
    finally:
        backend.close()


def _write_release(
    database: str | Path, release: PublishedRelease, user_ids: list[UserId], messages: list[bytes]
) -> None:
    """Store the release in one DuckDB transaction (refusing a name taken meanwhile)."""
    connection = _open_writable(database)
    storage = _quote(release.storage_table)
    try:
        connection.execute("BEGIN TRANSACTION")
        connection.execute(_CREATE_RELEASES)
        taken = connection.execute(
            f"SELECT count(*) FROM {RELEASES_TABLE} WHERE lower(name) = lower(?)", [release.name]
        ).fetchone()
        if taken and taken[0]:
            raise ParameterError(
                f"a release named {release.name!r} was stored meanwhile; the charge stands"
            )
        id_type = "BIGINT" if release.unit_kind == "integer" else "VARCHAR"
        connection.execute(
            f"CREATE TABLE {storage} (user_id {id_type} PRIMARY KEY, message BLOB NOT NULL)"
        )
        if user_ids:
            frame = pd.DataFrame({"user_id": user_ids, "message": messages})
            connection.register("__dpsql_release", frame)
            connection.execute(
                f"INSERT INTO {storage} SELECT user_id, message FROM __dpsql_release "
                "ORDER BY user_id"
            )
            connection.unregister("__dpsql_release")
        placeholders = ", ".join("?" * len(release._row()))
        connection.execute(f"INSERT INTO {RELEASES_TABLE} VALUES ({placeholders})", release._row())
        connection.execute("COMMIT")
    except DpsqlError:
        connection.execute("ROLLBACK")
        raise
    except duckdb.Error as error:
        connection.execute("ROLLBACK")
        raise ExecutionError(
            f"storing release {release.name!r} failed ({type(error).__name__}); the charge stands"
        ) from None
    finally:
        connection.close()
