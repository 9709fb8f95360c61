"""The remote connection: the analyst surface of a ``Session``, over HTTP.

``dpsql.connect("http://host:8765", token=...)`` returns a ``RemoteSession`` with the same
``execute``, ``explain``, ``open_stream``, ``result``, ``schema``, ``budget``, ``ledger`` and
``synopses``, the same result
types, and the same exception classes (rebuilt from the service's problem documents).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from dpsql.engine.results import BudgetReport, QueryResult
from dpsql.engine.session import Session
from dpsql.engine.session import connect as connect_local
from dpsql.errors import AccessError, ParameterError, ServiceError
from dpsql.serving.problems import error_from_problem

if TYPE_CHECKING:
    import httpx

__all__ = ["RemoteSession", "connect"]


class RemoteSession:
    """An analyst's (or auditor's) connection to a dpsql service.

    ``dialect`` is the SQL dialect the analyst writes in (any sqlglot dialect), as for a local
    connection; ``transport`` replaces httpx's network transport (tests, proxies); ``timeout`` is
    in seconds.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        dialect: str = "duckdb",
        timeout: float = 300.0,
        transport: httpx.BaseTransport | None = None,
    ):
        import httpx

        token = token if token is not None else os.environ.get("DPSQL_TOKEN")
        if not token:
            raise AccessError("a remote connection needs token=... (or DPSQL_TOKEN)", status=401)
        if not token.isprintable() or " " in token:
            raise AccessError(
                "the token has spaces or control characters; copy it again", status=401
            )
        self.url = url.rstrip("/")
        self.dialect = dialect
        self._client = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=timeout,
            transport=transport,
        )

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        import httpx

        try:
            response = self._client.request(method, path, json=body)
        except httpx.HTTPError as error:
            raise ServiceError(
                f"cannot reach the dpsql service at {self.url}: {error}", status=503
            ) from None
        if response.is_success:
            return response.json()
        try:
            document = response.json()
        except ValueError:
            document = {"detail": f"HTTP status {response.status_code}"}
        raise error_from_problem(document, response.status_code)

    def _request(self, sql: str, **options: Any) -> dict[str, Any]:
        body = {"sql": sql, **{k: v for k, v in options.items() if v is not None}}
        return body if self.dialect == "duckdb" else {**body, "dialect": self.dialect}

    def execute(
        self,
        sql: str,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        mechanism: str | None = None,
        max_answers: int | None = None,
        accuracy: float | None = None,
    ) -> QueryResult:
        """Answer ``sql`` on the service, charging the token's analyst first."""
        body = self._request(
            sql,
            epsilon=epsilon,
            delta=delta,
            mechanism=mechanism,
            max_answers=max_answers,
            accuracy=accuracy,
        )
        return QueryResult.from_dict(self._call("POST", "/v1/query", body))

    def explain(
        self,
        sql: str,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        mechanism: str | None = None,
        max_answers: int | None = None,
        accuracy: float | None = None,
    ) -> dict[str, Any]:
        """Plan and cost of ``sql``, without reading data or charging."""
        body = self._request(
            sql,
            epsilon=epsilon,
            delta=delta,
            mechanism=mechanism,
            max_answers=max_answers,
            accuracy=accuracy,
        )
        return self._call("POST", "/v1/explain", body)

    def open_stream(
        self,
        table: str,
        columns: Sequence[tuple[Any, ...]],
        *,
        epsilon: float,
        mechanism: str = "pmw",
        delta: float = 0.0,
        updates: int | None = None,
        threshold: float | None = None,
        expected_queries: int | None = None,
        name: str | None = None,
        filter: str | None = None,
        warm_share: float | None = None,
    ) -> dict[str, Any]:
        """Open a query stream on the service (``Session.open_stream``'s arguments), charging
        ``(epsilon, delta)`` to the token's analyst once; returns its description."""
        specs = []
        for column in columns:
            if not isinstance(column, list | tuple) or len(column) not in (2, 4):
                raise ParameterError(
                    f"a stream column is (name, width) or (name, width, low, high), got {column!r}"
                )
            spec: dict[str, Any] = {"name": column[0], "width": column[1]}
            if len(column) == 4:
                spec["bounds"] = [column[2], column[3]]
            specs.append(spec)
        given = {
            "updates": updates,
            "threshold": threshold,
            "expected_queries": expected_queries,
            "name": name,
            "filter": filter,
            "warm_share": warm_share,
        }
        body = {
            "table": table,
            "columns": specs,
            "epsilon": epsilon,
            "delta": delta,
            "mechanism": mechanism,
            **{k: v for k, v in given.items() if v is not None},
        }
        return self._call("POST", "/v1/streams", body)

    def result(self, seq: int, query: str | None = None) -> QueryResult:
        """The answer this analyst paid for under ledger entry ``seq`` (of a report: its query
        named ``query``), again, for free."""
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
            raise ParameterError(f"a ledger entry number is a positive integer, got {seq!r}")
        path = f"/v1/results/{seq}" if query is None else f"/v1/results/{seq}?query={quote(query)}"
        return QueryResult.from_dict(self._call("GET", path))

    def schema(self) -> dict[str, Any]:
        """The tables this analyst may query, their columns, types and rules, the dataset's
        query defaults and this analyst's budget (``Session.schema``)."""
        return self._call("GET", "/v1/schema")

    def budget(self) -> BudgetReport:
        """Cap, spent and remaining: the dataset and this analyst (all analysts for an auditor)."""
        return BudgetReport.model_validate(self._call("GET", "/v1/budget"))

    def ledger(self) -> list[dict[str, Any]]:
        """This analyst's ledger entries (every entry for an auditor), oldest first."""
        return self._call("GET", "/v1/ledger")

    def synopses(self) -> list[dict[str, Any]]:
        """Stored synopses this analyst may use (parameters only)."""
        return self._call("GET", "/v1/synopses")

    def verify(self) -> dict[str, Any]:
        """Auditors: check the ledger's chain (``{"verified", "entries", "last_hash", ...}``)."""
        return self._call("GET", "/v1/ledger/verify")


def connect(
    target: str | Path,
    *,
    analyst: str | None = None,
    token: str | None = None,
    **options: Any,
) -> Session | RemoteSession:
    """A session on a database file (``analyst=``) or on a service URL (``token=``).

    ``options`` go to the local ``dpsql.engine.session.connect`` (dialect, progress, ...).
    """
    if isinstance(target, str) and target.startswith(("http://", "https://")):
        if analyst is not None:
            raise AccessError(
                "a service takes the analyst from the token; pass token=..., not analyst=...",
                status=400,
            )
        return RemoteSession(target, token=token, **options)
    if analyst is None:
        raise TypeError("connect() needs analyst=... for a database file")
    return connect_local(target, analyst=analyst, **options)
