"""The HTTP service: the engine behind tokens, roles and the administrator's limits.

``create_app(settings)`` builds the FastAPI application; ``app_from_environment`` is the factory
uvicorn workers call (``dpsql serve`` passes the settings in ``DPSQL_SERVE_SETTINGS``). Identity
comes from the bearer token only; every refusal is an RFC 9457 problem and charges nothing.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
import os
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from datetime import date, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from dpsql.engine.results import LEDGER_COLUMNS, csv_text
from dpsql.engine.schema import describe_schema
from dpsql.engine.session import Session, database_budget, database_ledger, database_synopses
from dpsql.engine.session import show_policy as policy_of
from dpsql.errors import AccessError, DpsqlError, LedgerError, ParameterError, ServiceError
from dpsql.serving import models
from dpsql.serving.access_log import AccessLog, note
from dpsql.serving.limits import BodyLimit, ServerSettings
from dpsql.serving.problems import PROBLEM_MEDIA_TYPE, Problem, problem_for
from dpsql.serving.service import RateLimited, Service
from dpsql.serving.tokens import Identity

__all__ = ["SETTINGS_VARIABLE", "app_from_environment", "create_app"]

SETTINGS_VARIABLE = "DPSQL_SERVE_SETTINGS"
VERSION = version("dpsql")
CONSOLE = Path(__file__).parent / "console"
_log = logging.getLogger("dpsql.serving")
T = TypeVar("T")
B = TypeVar("B", bound=BaseModel)
F = TypeVar("F", bound=Callable[..., Any])


_AS_IS = frozenset({str, int, bool, type(None)})


def _plain(value: Any) -> Any:
    """``value`` as strict JSON: non-finite floats become null, dates ISO text."""
    kind = type(value)  # the common exact types first; subclasses take the general way
    if kind in _AS_IS:
        return value
    if kind is list or kind is tuple:
        return [_plain(v) for v in value]
    if kind is dict:
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, date | datetime):
        return value.isoformat()
    if hasattr(value, "item"):  # numpy scalars
        return _plain(value.item())
    return value


class StrictJSONResponse(JSONResponse):
    """JSON that every parser accepts (no NaN or Infinity tokens)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(_plain(content), allow_nan=False, separators=(",", ":")).encode()


def _problem_response(problem: Problem, headers: dict[str, str] | None = None) -> Response:
    return StrictJSONResponse(
        problem.to_dict(),
        status_code=problem.status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=headers,
    )


def _headers_for(error: DpsqlError) -> dict[str, str] | None:
    if isinstance(error, RateLimited):
        return {"Retry-After": str(error.retry_after)}
    if isinstance(error, AccessError) and error.status == 401:
        return {"WWW-Authenticate": "Bearer"}
    return None


def _csv(columns: list[str], rows: list[list[Any]]) -> Response:
    return Response(csv_text(columns, _plain(rows)), media_type="text/csv; charset=utf-8")


BEARER = {"type": "http", "scheme": "bearer", "description": "a token from `dpsql token create`"}


def _identify(request: Request, role: str | None) -> tuple[Service, Identity]:
    """The worker's service and the caller named by the request's bearer token, admitted by the
    rate limit, in ``role`` (any role when None).

    Endpoints call this themselves rather than declaring FastAPI dependencies: each dependency
    (and each body or query parameter) costs a solve per request, which was most of what the
    service added to a query's latency; the OpenAPI document declares the same contract.
    """
    service: Service = request.app.state.service
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AccessError("missing token: send 'Authorization: Bearer <token>'", status=401)
    identity = service.authenticate(token.strip())
    note(request.scope, token_id=identity.token_id, analyst=identity.name, role=identity.role)
    service.admit(identity, role)
    return service, identity


def _invalid_parameter(where: str, message: str) -> RequestValidationError:
    return RequestValidationError([{"loc": (where,), "msg": message, "type": "value_error"}])


