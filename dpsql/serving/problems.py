"""RFC 9457 problem details: how dpsql errors cross the HTTP boundary, both ways.

The server turns an exception into ``application/problem+json`` with the status, a stable
``type`` per error class and the error's one-line message as ``detail`` (messages never hold data
values); the client turns the document back into the same exception class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpsql.errors import (
    AccessError,
    BudgetExceededError,
    DpsqlError,
    ExecutionError,
    LedgerError,
    ParameterError,
    PolicyError,
    PrivacyError,
    QueryError,
    SchemaError,
    ServiceError,
    SqlSyntaxError,
    TimeLimitError,
    UnsupportedQueryError,
)

__all__ = ["PROBLEM_MEDIA_TYPE", "Problem", "error_from_problem", "problem_for"]

PROBLEM_MEDIA_TYPE = "application/problem+json"
_TYPE_PREFIX = "urn:dpsql:problem:"


@dataclass(frozen=True)
class _Kind:
    error: type[DpsqlError]
    status: int
    name: str
    title: str


# Most specific first: the first class an error is an instance of decides.
_KINDS = (
    _Kind(SqlSyntaxError, 400, "sql-syntax", "The SQL does not parse"),
    _Kind(UnsupportedQueryError, 400, "unsupported-query", "The query is outside the allow-list"),
    _Kind(SchemaError, 400, "schema", "Unknown table or column"),
    _Kind(TimeLimitError, 504, "time-limit", "The request passed its time limit; nothing charged"),
    _Kind(QueryError, 400, "query", "The query cannot be answered"),
    _Kind(ParameterError, 400, "parameter", "Invalid parameter"),
    _Kind(PolicyError, 400, "policy", "The privacy policy does not allow the request"),
    _Kind(BudgetExceededError, 409, "budget-exceeded", "Privacy budget exhausted"),
    _Kind(PrivacyError, 409, "privacy", "The privacy accountant refuses the request"),
    _Kind(LedgerError, 503, "ledger", "The ledger is unavailable; all queries are stopped"),
    _Kind(ExecutionError, 500, "execution", "The query failed after it was charged"),
)
_SERVICE = {
    401: ("unauthorized", "Missing, invalid or revoked token"),
    403: ("forbidden", "The token's role may not do this"),
    404: ("not-found", "No such resource"),
    405: ("method-not-allowed", "Method not allowed"),
    413: ("too-large", "Request too large"),
    429: ("rate-limited", "Too many requests"),
    500: ("internal", "Internal error"),
    504: ("timeout", "The query did not finish in time"),
}


@dataclass(frozen=True)
class Problem:
    """One problem document."""

    status: int
    name: str
    title: str
    detail: str
    extensions: tuple[tuple[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": f"{_TYPE_PREFIX}{self.name}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            **dict(self.extensions),
        }

    @classmethod
    def service(cls, status: int, detail: str, **extensions: Any) -> Problem:
        """A refusal of the service itself (token, role, limits, timeout, defects)."""
        name, title = _SERVICE.get(status, ("internal", "Internal error"))
        return cls(status, name, title, detail, tuple(extensions.items()))


def problem_for(error: DpsqlError) -> Problem:
    """The problem document of a dpsql error (same message as the command line)."""
    if isinstance(error, ServiceError):
        return Problem.service(error.status, str(error))
    kind = next((k for k in _KINDS if isinstance(error, k.error)), None)
    if kind is None:
        return Problem.service(500, "internal error")
    extensions: dict[str, Any] = {}
    if isinstance(error, QueryError) and error.line is not None:
        extensions = {"line": error.line, "column": error.column}
    if isinstance(error, BudgetExceededError) and error.requested is not None:
        extensions = {"requested": error.requested, "remaining": error.remaining}
    return Problem(kind.status, kind.name, kind.title, str(error), tuple(extensions.items()))


def _without_position(detail: str, line: int | None, column: int | None) -> str:
    """QueryError appends the position to its message; strip it before re-raising."""
    suffix = f" (line {line}, column {column})"
    return detail[: -len(suffix)] if line is not None and detail.endswith(suffix) else detail


def error_from_problem(document: dict[str, Any], status: int) -> DpsqlError:
    """The exception a problem document stands for (the client side of ``problem_for``)."""
    name = str(document.get("type", "")).removeprefix(_TYPE_PREFIX)
    detail = str(document.get("detail") or document.get("title") or f"HTTP status {status}")
    kind = next((k for k in _KINDS if k.name == name), None)
    if kind is None:
        if status in (401, 403):
            return AccessError(detail, status=status)
        if status == 413:
            return ParameterError(detail)
        if status == 504:
            return ExecutionError(detail)
        return ServiceError(detail, status=status)
    if issubclass(kind.error, QueryError):
        line, column = document.get("line"), document.get("column")
        return kind.error(_without_position(detail, line, column), line=line, column=column)
    if kind.error is BudgetExceededError:
        return BudgetExceededError(
            detail, requested=document.get("requested"), remaining=document.get("remaining")
        )
    return kind.error(detail)
