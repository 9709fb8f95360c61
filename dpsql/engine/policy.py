"""Privacy policies: what may be asked of a dataset, by whom, and with what budget.

A policy is a TOML document validated once, at the boundary, by frozen pydantic models that reject
unknown keys. Example::

    [dataset]
    epsilon = 10.0            # total over all analysts
    delta = 1e-6

    [analysts.alice]
    epsilon = 4.0
    delta = 1e-7

    [tables.requests]
    privacy_unit = "user_id"
    max_groups_per_unit = 5
    max_rows_per_group = 1
    max_rows_per_unit = 20

    [tables.requests.columns.bytes]
    bounds = [0, 1000000]

    [tables.requests.columns.country]
    public_keys = ["DK", "NO", "SE"]

    [tables.requests.columns.day]    # a DATE column: the domain of its calendar keys
    bounds = ["2025-01-01", "2025-12-31"]
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from dpsql.errors import PolicyError

__all__ = [
    "AnalystPolicy",
    "ColumnPolicy",
    "DatasetPolicy",
    "Policy",
    "PublicTablePolicy",
    "TablePolicy",
    "load_policy",
    "parse_policy",
]

Name = Annotated[str, StringConstraints(min_length=1, max_length=128)]
Epsilon = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Delta = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]
PublicKey = str | int | float | bool
NumericBound = Annotated[float, Field(strict=True)]
CalendarBound = Annotated[str, StringConstraints(min_length=1, max_length=64, strict=True)]
"""A DATE or TIMESTAMP bound as the database reads it (``'2025-01-01'``,
``'2025-01-01 06:00:00'``): converted and ordered by the database when the policy is set
(``dpsql.engine.literals.Binder.calendar_bounds``), never parsed here."""
TypeName = Annotated[str, StringConstraints(min_length=1, max_length=64)]
MEMORY_PATTERN = r"(?i)^\d+(\.\d+)?\s*([KMGT]i?B|B)$"
"""A DuckDB memory size such as ``6GB`` or ``512MiB``."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AnalystPolicy(_Frozen):
    """An analyst's allocation within the dataset cap."""

    epsilon: Epsilon
    delta: Delta = 0.0


class DatasetPolicy(_Frozen):
    """The dataset's total budget over all analysts, and query defaults."""

    name: Name | None = Field(default=None, description="defaults to the database file's stem")
    epsilon: Epsilon
    delta: Delta = 0.0
    default_query_epsilon: Epsilon | None = Field(
        default=None, description="epsilon of a query that states none"
    )
    default_query_delta: Delta = 0.0
    confidence: float = Field(default=0.95, gt=0, lt=1, description="level of reported intervals")
    auto_bounds_share: float = Field(
        default=0.1,
        gt=0,
        lt=1,
        description="share of a query's epsilon spent choosing automatic bounds",
    )
    composition: Literal["basic", "advanced", "zcdp"] = Field(
        default="basic",
        description="'advanced' also tracks the advanced-composition bound, 'zcdp' the "
        "(approximate) zCDP bound; each is used when smaller",
    )
    advanced_delta: Delta | None = Field(
        default=None,
        description="delta' of advanced composition or of the zCDP conversion (required with "
        "'advanced' and 'zcdp')",
    )
    memory_limit: Annotated[str, StringConstraints(pattern=MEMORY_PATTERN)] | None = Field(
        default=None,
        description="cap on DuckDB's memory (e.g. '6GB'); larger work spills to disk. Set by the "
        "administrator for the whole table, never by an analyst per query",
    )
    time_limit: float = Field(
        default=60.0,
        strict=True,
        gt=0,
        le=86_400,
        description="seconds one request of the Python API or the CLI may run (execute and the "
        "free explain; the service uses its query_timeout). Set by the administrator, never by "
        "an analyst per query",
    )
    period: Literal["none", "month", "year"] = Field(
        default="none",
        description="renew the caps every calendar month or year (UTC): a policy decision, not "
        "a lifetime guarantee per person (exposure adds up over periods)",
    )
    share_synopses: bool = Field(
        default=False,
        description="whether a synopsis one analyst paid for answers every analyst (false: only "
        "the analyst whose ledger entry paid for it)",
    )

    @model_validator(mode="after")
    def _advanced_needs_delta(self) -> DatasetPolicy:
        if self.composition != "basic" and not self.advanced_delta:
            raise ValueError(f"composition = {self.composition!r} needs advanced_delta > 0")
        return self