async def _json_body(request: Request, model: type[B]) -> B:
    """The request's JSON body as ``model`` (pydantic parses the bytes directly)."""
    content_type = request.headers.get("content-type", "application/json").split(";")[0].strip()
    if not (content_type == "application/json" or content_type.endswith("+json")):
        raise _invalid_parameter(
            "body", f"send JSON (Content-Type: application/json), got {content_type}"
        )
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as error:
        raise RequestValidationError(error.errors(include_url=False, include_input=False)) from None


async def _query_request(request: Request, service: Service) -> models.QueryRequest:
    """The request's JSON body as a ``QueryRequest``, within the administrator's SQL length."""
    body = await _json_body(request, models.QueryRequest)
    note(request.scope, sql_sha256=hashlib.sha256(body.sql.encode("utf-8", "replace")).hexdigest())
    service.within_sql_length("sql", body.sql)
    return body


def _wants_csv(request: Request) -> bool:
    """``?format=csv``, or ``Accept: text/csv`` without a ``format``."""
    # No query string (most requests): no parsing.
    output_format = request.query_params.get("format") if request.scope["query_string"] else None
    if output_format is None:
        return "text/csv" in request.headers.get("accept", "")
    if output_format not in ("json", "csv"):
        raise _invalid_parameter("format", f"must be 'json' or 'csv', got {output_format!r}")
    return output_format == "csv"


_PROBLEM = {"description": "RFC 9457 problem details", "content": {PROBLEM_MEDIA_TYPE: {}}}
_REFUSALS: dict[int | str, dict[str, Any]] = {
    status: _PROBLEM for status in (400, 401, 403, 404, 409, 413, 429, 500, 503, 504)
}
_SECURITY = [{"bearer": []}]
_FORMAT = {
    "name": "format",
    "in": "query",
    "required": False,
    "description": "`csv` for CSV (as `Accept: text/csv`); `json` by default",
    "schema": {"type": "string", "enum": ["json", "csv"]},
}
_BODIES = (models.QueryRequest, models.StreamRequest)
"""Request bodies the endpoints read themselves, declared in the OpenAPI document."""


def _body(model: type[BaseModel]) -> dict[str, Any]:
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"required": True, "content": {"application/json": {"schema": schema}}}


class _RequestRoute(APIRoute):
    """A route whose endpoint reads the request and builds the response itself.

    FastAPI's request handler (reading a declared body, solving dependencies, validating and
    serialising a returned model) has nothing to do for such an endpoint, yet took a fifth of the
    application's own time per query (30 of 130 us in process); this route calls the endpoint
    directly. The OpenAPI operation is still FastAPI's, from the route's arguments.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        if list(inspect.signature(self.endpoint).parameters) != ["request"]:
            raise TypeError(f"endpoint {self.endpoint.__name__} must take the request alone")
        return self.endpoint


_ROUTES: list[tuple[Callable[..., Any], dict[str, Any]]] = []
"""Every endpoint with its route's arguments, in order; ``create_app`` adds them to the
application's own router (an included router is one more layer each request passes)."""


def _route(method: str, path: str, **kwargs: Any) -> Callable[[F], F]:
    """Record an endpoint for ``create_app``."""

    def record(endpoint: F) -> F:
        _ROUTES.append((endpoint, {"path": path, "methods": [method], **kwargs}))
        return endpoint

    return record


def _documented(
    method: str,
    path: str,
    *,
    tags: list[str],
    body: type[BaseModel] | None = None,
    csv: bool = False,
    parameters: tuple[dict[str, Any], ...] = (),
    **kwargs: Any,
) -> Callable[[F], F]:
    """Register an endpoint that needs a token, with its contract in the OpenAPI document: the
    bearer security, the refusals, and (read by the endpoint itself) a JSON ``body``, the
    ``format`` parameter and other ``parameters``."""
    extra: dict[str, Any] = {"security": _SECURITY}
    if body is not None:
        extra["requestBody"] = _body(body)
    if csv or parameters:
        extra["parameters"] = [*parameters, *([_FORMAT] if csv else [])]
    responses: dict[int | str, dict[str, Any]] = dict(_REFUSALS)
    if csv:
        responses[200] = {"content": {"text/csv": {}}}
    return _route(
        method,
        path,
        tags=tags,
        responses=responses,
        openapi_extra=extra,
        route_class_override=_RequestRoute,
        **kwargs,
    )


