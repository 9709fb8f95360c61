"""dpsql: differentially private SQL over DuckDB, with a privacy budget ledger.

>>> import dpsql
>>> sorted(dpsql.__all__) == dpsql.__all__
True
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
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
    from dpsql.serving.client import RemoteSession, connect

_LAZY = {
    "Policy": "dpsql.engine.policy",
    "load_policy": "dpsql.engine.policy",
    "parse_policy": "dpsql.engine.policy",
    "BudgetReport": "dpsql.engine.results",
    "BudgetStatus": "dpsql.engine.results",
    "QueryResult": "dpsql.engine.results",
    "Session": "dpsql.engine.session",
    "database_budget": "dpsql.engine.session",
    "database_ledger": "dpsql.engine.session",
    "database_synopses": "dpsql.engine.session",
    "set_policy": "dpsql.engine.session",
    "show_policy": "dpsql.engine.session",
    "RemoteSession": "dpsql.serving.client",
    "connect": "dpsql.serving.client",
}
"""The public names that need the engine (DuckDB, pandas): imported on first use, so that
``import dpsql`` and the command line start without them."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dpsql' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
