"""Pydantic models at the HTTP boundary: what a request may carry, and what answers look like.

Requests forbid unknown fields: an ``analyst``, a generator seed or a memory limit in a body is
refused, never read. Values (ε, δ, options) are checked by the engine, so the messages are the
command line's.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dpsql.engine.choices import MECHANISM_NAMES, STREAM_MECHANISMS
from dpsql.engine.results import BudgetStatus

__all__ = [
    "ExplainResponse",
    "Me",
    "PublicColumn",
    "PublicTable",
    "QueryRequest",
    "QueryResponse",
    "SchemaColumn",
    "SchemaDataset",
    "SchemaResponse",
    "SchemaTable",
    "StreamColumnRequest",
    "StreamRequest",
    "VerifyResponse",
]


class QueryRequest(BaseModel):
    """A query (``POST /v1/query``) or a plan to price (``POST /v1/explain``).

    Strict: ``true`` or ``"1"`` is not an epsilon (lax parsing would charge ε = 1).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    sql: str = Field(min_length=1, description="the SQL; OPTIONS(...) in it work as on the CLI")
    epsilon: float | None = Field(None, description="epsilon of this query")
    delta: float | None = Field(None, description="delta of this query")
    mechanism: Literal[(*MECHANISM_NAMES, *STREAM_MECHANISMS)] | None = Field(  # type: ignore[valid-type]
        None,
        description="how keys without public keys are released; laplace skips synopses and "
        "streams; pmw / range_tree answer a COUNT(*) from a query stream, opening one",
    )
    max_answers: int | None = Field(None, description="cut-off of the sparse vector technique")
    accuracy: float | None = Field(
        None, description="instead of epsilon: the interval half-width to meet (least epsilon)"
    )
    dialect: str = Field("duckdb", max_length=32, description="SQL dialect of `sql` (sqlglot's)")

    def options(self) -> dict[str, Any]:
        """The keyword arguments of ``Session.execute``/``explain`` this request gives."""
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "mechanism": self.mechanism,
            "max_answers": self.max_answers,
            "accuracy": self.accuracy,
        }


class StreamColumnRequest(BaseModel):
    """One column of a stream: its bin width and bounds in the column's own type."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(min_length=1, max_length=256)
    width: int | str = Field(
        1,
        description="cells' width: an integer (integer columns; days for DATE), an interval "
        "such as '1 hour' (TIMESTAMP), a decimal such as '0.50' (DECIMAL)",
    )
    bounds: tuple[int | float | str, int | float | str] | None = Field(
        None, description="[low, high] in the column's type; default: the policy's bounds"
    )

    def spec(self) -> tuple[object, ...]:
        return (self.name, self.width) + (tuple(self.bounds) if self.bounds else ())


class StreamRequest(BaseModel):
    """Open a query stream (``POST /v1/streams``): charged once, then it answers later counts."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    table: str = Field(min_length=1, max_length=256)
    columns: list[StreamColumnRequest] = Field(min_length=1, max_length=8)
    epsilon: float = Field(description="the stream's whole epsilon, charged once")
    delta: float = Field(0.0, description="the stream's whole delta (pmw only)")
    mechanism: Literal[STREAM_MECHANISMS] = "pmw"  # type: ignore[valid-type]
    filter: str | None = Field(
        None,
        min_length=1,
        description="a fixed WHERE condition on other columns (e.g. \"country = 'DK'\"); later "
        "queries are answered when their WHERE is exactly it AND conditions on the columns",
    )
    updates: int | None = Field(None, description="pmw: updates before the stream stops")
    threshold: float | None = Field(None, description="pmw: the error threshold, in rows")
    expected_queries: int | None = Field(None, description="pmw: sets the default threshold")
    warm_share: float | None = Field(
        None, description="pmw: share of epsilon spent on the warm start (default 0.8)"
    )
    name: str | None = Field(None, max_length=64, description="the stream's name")

    def arguments(self) -> dict[str, Any]:
        """The keyword arguments of ``Session.open_stream``."""
        given = {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "mechanism": self.mechanism,
            "filter": self.filter,
            "updates": self.updates,
            "threshold": self.threshold,
            "expected_queries": self.expected_queries,
            "warm_share": self.warm_share,
            "name": self.name,
        }
        return {k: v for k, v in given.items() if v is not None}


class QueryResponse(BaseModel):
    """The JSON of ``dpsql query --format json``."""

    columns: list[str]
    rows: list[list[Any]]
    intervals: dict[str, list[list[float | None]]]
    confidence: float
    noise_scale: dict[str, float | None]
    epsilon_spent: float
    delta_spent: float
    mechanism: str
    analyst: str
    ledger_entry: int
    details: dict[str, Any]


class ExplainResponse(BaseModel):
    """Plan and cost of a query, and the budget lines it draws on; nothing is read or charged."""

    query: str
    plan: dict[str, Any]
    expected_error: dict[str, float | None] = Field(
        {}, description="interval half-width of each noisy output (null: depends on the data)"
    )
    cost: dict[str, float]
    draws_on: list[dict[str, Any]]


class VerifyResponse(BaseModel):
    """Result of checking the ledger's hash chain and every entry's total."""

    verified: bool
    entries: int
    last_hash: str | None
    detail: str


class Me(BaseModel):
    """Who the token names."""

    name: str
    role: Literal["analyst", "auditor"]


class SchemaColumn(BaseModel):
    """A column of a policy table: its database type and what the policy lets a query do
    with it."""

    name: str
    type: str = Field(description="the database's type name, e.g. BIGINT, VARCHAR")
    bounds: list[float] | None = Field(description="[low, high]: SUM/AVG clamp to it")
    public_keys: list[str | int | float | bool] | None = Field(
        description="GROUP BY answers every one of these keys"
    )
    key_domain: Literal["hash64"] | list[int] | None = Field(
        description="public key domain of a GROUP BY without public keys"
    )
    auto_bounds: Literal["nonnegative", "symmetric"] | None = Field(
        description="SUM/AVG without bounds choose them privately"
    )


class SchemaTable(BaseModel):
    """A table of the policy: its privacy unit, contribution bounds and columns."""

    name: str
    privacy_unit: str
    max_groups_per_unit: int
    max_rows_per_group: int
    max_rows_per_unit: int
    partition_column: str | None
    columns: list[SchemaColumn]


class PublicColumn(BaseModel):
    """A column of a public table."""

    name: str
    type: str


class PublicTable(BaseModel):
    """A table whose contents are public (e.g. ranges to join)."""

    name: str
    description: str
    columns: list[PublicColumn]


class SchemaDataset(BaseModel):
    """The dataset's name and the defaults a query takes from the policy."""

    name: str
    default_query_epsilon: float | None
    default_query_delta: float
    confidence: float = Field(description="level of the reported intervals")
    composition: str
    period: str
    share_synopses: bool


class SchemaResponse(BaseModel):
    """What the caller may query: the policy's tables and public tables (no other table
    appears), the dataset's query defaults, and the caller's budget lines."""

    dataset: SchemaDataset
    tables: list[SchemaTable]
    public_tables: list[PublicTable]
    budget: list[BudgetStatus] = Field(
        description="the caller's lines of `GET /v1/budget` (an auditor: the dataset's)"
    )
    example_query: str | None = Field(description="a first query over the first policy table")