class ColumnPolicy(_Frozen):
    """What a column may be used for: summed within bounds, grouped over public keys, or grouped
    over keys released by thresholding (optionally within a declared public key domain)."""

    bounds: tuple[NumericBound, NumericBound] | tuple[CalendarBound, CalendarBound] | None = Field(
        default=None,
        description="[low, high]: numbers for a numeric column; ISO dates or timestamps for a "
        "DATE or TIMESTAMP column (its calendar keys' domain)",
    )
    public_keys: tuple[PublicKey, ...] | None = None
    key_domain: Literal["hash64"] | tuple[int, int] | None = Field(
        default=None,
        description="public key domain for pure-DP GROUP BY without public keys: 'hash64' "
        "(64-bit key hashes) or an inclusive integer range [low, high]",
    )
    auto_bounds: Literal["nonnegative", "symmetric"] | None = Field(
        default=None,
        description="without bounds, SUM/AVG may choose [0, U] or [-U, U] with AboveThreshold",
    )
    expected_keys: int = Field(
        default=100_000,
        ge=1,
        le=10**9,
        description="public guess of the number of distinct keys; sizes ALP sketches",
    )

    @field_validator("bounds")
    @classmethod
    def _ordered_finite(
        cls, value: tuple[float, float] | tuple[str, str] | None
    ) -> tuple[float, float] | tuple[str, str] | None:
        if value is not None and not isinstance(value[0], str):
            low, high = value
            if not (math.isfinite(low) and math.isfinite(high)) or low > high:
                raise ValueError(f"bounds must be finite with low <= high, got [{low}, {high}]")
        return value

    @property
    def numeric_bounds(self) -> tuple[float, float] | None:
        """The bounds of a numeric column (None: none, or calendar bounds)."""
        if self.bounds is None or isinstance(self.bounds[0], str):
            return None
        return self.bounds  # type: ignore[return-value]

    @property
    def calendar_bounds(self) -> tuple[str, str] | None:
        """The bounds of a DATE or TIMESTAMP column, as written (None: none, or numbers)."""
        if self.bounds is None or not isinstance(self.bounds[0], str):
            return None
        return self.bounds  # type: ignore[return-value]

    @field_validator("public_keys")
    @classmethod
    def _distinct_keys(cls, value: tuple[PublicKey, ...] | None) -> tuple[PublicKey, ...] | None:
        if value is not None:
            if not value:
                raise ValueError("public_keys must not be empty")
            if len(set(value)) != len(value):
                raise ValueError("public_keys must be distinct")
        return value


class TablePolicy(_Frozen):
    """A table's privacy unit, contribution bounds and column rules."""

    privacy_unit: Name
    max_groups_per_unit: int = Field(default=1, ge=1, le=1_000_000)
    max_rows_per_group: int = Field(default=1, ge=1, le=1_000_000)
    max_rows_per_unit: int = Field(default=1, ge=1, le=1_000_000)
    partition_column: Name | None = Field(
        default=None,
        description="a fixed attribute of each unit; disjoint values compose in parallel",
    )
    columns: dict[Name, ColumnPolicy] = Field(default_factory=dict)
    expected_rows: int | None = Field(
        default=None,
        ge=1,
        le=10**15,
        description="a public guess of the rows an AVG averages over (a query may state its own "
        "with OPTIONS(expected_count=...)): gives AVG an expected error and accuracy targets",
    )
    source: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="Parquet or CSV files (a path or glob, relative to the database's directory) "
        "the table is read from, instead of a table in the database",
    )
    source_format: Literal["parquet", "csv"] | None = Field(
        default=None, description="format of the source files (default: from their extension)"
    )
    source_columns: tuple[tuple[Name, TypeName], ...] | None = Field(
        default=None,
        description='a CSV source\'s columns in file order, [["name", "DUCKDB TYPE"], ...] '
        "(required for CSV: types are declared, never sniffed from the rows)",
    )
    csv_delimiter: Annotated[str, StringConstraints(min_length=1, max_length=1)] = Field(
        default=",", description="field delimiter of a CSV source"
    )
    csv_header: bool = Field(default=True, description="whether a CSV source has a header line")

    @model_validator(mode="after")
    def _partition_values_declared(self) -> TablePolicy:
        column = self.partition_column
        if column is not None and self.column(column).public_keys is None:
            raise ValueError(
                f"partition column {column!r} needs its values declared: set "
                f"columns.{column}.public_keys = [...] (queries are charged to these values)"
            )
        return self

    def column(self, name: str) -> ColumnPolicy:
        """The rules for ``name`` (no rules: counted and filtered only)."""
        return self.columns.get(name, ColumnPolicy())


class PublicTablePolicy(_Frozen):
    """A table whose contents are public (e.g. a list of ranges); it may be joined and read."""

    description: str = ""


class Policy(_Frozen):
    """A dataset's whole privacy policy."""

    dataset: DatasetPolicy
    analysts: dict[Name, AnalystPolicy] = Field(default_factory=dict)
    tables: dict[Name, TablePolicy] = Field(default_factory=dict)
    public_tables: dict[Name, PublicTablePolicy] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _allocations_within_cap(self) -> Policy:
        for name, analyst in self.analysts.items():
            if analyst.epsilon > self.dataset.epsilon or analyst.delta > self.dataset.delta:
                raise ValueError(
                    f"analyst {name!r} is allocated more than the dataset cap "
                    f"(epsilon {analyst.epsilon} > {self.dataset.epsilon} "
                    f"or delta {analyst.delta} > {self.dataset.delta})"
                )
        return self

    def table(self, name: str) -> TablePolicy | None:
        """The policy of ``name``, matched case-insensitively like SQL identifiers."""
        for key, table in self.tables.items():
            if key.lower() == name.lower():
                return table
        return None


def _describe(error: ValidationError) -> str:
    problems = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "policy"
        if item["type"] == "extra_forbidden":
            problems.append(f"unknown key {where!r}")
        else:
            problems.append(f"{where}: {item['msg']}")
    return "; ".join(problems)


def parse_policy(data: dict[str, Any] | str) -> Policy:
    """Validate a policy given as a mapping, TOML text, or JSON text (as stored in the ledger)."""
    try:
        if isinstance(data, str):
            if data.lstrip().startswith("{"):
                return Policy.model_validate_json(data)
            data = tomllib.loads(data)
        return Policy.model_validate(data)
    except tomllib.TOMLDecodeError as error:
        raise PolicyError(f"policy is not valid TOML: {error}") from None
    except ValidationError as error:
        raise PolicyError(f"invalid policy: {_describe(error)}") from None


def load_policy(path: str | Path) -> Policy:
    """Read and validate a TOML policy file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise PolicyError(f"cannot read policy file {str(path)!r}: {error.strerror}") from None
    return parse_policy(text)