@_documented(
    "POST",
    "/v1/query",
    response_model=models.QueryResponse,
    body=models.QueryRequest,
    csv=True,
    tags=["analyst"],
)
async def query(request: Request) -> Response:
    """Answer the SQL with differential privacy, charging the caller's allocation first.

    `Accept: text/csv` (or `?format=csv`) gives CSV with `<col>_low`/`<col>_high` columns.
    """
    service, identity = _identify(request, "analyst")
    body = await _query_request(request, service)
    as_csv = _wants_csv(request)
    result = await service.execute(identity, body.sql, dialect=body.dialect, options=body.options())
    note(
        request.scope,
        epsilon=result.epsilon,
        delta=result.delta,
        ledger_entry=result.ledger_entry,
    )
    if as_csv:
        return _csv(*result.interval_table())
    return StrictJSONResponse(result.to_dict())


@_documented(
    "POST",
    "/v1/explain",
    response_model=models.ExplainResponse,
    body=models.QueryRequest,
    tags=["analyst"],
)
async def explain(request: Request) -> Response:
    """Plan, cost and the budget it draws on; reads no data and charges nothing."""
    service, identity = _identify(request, "analyst")
    body = await _query_request(request, service)
    report = await service.in_session(
        identity,
        lambda s: s.explain(body.sql, dialect=body.dialect, **body.options()),
    )
    return StrictJSONResponse(report)


@_documented("POST", "/v1/streams", body=models.StreamRequest, status_code=201, tags=["analyst"])
async def open_stream(request: Request) -> Response:
    """Open a query stream (`pmw` or `range_tree`) over a table's columns, charging its
    (ε, δ) to the caller once; later `COUNT(*)` queries it covers are answered from it for free.
    Returns the stream's description (as `/v1/synopses` lists it)."""
    service, identity = _identify(request, "analyst")
    body = await _json_body(request, models.StreamRequest)
    service.within_sql_length("filter", body.filter)
    opened = await service.in_session(
        identity,
        lambda s: s.open_stream(body.table, [c.spec() for c in body.columns], **body.arguments()),
    )
    note(request.scope, epsilon=body.epsilon, delta=body.delta)
    return StrictJSONResponse(opened, status_code=201)


@_documented("GET", "/v1/budget", tags=["analyst", "auditor"])
async def budget(request: Request) -> Response:
    """Cap, spent and remaining: the dataset and the caller (an auditor: every analyst)."""
    service, identity = _identify(request, None)
    if identity.role == "auditor":
        report = await service.in_thread(lambda: database_budget(service.database))
    else:
        report = await service.in_session(identity, lambda s: s.budget())
    return StrictJSONResponse(report.model_dump())


@_documented("GET", "/v1/ledger", csv=True, tags=["analyst", "auditor"])
async def ledger(request: Request) -> Response:
    """Ledger entries, oldest first: an analyst's own charges, or every entry for an auditor.

    `?format=csv` (or `Accept: text/csv`) gives the columns of `dpsql ledger --format csv`.
    """
    service, identity = _identify(request, None)
    as_csv = _wants_csv(request)
    if identity.role == "auditor":
        entries = await service.in_thread(lambda: database_ledger(service.database))
    else:
        # Session.ledger() holds the analyst's own entries; the service shows their charges.
        own = await service.in_session(identity, lambda s: s.ledger())
        entries = [e for e in own if e["kind"] == "charge" and e["analyst"] == identity.name]
    if as_csv:
        return _csv(LEDGER_COLUMNS, [[e.get(c) for c in LEDGER_COLUMNS] for e in entries])
    return StrictJSONResponse(entries)


