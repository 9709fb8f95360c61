"""Published releases: a user×item table under local DP, stored in the database and queried free.

``publish_rr`` encodes every person's item set of a table with compressed randomized response
(:mod:`dpsql.mechanisms.compressed_rr`; Hillebrand, Suppakitpaisarn, Shibuya, Algorithms 1-3 and
Theorem 1; notes ``shared/specs/compressed-rr.md`` S3-S5) and stores the release (public
parameters + one message per person) in the DuckDB file, as ``dpsql_rr_releases`` (one row per
release) and ``dpsql_rr_<name>`` (``user_id``, ``message``). The queries on a stored release
(:func:`release_popularity`, :func:`release_common_items`, :func:`release_decode`) read only the
release, so they are post-processing: each is recorded as a zero-cost ledger entry naming it.

Privacy decisions (``docs/publish.md`` has the proofs):

* **Public item universe.** Coordinates come from the policy only: the item column's
  ``public_keys`` (index = position in the list) or integer ``bounds = [low, high]`` (index =
  item - low). Nothing about the coordinates is derived from the data; items outside the universe
  and NULL items are dropped. Without a universe the release is refused before any charge.
* **Public cap.** Each person keeps at most ``max_items`` (= D; default: the table's
  ``max_rows_per_unit``) distinct items, a uniformly random subset drawn with the session's
  private generator (a choice that depends on nothing but the person's own items), before
  encoding.
* **Neighbour relation and cost.** The release lists every non-NULL unit of the table, so it
  reveals who is in the table: membership is *not* protected. What is protected is each
  person's item set under the replace-one-person relation (same units, one unit's rows
  changed). Two capped item sets differ in at most ``h = min(2·D, n)`` items, and the message is
  ``ε_item``-DP per item (metric DP under Hamming distance, Theorem 1 with PPR Theorem 4.7), so
  the release is ``h·ε_item``-DP. The caller's ``epsilon`` is that person-level cost; the codec
  runs at ``ε_item = epsilon / h``.
* **Chunks** are computed from public values only (n, ε_item, D, α): ``suggest_chunks`` with the
  public cap D, raised if needed so that even D items in one chunk keep its log-ratio bound
  within :data:`MAX_CHUNK_LOG_RATIO` (the codec's crowded-chunk refusal cannot happen after the
  charge) and δ below :data:`DELTA_TARGET`.
* **δ of the encoder's refusal.** The PPR encoder refuses (``ExecutionError``) when an index
  could pass 2**60. That event depends on the data, so it is charged as δ, bounded from public
  parameters by :func:`overflow_delta`.
* **Order.** Every check above, and the release name, are settled from the policy and catalog;
  then ``Session.charge`` records the cost (or refuses, and nothing is read or written); only then
  is the table read, encoded and written. A failure after the charge leaves the charge standing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import duckdb
import numpy as np
import numpy.typing as npt
import pandas as pd
from sqlglot import exp

from dpsql.accountant.events import MechanismEvent, PostProcessingEvent
from dpsql.accountant.ledger import LedgerEntry
from dpsql.accountant.units import check_budget_value
from dpsql.engine.backends import DUCKDB_CONFIG, Backend, DuckDBBackend
from dpsql.engine.policy import ColumnPolicy, Policy
from dpsql.engine.progress import DONE, READING_DATA, Progress, no_progress
from dpsql.engine.session import Session
from dpsql.errors import DpsqlError, ExecutionError, ParameterError, PolicyError
from dpsql.mechanisms.compressed_rr import (
    CompressedRR,
    common_items,
    item_popularity,
    suggest_chunks,
)
from dpsql.sql.shape import ColumnKind

__all__ = [
    "DELTA_TARGET",
    "MAX_CHUNK_LOG_RATIO",
    "MAX_DELTA",
    "MAX_UNIVERSE",
    "RELEASES_TABLE",
    "CommonItemsResult",
    "DecodedRow",
    "ItemUniverse",
    "PopularityResult",
    "PublishedRelease",
    "ReleasePlan",
    "list_releases",
    "load_release",
    "overflow_delta",
    "plan_release",
    "publish_rr",
    "release_common_items",
    "release_decode",
    "release_popularity",
]

RELEASES_TABLE = "dpsql_rr_releases"
"""One row per stored release: its public parameters."""
TABLE_PREFIX = "dpsql_rr_"
MECHANISM = "compressed_rr"
POST_PROCESSING = "post_processing"
FORMAT = "compressed_rr.v1"
MAX_UNIVERSE = 1 << 24
"""Largest item universe accepted (the codec keeps an n-entry permutation in memory)."""
MAX_CHUNK_LOG_RATIO = 8.0
"""Largest ``L = ε_RR · min(D, chunk size)`` (the log of the worst chunk's ``r*``) allowed:
bounds the encoder's work (about ``e^L`` points in the worst chunk) and keeps the codec's own
crowded-chunk refusal (at 14) unreachable. δ usually forces a smaller L."""
DELTA_TARGET = 1e-10
"""The automatic chunk choice adds chunks until the charged δ is at most this."""
MAX_DELTA = 1e-6
"""Configurations whose δ (:func:`overflow_delta`) exceeds this are refused."""
INDEX_LIMIT_LOG2 = 60
"""The PPR encoder refuses indices that could pass ``2**60`` (``ppr._LOG_RANK_LIMIT``)."""

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,62}")
_INTEGER_TYPES = {
    "TINYINT",
    "SMALLINT",
    "INTEGER",
    "INT",
    "BIGINT",
    "UTINYINT",
    "USMALLINT",
    "UINTEGER",
    "INT1",
    "INT2",
    "INT4",
    "INT8",
    "LONG",
    "SHORT",
}
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

UserId = int | str
Item = int | str
T = TypeVar("T")


def _quote(name: str) -> str:
    return exp.to_identifier(name, quoted=True).sql(dialect="duckdb")


def _string(value: str) -> str:
    return exp.Literal.string(value).sql(dialect="duckdb")


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ParameterError(
            f"name must start with a letter and hold at most 63 letters, digits or '_', "
            f"got {name!r}"
        )
    return name


# --- the public item universe -------------------------------------------------------------------


@dataclass(frozen=True)
class ItemUniverse:
    """The public coordinates of the release: item ``keys[i]`` (from ``public_keys``) or
    ``low + i`` (from integer ``bounds``), ``i = 0 … size-1``. Never derived from the data."""

    source: Literal["public_keys", "bounds"]
    size: int
    kind: Literal["integer", "string"]
    low: int = 0
    keys: tuple[Item, ...] = ()

    def items(self, indices: npt.ArrayLike) -> list[Item]:
        """The items at coordinates ``indices``."""
        positions = np.asarray(indices, dtype=np.int64).ravel()
        if self.source == "bounds":
            return [self.low + i for i in positions.tolist()]
        return np.asarray(self.keys, dtype=object)[positions].tolist()

    def to_dict(self, *, with_keys: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {"source": self.source, "size": self.size, "kind": self.kind}
        if self.source == "bounds":
            data["low"] = self.low
        elif with_keys:
            data["keys"] = list(self.keys)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ItemUniverse:
        return cls(
            source=data["source"],
            size=int(data["size"]),
            kind=data["kind"],
            low=int(data.get("low", 0)),
            keys=tuple(data.get("keys", ())),
        )


def _universe(column: str, kind: ColumnKind, rules: ColumnPolicy) -> ItemUniverse:
    """The item universe the policy declares for ``column``; PolicyError if there is none."""
    if kind not in (ColumnKind.INTEGER, ColumnKind.STRING):
        raise PolicyError(
            f"item column {column!r} must be an integer or string column, it is {kind.value}"
        )
    label = "integer" if kind is ColumnKind.INTEGER else "string"
    if rules.public_keys is not None:
        keys: list[Item] = []
        for key in rules.public_keys:
            if kind is ColumnKind.STRING and isinstance(key, str):
                keys.append(key)
            elif (
                kind is ColumnKind.INTEGER
                and isinstance(key, int | float)
                and not isinstance(key, bool)
                and float(key).is_integer()
            ):
                keys.append(int(key))
            else:
                raise PolicyError(
                    f"public key {key!r} of item column {column!r} does not match its type "
                    f"({kind.value})"
                )
        universe = ItemUniverse("public_keys", len(keys), label, keys=tuple(keys))
    elif rules.bounds is not None and kind is ColumnKind.INTEGER:
        low, high = rules.bounds
        if not (float(low).is_integer() and float(high).is_integer()):
            raise PolicyError(
                f"bounds of item column {column!r} must be integers to define its items, "
                f"got [{low}, {high}]"
            )
        universe = ItemUniverse("bounds", int(high) - int(low) + 1, label, low=int(low))
    else:
        raise PolicyError(
            f"item column {column!r} has no public item universe: declare public_keys = [...] "
            "(or, for an integer column, bounds = [low, high]) for it in the policy; "
            "the items of a release are never taken from the data"
        )
    if universe.size > MAX_UNIVERSE:
        raise PolicyError(
            f"item column {column!r} declares {universe.size} items; at most {MAX_UNIVERSE} "
            "are supported"
        )
    return universe


# --- planning: every public parameter and the cost, before data -------------------------------


def overflow_delta(
    *, epsilon_per_item: float, alpha: float, chunks: int, n: int, max_items: int
) -> float:
    """δ that the encoder's overflow refusal costs a person (``docs/publish.md``, "δ").

    The completing PPR encoder (notes S2.6) refuses when a contender with ``T > 2**60`` could
    still win, i.e. ``V (T/r*)^α < best <= W_1``. Given the first point the others form a unit
    Poisson process, so a chunk holding ``d`` of the person's items refuses with probability at
    most ``C·G^d``: ``C = Γ(α+1)·2^{-60(α-1)}/(α-1)``, ``G = g·e^{αε}``, ``ε = ε_RR`` and
    ``g = (e^{-αε} + e^{(α+1)ε})/(1+e^ε)`` (so ``g^d = E_Q[r^{-α}]``). Counting the refusal as
    an output, chunk ``q`` is ``(ε_q, p_q(x) + e^{ε_q} p_q(x'))``-DP; over the chunks, with
    ``l = min(D, s)``, ``k = min(2l, s)`` (``s`` = largest chunk) and convexity,
    ``δ <= C·[2(m + (D/l)(G^l - 1)) + G^l·(2D/k)(e^{ε_item·k} - 1)]``.
    """
    epsilon_rr = epsilon_per_item / (2.0 * alpha)
    size = -(-n // chunks)
    load = min(max_items, size)
    spread = min(2 * load, size)
    log_c = math.lgamma(alpha + 1.0) - math.log(alpha - 1.0)
    log_c -= (alpha - 1.0) * INDEX_LIMIT_LOG2 * math.log(2.0)
    log_g = math.log(
        (math.exp(-alpha * epsilon_rr) + math.exp((alpha + 1.0) * epsilon_rr))
        / (1.0 + math.exp(epsilon_rr))
    )
    log_big_g = min(load * (log_g + alpha * epsilon_rr), 700.0)
    refusals = 2.0 * (chunks + max_items / load * math.expm1(log_big_g))
    # log of G^l·(2D/k)(e^{ε_item·k} - 1), without overflow.
    log_flips = log_big_g + math.log(2.0 * max_items / spread)
    log_flips += epsilon_per_item * spread + math.log(-math.expm1(-epsilon_per_item * spread))
    log_total = max(math.log(refusals), log_flips)
    log_total += math.log1p(math.exp(-abs(math.log(refusals) - log_flips)))
    log_delta = log_c + log_total
    return 1.0 if log_delta >= 0.0 else math.exp(log_delta)


@dataclass(frozen=True, kw_only=True)
class ReleasePlan:
    """Everything public about a release, fixed from the policy and catalog before any data."""

    name: str
    table: str
    unit: str
    item: str
    unit_kind: Literal["integer", "string"]
    universe: ItemUniverse
    epsilon: float
    delta: float
    epsilon_per_item: float
    max_items: int
    hamming_bound: int
    chunks: int
    alpha: float
    chunk_log_ratio_bound: float

    def codec(self, public_seed: int) -> CompressedRR:
        return CompressedRR(
            n=self.universe.size,
            epsilon=self.epsilon_per_item,
            chunks=self.chunks,
            public_seed=public_seed,
            alpha=self.alpha,
        )

    @property
    def description(self) -> str:
        return (
            f"publish-rr {self.table}({self.unit}, {self.item}) as {self.name!r}: compressed "
            f"randomized response, at most {self.max_items} items per {self.unit}"
        )

    def summary(self) -> dict[str, Any]:
        return {
            "release": self.name,
            "table": self.table,
            "unit": self.unit,
            "item": self.item,
            "universe": self.universe.to_dict(with_keys=False),
            "epsilon": self.epsilon,
            "delta": self.delta,
            "epsilon_per_item": self.epsilon_per_item,
            "max_items": self.max_items,
            "hamming_bound": self.hamming_bound,
            "chunks": self.chunks,
            "alpha": self.alpha,
            "chunk_log_ratio_bound": self.chunk_log_ratio_bound,
            "neighbours": "replace one unit's item set; the set of units is published",
        }

    def event(self) -> MechanismEvent:
        """The charge: ``h·ε_item`` per person (replace one unit's item set), δ of the refusal."""
        return MechanismEvent(
            MECHANISM,
            self.epsilon,
            self.delta,
            label=f"publish {self.name}",
            params=(
                ("release", self.name),
                ("table", self.table),
                ("unit", self.unit),
                ("item", self.item),
                ("n", self.universe.size),
                ("epsilon_per_item", self.epsilon_per_item),
                ("max_items", self.max_items),
                ("hamming_bound", self.hamming_bound),
                ("chunks", self.chunks),
                ("alpha", self.alpha),
                ("neighbours", "replace_item_set"),
            ),
        )


def _chunk_options(
    *, n: int, epsilon_per_item: float, max_items: int, alpha: float, chunks: int
) -> tuple[float, float]:
    """``(chunk log-ratio bound L, δ)`` of a public configuration (both from public values)."""
    load = min(max_items, -(-n // chunks))
    bound = epsilon_per_item / (2.0 * alpha) * load
    delta = overflow_delta(
        epsilon_per_item=epsilon_per_item, alpha=alpha, chunks=chunks, n=n, max_items=max_items
    )
    return bound, delta


def _choose_chunks(
    requested: int | None, *, n: int, epsilon_per_item: float, max_items: int, alpha: float
) -> tuple[int, float, float]:
    """Chunks, L and δ: ``suggest_chunks`` from the public cap D, or more chunks (a geometric
    grid of chunk sizes, largest first) until L <= MAX_CHUNK_LOG_RATIO and δ <= DELTA_TARGET.

    A chunk may receive all D items of a person (the partition is public, the items are not), so
    only smaller chunks bound the worst chunk's ratio ``e^L`` and with it δ (docs/publish.md).
    """
    options = {"n": n, "epsilon_per_item": epsilon_per_item, "max_items": max_items}
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int | np.integer):
            raise ParameterError(f"chunks must be an integer, got {requested!r}")
        if not 1 <= requested <= n:
            raise ParameterError(f"chunks must be in [1, n={n}], got {requested}")
        bound, delta = _chunk_options(**options, alpha=alpha, chunks=int(requested))
        if bound > MAX_CHUNK_LOG_RATIO or delta > MAX_DELTA:
            raise ParameterError(
                f"chunks={requested} lets {max_items} items of one person crowd a chunk "
                f"(epsilon_rr * load = {bound:.3g}, delta = {delta:.3g}); use more chunks, or "
                "omit chunks to let dpsql choose"
            )
        return int(requested), bound, delta
    first = suggest_chunks(n=n, epsilon=epsilon_per_item, public_d=max_items, alpha=alpha)
    size = -(-n // first)
    best: tuple[float, int, float] | None = None
    while True:
        chunks = -(-n // size)
        bound, delta = _chunk_options(**options, alpha=alpha, chunks=chunks)
        if bound <= MAX_CHUNK_LOG_RATIO:
            if delta <= DELTA_TARGET:
                return chunks, bound, delta
            if best is None or delta < best[0]:
                best = (delta, chunks, bound)
        if size == 1:
            break
        size = min(size - 1, int(size / 1.05))
    if best is None or best[0] > MAX_DELTA:
        raise ParameterError(
            f"epsilon per item {epsilon_per_item:.6g} is too large for the PPR encoder at "
            f"alpha={alpha:g} (even one item per chunk gives delta > {MAX_DELTA:g}); lower "
            "epsilon or raise max_items"
        )
    return best[1], best[2], best[0]


def plan_release(
    policy: Policy,
    catalog: dict[str, dict[str, str]],
    *,
    name: str,
    table: str,
    unit: str,
    item: str,
    epsilon: float,
    chunks: int | None = None,
    alpha: float = 2.0,
    max_items: int | None = None,
) -> ReleasePlan:
    """Check a release against the policy and catalog and price it; reads no data."""
    name = _check_name(name)
    epsilon = check_budget_value("epsilon", epsilon, allow_zero=False)
    try:
        alpha = float(alpha)
    except (TypeError, ValueError):
        raise ParameterError(f"alpha must be a finite number > 1, got {alpha!r}") from None
    if not math.isfinite(alpha) or alpha <= 1.0:
        raise ParameterError(f"alpha must be a finite number > 1, got {alpha!r}")
    table_policy = policy.table(table)
    if table_policy is None:
        raise PolicyError(
            f"table {table!r} is not in the policy; only policy tables can be published"
        )
    matches = [t for t in catalog if t.lower() == table.lower()]
    if not matches:
        raise PolicyError(f"policy table {table!r} does not exist in the database")
    columns = catalog[matches[0]]
    if unit != table_policy.privacy_unit:
        raise PolicyError(
            f"unit {unit!r} is not the privacy unit of table {table!r} "
            f"({table_policy.privacy_unit!r})"
        )
    for role, column in (("unit", unit), ("item", item)):
        if column not in columns:
            raise ParameterError(f"{role} column {column!r} does not exist in table {table!r}")
    if item == unit:
        raise ParameterError(f"item column must differ from the unit column, both are {item!r}")
    universe = _universe(item, ColumnKind.of(columns[item]), table_policy.column(item))
    unit_type = columns[unit].upper().split("(")[0].strip()
    unit_kind: Literal["integer", "string"] = "integer" if unit_type in _INTEGER_TYPES else "string"
    if max_items is None:
        max_items = table_policy.max_rows_per_unit
    if isinstance(max_items, bool) or not isinstance(max_items, int | np.integer) or max_items < 1:
        raise ParameterError(f"max_items must be an integer >= 1, got {max_items!r}")
    n = universe.size
    cap = min(int(max_items), n)
    hamming = min(2 * cap, n)
    epsilon_per_item = math.nextafter(epsilon / hamming, 0.0)
    chosen, bound, delta = _choose_chunks(
        chunks, n=n, epsilon_per_item=epsilon_per_item, max_items=cap, alpha=alpha
    )
    return ReleasePlan(
        name=name,
        table=matches[0],
        unit=unit,
        item=item,
        unit_kind=unit_kind,
        universe=universe,
        epsilon=epsilon,
        delta=delta,
        epsilon_per_item=epsilon_per_item,
        max_items=cap,
        hamming_bound=hamming,
        chunks=chosen,
        alpha=alpha,
        chunk_log_ratio_bound=bound,
    )


# --- the stored release -------------------------------------------------------------------------


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


# --- publishing ---------------------------------------------------------------------------------


def _read_rows(
    backend: Backend, plan: ReleasePlan
) -> tuple[list[UserId], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The table's units (sorted) and its distinct (person, item index) pairs in the universe.

    Units with no item in the universe are listed with no pairs; NULL units and items are dropped.
    """
    table, unit, item = _quote(plan.table), _quote(plan.unit), _quote(plan.item)
    unit_value = f"CAST({unit} AS {'BIGINT' if plan.unit_kind == 'integer' else 'VARCHAR'})"
    units = backend.run(
        f"SELECT DISTINCT {unit_value} AS __unit FROM {table} WHERE {unit} IS NOT NULL "
        "ORDER BY __unit"
    )["__unit"]
    universe = plan.universe
    if universe.source == "bounds":
        low, high = universe.low, universe.low + universe.size - 1
        pairs = backend.run(
            f"SELECT DISTINCT {unit_value} AS __unit, "
            f"CAST(CAST({item} AS HUGEINT) - ({low}) AS BIGINT) AS __index FROM {table} "
            f"WHERE {unit} IS NOT NULL AND {item} BETWEEN ({low}) AND ({high})"
        )
        index = pairs["__index"].to_numpy(dtype=np.int64)
    else:
        pairs = backend.run(
            f"SELECT DISTINCT {unit_value} AS __unit, CAST({item} AS VARCHAR) AS __item "
            f"FROM {table} WHERE {unit} IS NOT NULL AND {item} IS NOT NULL"
        )
        keys = pd.Index([str(key) for key in universe.keys])
        index = keys.get_indexer(pairs["__item"].astype(str)).astype(np.int64)
    person = pd.Index(units).get_indexer(pairs["__unit"]).astype(np.int64)
    inside = index >= 0
    user_ids: list[UserId] = (
        [int(u) for u in units] if plan.unit_kind == "integer" else [str(u) for u in units]
    )
    return user_ids, person[inside], index[inside]


def _cap_items(
    person: npt.NDArray[np.int64],
    item: npt.NDArray[np.int64],
    cap: int,
    rng: np.random.Generator,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Keep a uniformly random subset of at most ``cap`` of each person's (distinct) items.

    The subset depends only on the person's own items and fresh private randomness, so capping is
    a per-person randomized map into sets of size <= cap (docs/publish.md, "cap").
    """
    order = np.lexsort((rng.random(person.size), person))
    person, item = person[order], item[order]
    first = np.ones(person.size, dtype=bool)
    first[1:] = person[1:] != person[:-1]
    index = np.arange(person.size)
    rank = index - np.maximum.accumulate(np.where(first, index, 0))
    keep = rank < cap
    return person[keep], item[keep]


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


def publish_rr(
    database: str | Path,
    *,
    analyst: str,
    table: str,
    unit: str,
    item: str,
    epsilon: float,
    name: str,
    chunks: int | None = None,
    alpha: float = 2.0,
    max_items: int | None = None,
    progress: Progress | None = None,
) -> PublishedRelease:
    """Publish every person's item set of ``table`` with compressed randomized response.

    ``epsilon`` is the person-level cost charged to ``analyst`` (replace-one-person; the set of
    units is published): each item costs ``epsilon / min(2·max_items, n)``. The item universe
    comes from the policy (``public_keys`` or integer ``bounds`` of ``item``), ``max_items``
    defaults to the table's ``max_rows_per_unit``, ``chunks`` to a choice from those public
    values. Checks, then charges, then reads, encodes and stores (module docstring). The session's
    secure generator draws the public seed, the cap's subsets and the encoder's noise.
    ``progress`` (``dpsql.engine.progress``) is told the stages after the charge.
    """
    report = progress if progress is not None else no_progress
    name = _check_name(name)
    # Fail before the charge if the file cannot be written (e.g. another process has it open).
    _open_writable(database).close()
    with Session(database, analyst=analyst) as session:
        catalog = session.backend.catalog()
        plan = plan_release(
            session.policy,
            catalog,
            name=name,
            table=table,
            unit=unit,
            item=item,
            epsilon=epsilon,
            chunks=chunks,
            alpha=alpha,
            max_items=max_items,
        )
        _refuse_existing(session.backend, plan.name)
        entry = session.charge(
            plan.event(), query=plan.description, plan=plan.summary(), mechanism=MECHANISM
        )
        public_seed = int.from_bytes(session.rng.bytes(32), "big")
        codec = plan.codec(public_seed)
        report(READING_DATA, None)
        user_ids, person, index = _read_rows(session.backend, plan)
        person, index = _cap_items(person, index, plan.max_items, session.rng)
        messages: list[bytes] = []
        report("encoding messages", None)
        if user_ids:  # the codec cannot encode zero persons (IndexError in _user_keys)
            messages = codec.encode_pairs(person, index, user_ids=user_ids, rng=session.rng)
    release = PublishedRelease(
        name=plan.name,
        table=plan.table,
        unit=plan.unit,
        item=plan.item,
        unit_kind=plan.unit_kind,
        universe=plan.universe,
        persons=len(user_ids),
        epsilon=entry.cost.epsilon,
        delta=entry.cost.delta,
        epsilon_per_item=plan.epsilon_per_item,
        epsilon_rr=codec.epsilon_rr,
        max_items=plan.max_items,
        hamming_bound=plan.hamming_bound,
        chunks=plan.chunks,
        alpha=plan.alpha,
        code=codec.code,
        public_seed=public_seed,
        message_bytes=sum(len(m) for m in messages),
        analyst=analyst,
        ledger_entry=entry.seq,
        created=dt.datetime.now(dt.UTC).isoformat(timespec="microseconds"),
    )
    report("storing the release", None)
    _write_release(database, release, user_ids, messages)
    report(DONE, 1.0)
    return release


# --- post-processing queries ----------------------------------------------------------------------


@dataclass(frozen=True)
class PopularityResult:
    """Unbiased counts of persons holding each item (among their <= D published items).

    ``lower``/``upper`` are per-item normal intervals at ``confidence`` (not adjusted for picking
    the top ``k``); ``std_error`` is the same for every item (binary RR).
    """

    release: str
    items: list[Item]
    estimate: npt.NDArray[np.float64]
    lower: npt.NDArray[np.float64]
    upper: npt.NDArray[np.float64]
    std_error: float
    confidence: float
    persons: int
    ledger_entry: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "release": self.release,
            "columns": ["item", "estimate"],
            "rows": [[i, float(e)] for i, e in zip(self.items, self.estimate, strict=True)],
            "intervals": {
                "estimate": [
                    [float(a), float(b)] for a, b in zip(self.lower, self.upper, strict=True)
                ]
            },
            "std_error": self.std_error,
            "confidence": self.confidence,
            "persons": self.persons,
            "epsilon_spent": 0.0,
            "delta_spent": 0.0,
            "ledger_entry": self.ledger_entry,
        }


@dataclass(frozen=True)
class CommonItemsResult:
    """Unbiased estimate of how many items two persons share, with its standard error."""

    release: str
    person_a: UserId
    person_b: UserId
    estimate: float
    std_error: float
    ledger_entry: int

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "epsilon_spent": 0.0, "delta_spent": 0.0}


@dataclass(frozen=True)
class DecodedRow:
    """A person's decoded randomized-response row: exactly RR at the release's ``epsilon_rr``."""

    release: str
    person: UserId
    row: npt.NDArray[np.bool_]
    items: list[Item]
    ledger_entry: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "release": self.release,
            "person": self.person,
            "items": self.items,
            "ones": len(self.items),
            "n": int(self.row.size),
            "epsilon_spent": 0.0,
            "delta_spent": 0.0,
            "ledger_entry": self.ledger_entry,
        }


def _person_id(release: PublishedRelease, value: object) -> UserId:
    """A person id of the release's kind (an int, or a str of digits, for integer units)."""
    if release.unit_kind == "string":
        if not isinstance(value, str):
            raise ParameterError(f"person must be a string id, got {value!r}")
        return value
    try:
        if isinstance(value, str):
            return int(value.strip())
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ParameterError(f"person must be an integer id, got {value!r}") from None


def _messages(
    backend: Backend, release: PublishedRelease, persons: Sequence[UserId] | None = None
) -> tuple[list[UserId], list[bytes]]:
    """Stored (user id, message) pairs: all, or those of ``persons`` (each must be present)."""
    where = ""
    if persons is not None:
        literals = [str(p) if release.unit_kind == "integer" else _string(str(p)) for p in persons]
        where = f" WHERE user_id IN ({', '.join(literals)})"
    frame = backend.run(
        f"SELECT user_id, message FROM {_quote(release.storage_table)}{where} ORDER BY user_id"
    )
    ids: list[UserId] = [
        int(u) if release.unit_kind == "integer" else str(u) for u in frame["user_id"]
    ]
    messages = [bytes(m) for m in frame["message"]]
    if persons is not None:
        found = set(ids)
        for person in persons:
            if person not in found:
                raise ParameterError(f"person {person!r} is not in release {release.name!r}")
    return ids, messages


def _source(release: PublishedRelease) -> str:
    return f"{MECHANISM} release {release.name!r} (ledger entry {release.ledger_entry})"


def _post_process(
    database: str | Path,
    *,
    analyst: str,
    name: str,
    label: str,
    compute: Callable[[Session, PublishedRelease], T],
) -> tuple[T, LedgerEntry]:
    """Compute from the stored release only, then record a zero-cost entry naming it."""
    with Session(database, analyst=analyst) as session:
        release = _find(session.backend, name)
        value = compute(session, release)
        entry = session.charge(
            PostProcessingEvent(source=_source(release), label=label),
            query=f"rr {label} {release.name}",
            plan={"release": release.name, "source_entry": release.ledger_entry, "query": label},
            mechanism=POST_PROCESSING,
        )
    return value, entry


def release_popularity(
    database: str | Path,
    *,
    analyst: str,
    name: str,
    top_k: int | None = None,
    confidence: float | None = None,
) -> PopularityResult:
    """Unbiased per-item counts over the release (notes S5), all items in universe order or the
    ``top_k`` largest estimates; ``confidence`` defaults to the policy's. Free (post-processing).
    """
    if top_k is not None and (
        isinstance(top_k, bool) or not isinstance(top_k, int | np.integer) or top_k < 1
    ):
        raise ParameterError(f"top_k must be an integer >= 1, got {top_k!r}")

    def compute(session: Session, release: PublishedRelease) -> PopularityResult:
        level = session.policy.dataset.confidence if confidence is None else confidence
        ids, messages = _messages(session.backend, release)
        counts = release.codec.noisy_counts(messages, user_ids=ids)
        estimate = item_popularity(
            counts, len(ids), epsilon_rr=release.epsilon_rr, confidence=level
        )
        if top_k is None:
            order = np.arange(release.universe.size)
        else:
            order = np.argsort(-estimate.estimate, kind="stable")[: int(top_k)]
        return PopularityResult(
            release=release.name,
            items=release.universe.items(order),
            estimate=estimate.estimate[order],
            lower=estimate.lower[order],
            upper=estimate.upper[order],
            std_error=estimate.std_error,
            confidence=estimate.confidence,
            persons=len(ids),
            ledger_entry=0,
        )

    result, entry = _post_process(
        database, analyst=analyst, name=name, label="popularity", compute=compute
    )
    return dataclasses.replace(result, ledger_entry=entry.seq)


def _decoded(
    backend: Backend, release: PublishedRelease, persons: Sequence[object]
) -> tuple[list[UserId], dict[UserId, npt.NDArray[np.bool_]]]:
    """The persons' ids as given, and their decoded rows (each person decoded once)."""
    wanted = [_person_id(release, p) for p in persons]
    ids, messages = _messages(backend, release, list(dict.fromkeys(wanted)))
    rows = release.codec.decode_many(messages, user_ids=ids)
    return wanted, dict(zip(ids, rows, strict=True))


def release_common_items(
    database: str | Path,
    *,
    analyst: str,
    name: str,
    pairs: Sequence[tuple[object, object]],
) -> list[CommonItemsResult]:
    """For each pair of distinct persons, an unbiased estimate of how many items they share
    (``Σ_i x̂_a,i x̂_b,i``, notes S5) and its standard error. Free (post-processing)."""
    pairs = list(pairs)
    if not pairs:
        raise ParameterError("pairs must name at least one pair of persons")

    def compute(session: Session, release: PublishedRelease) -> list[CommonItemsResult]:
        flat = [p for pair in pairs for p in pair]
        wanted, rows = _decoded(session.backend, release, flat)
        results = []
        for a, b in zip(wanted[0::2], wanted[1::2], strict=True):
            if a == b:
                raise ParameterError(
                    f"common items need two different persons, got {a!r} twice (a row's noise "
                    "is not independent of itself)"
                )
            estimate = common_items(rows[a], rows[b], epsilon_rr=release.epsilon_rr)
            results.append(
                CommonItemsResult(release.name, a, b, estimate.estimate, estimate.std_error, 0)
            )
        return results

    for pair in pairs:
        if len(pair) != 2:
            raise ParameterError(f"each pair must hold two persons, got {pair!r}")
    results, entry = _post_process(
        database, analyst=analyst, name=name, label="common_items", compute=compute
    )
    return [dataclasses.replace(r, ledger_entry=entry.seq) for r in results]


def release_decode(
    database: str | Path, *, analyst: str, name: str, persons: Sequence[object]
) -> list[DecodedRow]:
    """The decoded (noisy) rows of ``persons``: exactly randomized response of their published
    item sets at the release's ``epsilon_rr``. Free (post-processing)."""
    persons = list(persons)
    if not persons:
        raise ParameterError("persons must name at least one person")

    def compute(session: Session, release: PublishedRelease) -> list[DecodedRow]:
        wanted, rows = _decoded(session.backend, release, persons)
        return [
            DecodedRow(release.name, p, rows[p], release.universe.items(np.flatnonzero(rows[p])), 0)
            for p in wanted
        ]

    rows, entry = _post_process(
        database, analyst=analyst, name=name, label="decode", compute=compute
    )
    return [dataclasses.replace(r, ledger_entry=entry.seq) for r in rows]
