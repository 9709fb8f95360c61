"""What the PostgreSQL port answers: an answer's result set and NOTICE, a refusal's SQLSTATE.

``refusal`` maps every error the port can meet to a SQLSTATE, dpsql's message, the HTTP status
it stands for (the access log's) and a problem type: dpsql's errors through their RFC 9457
problem (``dpsql.serving.problems``), the port's own ``PgError`` as raised, and DuckDB's errors
from the catalogue by their class.
"""

from __future__ import annotations

import json
import logging

import duckdb

from dpsql.engine.results import QueryResult, json_safe
from dpsql.errors import DpsqlError, QueryError, SchemaError
from dpsql.serving import pgwire as wire
from dpsql.serving.pgcatalog import Rows
from dpsql.serving.pgstatements import PgError
from dpsql.serving.problems import problem_for

__all__ = ["notice", "position", "refusal", "released"]

_log = logging.getLogger("dpsql.serving")

# SQLSTATE of each problem type (``dpsql.serving.problems``).
_SQLSTATES = {
    "sql-syntax": "42601",
    "unsupported-query": "0A000",
    "schema": "42P01",
    "time-limit": "57014",
    "query": "22023",
    "parameter": "22023",
    "policy": "42501",
    "budget-exceeded": "53400",
    "privacy": "42501",
    "ledger": "58000",
    "execution": "XX000",
    "unauthorized": "28P01",
    "forbidden": "42501",
    "not-found": "42704",
    "too-large": "54000",
    "rate-limited": "53400",
    "timeout": "57014",
    "internal": "XX000",
}
_STATUS = {"28": 401, "42501": 403, "53300": 409, "54000": 413, "57014": 504, "3D000": 404}
_PROBLEMS = {401: "unauthorized", 403: "forbidden", 404: "not-found", 409: "too-many-connections"}
_PROBLEMS |= {413: "too-large", 504: "timeout"}
_DUCKDB_SQLSTATES = (
    (duckdb.ParserException, "42601"),
    (duckdb.CatalogException, "42P01"),
    (duckdb.BinderException, "42703"),
    (duckdb.PermissionException, "42501"),
    (duckdb.InterruptException, "57014"),
    (duckdb.OutOfMemoryException, "53200"),
)


def position(text: str, error: QueryError) -> int | None:
    """The 1-based character position of ``error``'s line and column in ``text``."""
    if error.line is None or error.column is None:
        return None
    lines = text.split("\n")
    if error.line > len(lines):
        return None
    return sum(len(line) + 1 for line in lines[: error.line - 1]) + max(error.column, 1)


def refusal(error: Exception) -> tuple[str, str, int, str]:
    """SQLSTATE, message, the HTTP status it stands for and the problem type of ``error``."""
    if isinstance(error, PgError):
        status = _STATUS.get(error.sqlstate, _STATUS.get(error.sqlstate[:2], 400))
        name = _PROBLEMS.get(status, "postgres")
        return error.sqlstate, str(error), status, f"urn:dpsql:problem:{name}"
    if isinstance(error, DpsqlError):
        problem = problem_for(error)
        sqlstate = _SQLSTATES.get(problem.name, "XX000")
        message = str(error)
        if isinstance(error, SchemaError) and "column" in message.split("(", 1)[0]:
            sqlstate = "42703"
        if isinstance(error, QueryError) and error.line is not None:
            message = message.rsplit(" (line ", 1)[0]
        return sqlstate, message, problem.status, problem.to_dict()["type"]
    if isinstance(error, duckdb.Error):
        sqlstate = next((s for kind, s in _DUCKDB_SQLSTATES if isinstance(error, kind)), "22000")
        message = str(error).split("\n", 1)[0]
        return sqlstate, message, 400, "urn:dpsql:problem:catalogue"
    _log.error("unexpected error on the PostgreSQL port", exc_info=error)
    return (
        "XX000",
        "internal error; the administrator's log has the details",
        500,
        ("urn:dpsql:problem:internal"),
    )


def notice(result: QueryResult, intervals: bool) -> bytes:
    """The NOTICE before an answer: what it cost and how accurate it is."""
    spent = (
        f"ledger entry {result.ledger_entry}: epsilon {result.epsilon:g}, delta "
        f"{result.delta:g}, mechanism {result.mechanism}"
    )
    level = f"{result.confidence:.0%}"
    if len(result.rows) == 1 and result.intervals:
        shown = ", ".join(
            f"{name} [{_bound(pairs[0][0])}, {_bound(pairs[0][1])}]"
            for name, pairs in result.intervals.items()
        )
        accuracy = f"{level} intervals: {shown}"
    elif intervals or not result.intervals:
        accuracy = f"{level} intervals in the <column>_low/_high columns" if intervals else ""
    else:
        accuracy = f"{level} intervals: SET dpsql.intervals = on for <column>_low/_high columns"
    detail = {
        "ledger_entry": result.ledger_entry,
        "epsilon": result.epsilon,
        "delta": result.delta,
        "mechanism": result.mechanism,
        "confidence": result.confidence,
        "noise_scale": result.noise_scale,
    }
    text = f"dpsql: {spent}" + (f"; {accuracy}" if accuracy else "")
    return wire.fields(
        b"N",
        [
            ("S", "NOTICE"),
            ("V", "NOTICE"),
            ("C", "00000"),
            ("M", text),
            ("D", json.dumps(json_safe(detail), default=str)),
        ],
    )


def _bound(value: float | None) -> str:
    return "null" if value is None else f"{value:g}"


def released(result: QueryResult, intervals: bool) -> Rows:
    """The answer as a result set (with ``<col>_low``/``<col>_high`` when ``intervals``)."""
    if intervals:
        names, rows = result.interval_table()
    else:
        names, rows = list(result.columns), [list(row) for row in result.rows]
    bounds = {f"{n}_{side}" for n in result.intervals for side in ("low", "high")}
    columns = []
    for index, name in enumerate(names):
        default = wire.FLOAT8 if name in bounds or name in result.intervals else wire.TEXT_OID
        oid = wire.value_type_oid([row[index] for row in rows], default)
        columns.append(wire.Field(name, wire.FLOAT8 if name in bounds else oid))
    return Rows(tuple(columns), tuple(tuple(row) for row in rows))