@_documented("GET", "/v1/ledger/verify", response_model=models.VerifyResponse, tags=["auditor"])
async def verify(request: Request) -> Response:
    """Check the hash chain and every entry's total; name the first bad entry."""
    service, _ = _identify(request, "auditor")
    try:
        entries = await service.in_thread(lambda: database_ledger(service.database))
    except LedgerError as error:
        return StrictJSONResponse(
            {"verified": False, "entries": 0, "last_hash": None, "detail": str(error)}
        )
    last = entries[-1]["hash"] if entries else None
    detail = f"{len(entries)} entries, chain intact"
    return StrictJSONResponse(
        {"verified": True, "entries": len(entries), "last_hash": last, "detail": detail}
    )


@_documented("GET", "/v1/synopses", tags=["analyst", "auditor"])
async def synopses(request: Request) -> Response:
    """Stored synopses the caller may use (parameters only, never the bytes)."""
    service, identity = _identify(request, None)
    if identity.role == "auditor":
        listed = await service.in_thread(lambda: database_synopses(service.database))
    else:
        listed = await service.in_session(identity, lambda s: s.synopses())
    return StrictJSONResponse(listed)


@_documented("GET", "/v1/schema", response_model=models.SchemaResponse, tags=["analyst", "auditor"])
async def schema(request: Request) -> Response:
    """The tables the caller may query (the policy's tables and public tables, nothing else):
    columns and database types, privacy units, contribution bounds, public keys, bounds, key
    domains, the dataset's query defaults, and the caller's budget (an auditor: the dataset's).
    Reads no row and charges nothing."""
    service, identity = _identify(request, None)
    if identity.role == "auditor":

        def described() -> dict[str, Any]:
            report = database_budget(service.database)
            dataset = report.model_copy(
                update={"lines": [line for line in report.lines if line.scope == "dataset"]}
            )
            name = dataset.lines[0].name
            policy = policy_of(service.database)
            return describe_schema(policy, service.runner.backend(), dataset=name, budget=dataset)

        shown = await service.in_thread(described)
    else:
        shown = await service.in_session(identity, lambda s: s.schema())
    return StrictJSONResponse(shown)


_NO_ANSWER = "ledger entry {seq} has no stored answer of yours"
_REPORT_QUERY = {
    "name": "query",
    "in": "query",
    "required": False,
    "description": "of a report's ledger entry: the name of its query",
    "schema": {"type": "string"},
}


_SEQ = {
    "name": "seq",
    "in": "path",
    "required": True,
    "description": "the ledger entry that paid for the answer",
    "schema": {"type": "integer", "minimum": 1},
}


@_documented(
    "GET",
    "/v1/results/{seq}",
    response_model=models.QueryResponse,
    csv=True,
    parameters=(_SEQ, _REPORT_QUERY),
    tags=["analyst"],
)
async def stored_result(request: Request) -> Response:
    """The answer released under the caller's ledger entry `seq` again, for free (no charge,
    no new entry); of a report's entry, the answer to its query `?query=NAME` (400 naming the
    report's queries without it). 404, in the same words, for an entry without a stored answer
    and for another analyst's."""
    service, identity = _identify(request, "analyst")
    text = request.path_params["seq"]
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise _invalid_parameter(
            "seq", f"a ledger entry number is a positive integer, got {text!r}"
        )
    seq = int(text)
    query_name = request.query_params.get("query")
    as_csv = _wants_csv(request)

    def fetch(session: Session) -> Any:
        try:
            return session.result(seq, query_name)
        except ParameterError as error:
            # A report of the caller's, fetched without a query name: say which names it has.
            return error if "paid for a report" in str(error) else None

    result = await service.in_session(identity, fetch)
    if result is None:
        raise ServiceError(_NO_ANSWER.format(seq=seq), status=404)
    if isinstance(result, ParameterError):
        raise _invalid_parameter("query", str(result))
    if as_csv:
        return _csv(*result.interval_table())
    return StrictJSONResponse(result.to_dict())


@_documented("GET", "/v1/me", response_model=models.Me, tags=["session"])
async def me(request: Request) -> Response:
    """The name and role the token stands for."""
    _, identity = _identify(request, None)
    return StrictJSONResponse({"name": identity.name, "role": identity.role})


