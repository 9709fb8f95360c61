"""dpsql: differentially private SQL over DuckDB, with a privacy budget ledger.

>>> import dpsql
>>> sorted(dpsql.__all__) == dpsql.__all__
True
"""

from __future__ import annotations

from dpsql.engine.policy import Policy, load_policy, parse_policy
from dpsql.engine.results import BudgetReport, BudgetStatus, QueryResult
from dpsql.engine.session import (
    Session,
    database_budget,
    database_ledger,
    database_synopses,
    set_policy,
    show_policy,
)
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
from dpsql.serving.client import RemoteSession, connect

__all__ = [
    "AccessError",
    "BudgetExceededError",
    "BudgetReport",
    "BudgetStatus",
    "DpsqlError",
    "ExecutionError",
    "LedgerError",
    "ParameterError",
    "Policy",
    "PolicyError",
    "PrivacyError",
    "QueryError",
    "QueryResult",
    "RemoteSession",
    "SchemaError",
    "ServiceError",
    "Session",
    "SqlSyntaxError",
    "TimeLimitError",
    "UnsupportedQueryError",
    "connect",
    "database_budget",
    "database_ledger",
    "database_synopses",
    "load_policy",
    "parse_policy",
    "set_policy",
    "show_policy",
]
