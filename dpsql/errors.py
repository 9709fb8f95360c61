"""The one exception tree of dpsql.

::

    DpsqlError
    ├── ParameterError (also ValueError)   bad epsilon, delta, option or argument
    ├── PolicyError                         invalid or missing privacy policy
    ├── QueryError                          the SQL cannot be answered
    │   ├── SqlSyntaxError                  malformed SQL
    │   ├── UnsupportedQueryError           valid SQL outside the allow-list
    │   ├── SchemaError                     unknown table or column, unusable type
    │   └── TimeLimitError                  the time limit passed before the charge
    ├── PrivacyError                        the privacy accountant refuses
    │   └── BudgetExceededError             the charge would pass a cap or allocation
    ├── LedgerError                         the ledger is unreadable or inconsistent (fail closed)
    ├── ExecutionError                      the database failed after planning
    └── ServiceError                        the dpsql service refused or failed (``status``)
        └── AccessError                     no, invalid or revoked token (401); wrong role (403)

Messages name the problem and never contain values read from the data.
"""

from __future__ import annotations

__all__ = [
    "AccessError",
    "BudgetExceededError",
    "DpsqlError",
    "ExecutionError",
    "LedgerError",
    "ParameterError",
    "PolicyError",
    "PrivacyError",
    "QueryError",
    "SchemaError",
    "ServiceError",
    "SqlSyntaxError",
    "TimeLimitError",
    "UnsupportedQueryError",
]


class DpsqlError(Exception):
    """Root of every error dpsql raises on purpose."""


class ParameterError(DpsqlError, ValueError):
    """An argument, option or budget value is invalid."""


class PolicyError(DpsqlError):
    """The privacy policy is invalid, missing, or does not cover the query."""


class QueryError(DpsqlError):
    """The SQL cannot be answered; carries the position of the offending clause when known."""

    def __init__(self, message: str, *, line: int | None = None, column: int | None = None):
        self.line = line
        self.column = column
        where = f" (line {line}, column {column})" if line is not None else ""
        super().__init__(f"{message}{where}")


class SqlSyntaxError(QueryError):
    """The SQL text does not parse."""


class UnsupportedQueryError(QueryError):
    """The SQL parses, but its shape is not one dpsql can answer with a proof of privacy."""


class SchemaError(QueryError):
    """The query names a table or column that the database or policy does not have."""


class TimeLimitError(QueryError):
    """The request passed its time limit before its charge: refused, nothing was charged."""


class PrivacyError(DpsqlError):
    """The privacy accountant refuses the request."""


class BudgetExceededError(PrivacyError):
    """The charge would exceed the dataset cap or the analyst's allocation.

    ``requested`` and ``remaining`` are ``{"epsilon": ..., "delta": ...}`` when known.
    """

    def __init__(
        self,
        message: str,
        *,
        requested: dict[str, float] | None = None,
        remaining: dict[str, float] | None = None,
    ):
        self.requested = requested
        self.remaining = remaining
        super().__init__(message)


class LedgerError(DpsqlError):
    """The ledger cannot be read or verified; all queries stop until it is repaired."""


class ExecutionError(DpsqlError):
    """The database failed while running a planned, already-charged query."""


class ServiceError(DpsqlError):
    """The dpsql service refused the request (a limit) or failed; ``status`` is the HTTP status."""

    def __init__(self, message: str, *, status: int = 500):
        self.status = status
        super().__init__(message)


class AccessError(ServiceError):
    """The service refuses the token (missing, invalid, revoked) or its role for this request."""


FAILED_AFTER_CHARGE = "the query failed after its charge was recorded; the charge stands"
"""The one message of every failure after a charge, whatever its cause: what failed, and why,
may depend on the rows read, so neither is told (the exception chain is dropped too)."""