@_route("GET", "/v1/health", tags=["session"])
async def health() -> dict[str, str]:
    """Liveness; needs no token and says nothing about the data."""
    return {"status": "ok", "version": VERSION}


@_route("GET", "/", include_in_schema=False)
async def console() -> FileResponse:
    """The web console; its scripts come from this origin only."""
    return FileResponse(
        CONSOLE / "index.html",
        headers={"Content-Security-Policy": "default-src 'self'"},
    )


async def _refused(_: Request, error: Exception) -> Response:
    assert isinstance(error, DpsqlError)
    return _problem_response(problem_for(error), _headers_for(error))


async def _invalid(_: Request, error: Exception) -> Response:
    assert isinstance(error, RequestValidationError)
    first = error.errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    message = first.get("msg", "invalid")
    detail = f"{where}: {message}" if where else message
    return _problem_response(Problem(400, "parameter", "Invalid parameter", detail))


async def _http_error(_: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    return _problem_response(Problem.service(error.status_code, str(error.detail)))


async def _defect(_: Request, error: Exception) -> Response:
    _log.error("unexpected error", exc_info=error)
    return _problem_response(
        Problem.service(500, "internal error; the administrator's log has the details")
    )


def _too_large(limit: int) -> Response:
    return _problem_response(
        Problem.service(413, f"request body is larger than the limit of {limit} bytes")
    )


def _with_bearer(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document, declaring the bearer scheme the endpoints' security names (the
    token is read by ``_identify``, not by a FastAPI security dependency)."""
    if app.openapi_schema is None:
        schema = FastAPI.openapi(app)
        components = schema.setdefault("components", {})
        components["securitySchemes"] = {"bearer": BEARER}
        schemas = components.setdefault("schemas", {})
        for model in _BODIES:
            described = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(described.pop("$defs", {}))
            schemas[model.__name__] = described
        app.openapi_schema = schema
    return app.openapi_schema


def create_app(settings: ServerSettings) -> FastAPI:
    """The service over ``settings.database`` (its policy must be set)."""
    policy_of(Path(settings.database))  # refuse to start without a policy, with the CLI's message
    service = Service.open(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        door = None
        if settings.pg_port is not None:  # the PostgreSQL port, on this worker's event loop
            from dpsql.serving.pgserver import PgFrontDoor

            door = PgFrontDoor(service)
            await door.start()
        try:
            yield
        finally:
            if door is not None:
                await door.close()
            service.close()

    # FastAPIOffline: /docs and /redoc from assets in the package, not a CDN (data owners'
    # machines may have no route to the internet).
    app = FastAPIOffline(
        title="dpsql",
        version=VERSION,
        summary="Differentially private SQL over one database, with a privacy ledger.",
        description=(
            "Send `Authorization: Bearer <token>` (from `dpsql token create`). Analysts query, "
            "explain and read their own budget, ledger entries and synopses; auditors read the "
            "whole ledger and budget and verify it. Errors are RFC 9457 problem details."
        ),
        default_response_class=StrictJSONResponse,
        lifespan=lifespan,
        # FastAPI's own OpenTelemetry reports to a provider configured in the process; dpsql
        # configures none (the access log records requests), yet each request paid to check.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.service = service
    app.openapi = lambda: _with_bearer(app)  # type: ignore[method-assign]
    for endpoint, arguments in _ROUTES:
        app.router.add_api_route(endpoint=endpoint, **arguments)
    app.mount("/console", StaticFiles(directory=CONSOLE), name="console")
    app.add_exception_handler(DpsqlError, _refused)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _defect)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, too_large=_too_large)
    if settings.access_log is not None:
        # Outermost of the application's layers, so that every refusal is logged too.
        app.add_middleware(AccessLog, path=settings.access_log)
    return app


def app_from_environment() -> FastAPI:
    """The uvicorn factory: settings from ``DPSQL_SERVE_SETTINGS`` (JSON)."""
    return create_app(ServerSettings.model_validate_json(os.environ[SETTINGS_VARIABLE]))
