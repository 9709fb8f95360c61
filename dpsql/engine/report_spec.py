"""Report specifications: a named batch of queries with one budget, as a TOML file.

Validated by frozen pydantic models that refuse unknown keys (like the policy). Example::

    title = "Monthly traffic"
    epsilon = 1.0                # the total the queries share
    allocation = "weights"       # or "accuracy", "minimax" (see dpsql.engine.allocation)

    [queries.requests_by_country]
    sql = "SELECT country, COUNT(*) AS requests FROM requests GROUP BY country"
    weight = 2

    [queries.bytes_by_country]
    sql = "SELECT country, SUM(bytes) AS bytes FROM requests GROUP BY country"
    expected = 1e8               # public guess of a typical value (for "minimax")
    accuracy = 5e6               # ±5e6 at the report's confidence (for "accuracy")
    chart = "dot"

    [queries.mean_latency]
    sql = "SELECT country, AVG(latency_ms) AS latency FROM requests GROUP BY country"
    epsilon = 0.1                # a fixed share: an AVG's error depends on the data
    simultaneous = true          # all of its intervals hold at once (default: the report's)

Nothing in a spec is read from the data: ``expected`` is the author's public guess of a typical
value, used only to make errors of different queries comparable.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from dpsql.engine.policy import _describe
from dpsql.errors import ParameterError

__all__ = ["QuerySpec", "ReportSpec", "load_report_spec", "parse_report_spec"]

Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
QueryName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_]{0,63}$")]

RULES = ("weights", "accuracy", "minimax")


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class QuerySpec(_Frozen):
    """One query of a report."""

    sql: Annotated[str, StringConstraints(min_length=1, max_length=20_000)]
    title: str | None = None
    weight: Positive = 1.0
    epsilon: Positive | None = Field(
        default=None, description="a fixed share, taken before the rule splits the rest"
    )
    accuracy: Positive | None = Field(
        default=None, description="interval half-width to meet at the report's confidence"
    )
    expected: Positive | None = Field(
        default=None, description="public guess of a typical value, for relative errors"
    )
    column: str | None = Field(
        default=None, description="the output the accuracy/expected refer to (if several)"
    )
    simultaneous: bool | None = Field(
        default=None,
        description="every interval of the answer holds at once at the report's confidence "
        "(each cell's level is split across the cells, priced before the charge); default: "
        "the report's",
    )
    delta: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] = 0.0
    chart: Literal["bar", "dot", "none"] = "bar"
    format: Literal["csv", "json"] = "csv"


class ReportSpec(_Frozen):
    """A report: a title, a total budget (or accuracy targets) and named queries."""

    title: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    description: str = ""
    epsilon: Positive | None = Field(default=None, description="the total the queries share")
    allocation: Literal["weights", "accuracy", "minimax"] | None = None
    confidence: Annotated[float, Field(gt=0, lt=1)] | None = None
    simultaneous: bool = Field(
        default=False, description="the default of every query's simultaneous"
    )
    queries: dict[QueryName, QuerySpec] = Field(min_length=1, max_length=200)

    def simultaneous_for(self, query: QuerySpec) -> bool:
        """Whether ``query``'s intervals must hold at once (its own setting, else the
        report's)."""
        return self.simultaneous if query.simultaneous is None else query.simultaneous

    @property
    def rule(self) -> str:
        """The allocation rule: as given, else "accuracy" when every query has a target and no
        total is given, else "weights"."""
        if self.allocation is not None:
            return self.allocation
        if self.epsilon is None and all(
            q.accuracy is not None or q.epsilon is not None for q in self.queries.values()
        ):
            return "accuracy"
        return "weights"

    @model_validator(mode="after")
    def _consistent(self) -> ReportSpec:
        rule = self.rule
        if rule in ("weights", "minimax") and self.epsilon is None:
            raise ValueError(f"allocation {rule!r} splits a total: give epsilon = ...")
        if rule == "accuracy":
            missing = [
                n for n, q in self.queries.items() if q.accuracy is None and q.epsilon is None
            ]
            if missing:
                raise ValueError(
                    "allocation 'accuracy' needs an accuracy (or a fixed epsilon) for every "
                    f"query; missing: "
                    f"{', '.join(missing)}"
                )
        if rule == "minimax":
            missing = [
                n
                for n, q in self.queries.items()
                if q.expected is None and q.accuracy is None and q.epsilon is None
            ]
            if missing:
                raise ValueError(
                    "allocation 'minimax' compares errors relative to each query's expected "
                    f"value (or accuracy): give expected = ... (or a fixed epsilon) for "
                    f"{', '.join(missing)}"
                )
        return self


def parse_report_spec(text: str) -> ReportSpec:
    """Validate a report spec given as TOML text."""
    try:
        return ReportSpec.model_validate(tomllib.loads(text))
    except tomllib.TOMLDecodeError as error:
        raise ParameterError(f"report spec is not valid TOML: {error}") from None
    except ValidationError as error:
        raise ParameterError(f"invalid report spec: {_describe(error)}") from None


def load_report_spec(path: str | Path) -> ReportSpec:
    """Read and validate a TOML report spec."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ParameterError(f"cannot read report spec {str(path)!r}: {error.strerror}") from None
    return parse_report_spec(text)
