"""The PostgreSQL front door: ``dpsql serve --pg-port P``.

Each worker of the service listens on the port too (the workers share it) and answers on the
same event loop as its HTTP requests, through the same ``Service``: the password is an analyst
token checked by ``Service.authenticate`` (the user name must be the token's analyst; the
database, the dataset's name), a query is admitted by the token's rate limit and answered by
``Service.execute`` on the worker's engine thread, so it is charged in the same ledger, under
the same cap and time limit, as ``POST /v1/query``. Catalogue questions are answered from the
analyst's public schema (``dpsql.serving.pgcatalog``), never from the data.

A differentially private answer comes back as a result set: the released columns, and with
``SET dpsql.intervals = on`` each noisy column's ``<col>_low``/``<col>_high``; its ledger entry,
ε, δ, mechanism and intervals come first as a NOTICE. ``SET dpsql.epsilon``, ``dpsql.delta``,
``dpsql.mechanism``, ``dpsql.accuracy`` and ``dpsql.max_answers`` set the session's query
options (``OPTIONS(...)`` in a query still wins). A refusal is an ErrorResponse with a SQLSTATE
and dpsql's message, and charges nothing.

Bounds: a message is refused past ``max_body_bytes`` before its body is read; the password must
arrive within ``AUTH_TIMEOUT`` seconds; a connection idle for ``pg_idle_timeout`` seconds is
closed; each worker accepts at most ``pg_max_connections``; a query runs within
``query_timeout`` seconds, a catalogue statement within ``CATALOGUE_TIMEOUT``; a connection
keeps at most ``MAX_PREPARED`` statements and portals.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import secrets
import ssl
import struct
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import duckdb

from dpsql.errors import DpsqlError, QueryError
from dpsql.serving import pgwire as wire
from dpsql.serving.access_log import AccessLogFile, new_line
from dpsql.serving.pgcatalog import Catalogue, Rows, parse
from dpsql.serving.pgreplies import notice, position, refusal, released
from dpsql.serving.pgsession import REPORTED, SessionSettings
from dpsql.serving.pgstatements import (
    PgError,
    Statement,
    bind_literals,
    classify,
    parameter_count,
    split,
    unqualified,
)
from dpsql.serving.service import Service
from dpsql.serving.tokens import Identity

__all__ = ["AUTH_TIMEOUT", "CATALOGUE_TIMEOUT", "MAX_PREPARED", "PgFrontDoor", "tls_context"]

AUTH_TIMEOUT = 30.0
CATALOGUE_TIMEOUT = 10.0
"""Seconds a catalogue statement may run (at most ``query_timeout``): two per worker at a time."""
MAX_PREPARED = 256


@dataclass(frozen=True)
class _Outcome:
    """What one statement answers: a result set (``rows`` None: no result set), its command
    tag, and messages to send before it (notices, parameter status)."""

    tag: str
    rows: Rows | None = None
    before: tuple[bytes, ...] = ()
    empty: bool = False


@dataclass
class _Prepared:
    text: str
    statement: Statement
    oids: list[int]


@dataclass
class _Portal:
    prepared: _Prepared
    values: list[Any]
    formats: list[int]
    outcome: _Outcome | None = None
    sent: int = 0
    fields: tuple[wire.Field, ...] = field(default_factory=tuple)


def _formats(codes: Sequence[int], count: int) -> list[int]:
    """The result format of each of ``count`` columns from a Bind's format codes."""
    if not codes:
        return [wire.TEXT] * count
    if len(codes) == 1:
        return [codes[0]] * count
    if len(codes) != count:
        raise PgError("08P01", f"{len(codes)} result formats for {count} columns")
    return list(codes)


class _Connection:
    """One client connection: start-up, authentication, then its statements."""

    def __init__(
        self, door: PgFrontDoor, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ):
        self.door = door
        self.service = door.service
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.client = peer[0] if isinstance(peer, tuple) else None
        self.identity: Identity | None = None
        self.catalogue: Catalogue | None = None
        self.settings = SessionSettings({})
        self.transaction = b"I"
        self.prepared: dict[str, _Prepared] = {}
        self.portals: dict[str, _Portal] = {}
        self.skipping = False  # after an error in the extended protocol, until Sync
        self.encrypted = False

    # framing ------------------------------------------------------------------------------------
    @property
    def limit(self) -> int:
        return self.service.settings.max_body_bytes

    def send(self, *messages: bytes) -> None:
        self.writer.write(b"".join(messages))

    async def flush(self) -> None:
        async with asyncio.timeout(self.service.settings.query_timeout):
            await self.writer.drain()

    def _line(self, endpoint: str) -> dict[str, Any]:
        line = new_line(self.client, "PG", endpoint)
        if self.identity is not None:
            line |= {
                "token_id": self.identity.token_id,
                "analyst": self.identity.name,
                "role": self.identity.role,
            }
        return line

    def _log(self, line: dict[str, Any], started: float) -> None:
        if self.door.log is not None:
            line["duration_ms"] = round((time.perf_counter() - started) * 1000, 3)
            self.door.log.write(line)

    # start-up -----------------------------------------------------------------------------------
    async def serve(self) -> None:
        try:
            if await self._start():
                await self._statements()
        except wire.MessageTooLarge as error:
            self.send(wire.error_response("54000", str(error), severity="FATAL"))
        except wire.ProtocolViolation as error:
            self.send(wire.error_response("08P01", str(error), severity="FATAL"))
        except TimeoutError:
            self.send(wire.error_response("57P05", "connection timed out", severity="FATAL"))
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except Exception as error:  # a defect: the log has it, the client one fixed message
            sqlstate, message, _, _ = refusal(error)
            self.send(wire.error_response(sqlstate, message, severity="FATAL"))
        finally:
            await self._close()

    async def _close(self) -> None:
        with contextlib.suppress(ConnectionError, TimeoutError):
            await asyncio.wait_for(self.writer.drain(), 1)
        self.writer.close()
        if self.catalogue is not None:  # on its thread: it waits for a statement still running
            await asyncio.get_running_loop().run_in_executor(self.door.pool, self.catalogue.close)

    async def _startup_message(self) -> dict[str, str] | None:
        """The client's StartupMessage parameters, after TLS (with a certificate, required;
        without, declined) and declining GSS encryption; None for a cancel request (not
        supported: a running query finishes)."""
        while True:
            code, body = await wire.read_startup(self.reader, self.limit)
            if code == wire.SSL_REQUEST and self.door.tls is not None and not self.encrypted:
                self.send(b"S")
                await self.flush()
                await self.writer.start_tls(self.door.tls)
                self.encrypted = True
                continue
            if code in (wire.SSL_REQUEST, wire.GSSENC_REQUEST):
                self.send(b"N")
                await self.flush()
                continue
            if code == wire.CANCEL_REQUEST:
                return None
            if code >> 16 != 3:
                raise wire.ProtocolViolation(f"unsupported frontend protocol {code >> 16}")
            if self.door.tls is not None and not self.encrypted:
                raise PgError("28000", "this server accepts TLS connections only (sslmode=require)")
            parameters = wire.Reader(body).startup_parameters()
            extensions = [name for name in parameters if name.startswith("_pq_.")]
            if code & 0xFFFF or extensions:  # a newer minor version: answer 3.0, no extension
                names = b"".join(wire.cstring(name) for name in extensions)
                offer = struct.pack("!ii", wire.PROTOCOL_3, len(extensions))
                self.send(wire.message(b"v", offer + names))
            return {k: v for k, v in parameters.items() if k not in extensions}

    async def _start(self) -> bool:
        """Start-up and password authentication; True when the session is ready."""
        started = time.perf_counter()
        line = self._line("pg:startup")
        try:
            async with asyncio.timeout(AUTH_TIMEOUT):
                parameters = await self._startup_message()
                if parameters is None:
                    return False
                identity = await self._authenticate(parameters)
                self.settings = SessionSettings(self._options(parameters))  # refuses bad values
        except (PgError, DpsqlError) as error:
            sqlstate, text, status, problem = refusal(error)
            line = self._line("pg:startup")  # with the token, once one was recognised
            line |= {"status": status, "problem": problem, "sqlstate": sqlstate}
            self._log(line, started)
            self.send(wire.error_response(sqlstate, text, severity="FATAL"))
            return False
        self.identity = identity
        line = self._line("pg:startup") | {"status": 200, "sqlstate": "00000"}
        self._log(line, started)
        reported = {**REPORTED, "application_name": self.settings.show("application_name")}
        self.send(
            wire.message(b"R", struct.pack("!i", 0)),
            *(wire.parameter_status(n, v) for n, v in reported.items()),
            wire.parameter_status("session_authorization", identity.name),
            wire.message(b"K", struct.pack("!ii", secrets.randbits(31), secrets.randbits(31))),
        )
        self._ready()
        await self.flush()
        return True

    @staticmethod
    def _options(parameters: dict[str, str]) -> dict[str, str]:
        """Start-up parameters, with ``options``' ``-c name=value`` settings among them."""
        found = {k: v for k, v in parameters.items() if k not in ("user", "database", "options")}
        words = parameters.get("options", "").split()
        for word, following in itertools.zip_longest(words, words[1:]):
            setting = following if word == "-c" else word[2:] if word.startswith("--") else None
            if setting and "=" in setting:
                name, _, value = setting.partition("=")
                found[name] = value
        return found

    async def _authenticate(self, parameters: dict[str, str]) -> Identity:
        user = parameters.get("user", "")
        if not user:
            raise PgError("28000", "no user name given; the user is the analyst's name")
        if self.door.active > self.service.settings.pg_max_connections:
            raise PgError("53300", "too many connections to this dpsql worker")
        self.send(wire.message(b"R", struct.pack("!i", 3)))  # cleartext password
        await self.flush()
        kind, body = await wire.read_message(self.reader, self.limit)
        if kind != b"p":
            raise wire.ProtocolViolation("expected a password message")
        password = wire.Reader(body).string()
        failed = PgError("28P01", f'password authentication failed for user "{user}"')
        try:
            identity = self.service.authenticate(password)
        except DpsqlError:
            raise failed from None
        if identity.name != user:
            raise failed
        self.identity = identity  # the log names the token from here on
        if identity.role != "analyst":
            raise PgError("28000", f"role {identity.role!r} cannot query; use an analyst token")
        self.service.admit(identity, "analyst")
        schema = await self.service.in_session(identity, lambda s: s.schema())
        dataset = schema["dataset"]["name"]
        database = parameters.get("database") or user
        if database != dataset:
            raise PgError("3D000", f'database "{database}" does not exist; connect to "{dataset}"')
        loop = asyncio.get_running_loop()
        self.catalogue = await loop.run_in_executor(
            self.door.pool, lambda: Catalogue(schema, analyst=identity.name)
        )
        return identity

    # the statement loop -------------------------------------------------------------------------
    def _ready(self) -> None:
        self.send(wire.message(b"Z", self.transaction))

    async def _statements(self) -> None:
        handlers = {
            b"Q": self._simple,
            b"P": self._parse,
            b"B": self._bind,
            b"D": self._describe,
            b"E": self._execute,
            b"C": self._close_named,
        }
        while True:
            async with asyncio.timeout(self.service.settings.pg_idle_timeout):
                kind, body = await wire.read_message(self.reader, self.limit)
            if kind == b"X":
                return
            if kind == b"S":
                self.skipping = False
                if self.transaction == b"I":
                    self.portals.clear()
                self._ready()
                await self.flush()
                continue
            if kind == b"H":
                await self.flush()
                continue
            handler = handlers.get(kind)
            if kind != b"Q" and self.skipping:
                continue
            try:
                if handler is None:
                    raise PgError("0A000", f"message type {kind!r} is not supported")
                await handler(wire.Reader(body))
            except (PgError, DpsqlError, duckdb.Error) as error:
                self._error(error, "")
                if kind != b"Q":
                    self.skipping = True
            await self.flush()

    def _error(self, error: Exception, text: str) -> None:
        sqlstate, message, _, _ = refusal(error)
        at = position(text, error) if isinstance(error, QueryError) else None
        self.send(wire.error_response(sqlstate, message, position=at))
        if self.transaction == b"T":
            self.transaction = b"E"

    # simple protocol ----------------------------------------------------------------------------
    async def _simple(self, reader: wire.Reader) -> None:
        text = reader.string()
        statements = split(text)
        if not statements:
            self.send(wire.message(b"I"))
        for piece in statements:
            try:
                outcome = await self._answer(piece, [])
            except (PgError, DpsqlError, duckdb.Error) as error:
                self._error(error, piece)
                break
            self.send(*outcome.before)
            if outcome.rows is not None:
                columns = tuple(c.sent_as(wire.TEXT) for c in outcome.rows.columns)
                self.send(wire.row_description(columns))
                await self._rows(outcome.rows.rows, columns)
            self.send(wire.command_complete(outcome.tag))
        self._ready()

    async def _rows(self, rows: Sequence[tuple[Any, ...]], columns: Sequence[wire.Field]) -> None:
        for count, row in enumerate(rows, 1):
            self.send(
                wire.data_row([wire.encode_value(v, c) for v, c in zip(row, columns, strict=True)])
            )
            if count % 1000 == 0:
                await self.flush()

    # extended protocol --------------------------------------------------------------------------
    def _kept(self, store: dict[str, Any], name: str, value: Any) -> None:
        if name and name in store:
            raise PgError("42P05", f'prepared statement or portal "{name}" already exists')
        if name not in store and len(store) >= MAX_PREPARED:
            raise PgError("54000", f"at most {MAX_PREPARED} prepared statements and portals")
        store[name] = value

    async def _parse(self, reader: wire.Reader) -> None:
        name, text = reader.string(), reader.string()
        oids = [reader.int32() for _ in range(reader.int16())]
        statement = self._classify(text)
        self._kept(self.prepared, name, _Prepared(text, statement, oids))
        self.send(wire.message(b"1"))

    @property
    def _tables(self) -> frozenset[str]:
        assert self.catalogue is not None
        return self.catalogue.tables

    @property
    def _dataset(self) -> str:
        assert self.catalogue is not None
        return self.catalogue.dataset

    def _statement(self, name: str) -> _Prepared:
        prepared = self.prepared.get(name)
        if prepared is None:
            raise PgError("26000", f'prepared statement "{name}" does not exist')
        return prepared

    async def _bind(self, reader: wire.Reader) -> None:
        portal, prepared = reader.string(), self._statement(reader.string())
        formats = [reader.int16() for _ in range(reader.int16())]
        raw = [reader.value() for _ in range(reader.int16())]
        result_formats = [reader.int16() for _ in range(reader.int16())]
        parameter_formats = _formats(formats, len(raw))
        values = []
        for index, value in enumerate(raw):
            oid = prepared.oids[index] if index < len(prepared.oids) else 0
            try:
                values.append(wire.decode_parameter(value, oid, parameter_formats[index]))
            except (ValueError, UnicodeDecodeError) as error:
                raise PgError("22P02", str(error)) from None
        if portal in self.portals and portal == "":
            del self.portals[""]
        self._kept(self.portals, portal, _Portal(prepared, values, result_formats))
        self.send(wire.message(b"2"))

    def _portal(self, name: str) -> _Portal:
        portal = self.portals.get(name)
        if portal is None:
            raise PgError("34000", f'portal "{name}" does not exist')
        return portal

    async def _outcome(self, portal: _Portal) -> _Outcome:
        """The portal's outcome, running its statement the first time."""
        if portal.outcome is None:
            portal.outcome = await self._answer(
                portal.prepared.text, portal.values, portal.prepared.statement
            )
            self.send(*portal.outcome.before)
            if portal.outcome.rows is not None:
                columns = portal.outcome.rows.columns
                formats = _formats(portal.formats, len(columns))
                portal.fields = tuple(c.sent_as(f) for c, f in zip(columns, formats, strict=True))
        return portal.outcome

    async def _describe(self, reader: wire.Reader) -> None:
        kind, name = reader.byte(), reader.string()
        if kind == b"S":
            prepared = self._statement(name)
            count = max(len(prepared.oids), parameter_count(prepared.text))
            oids = [*(o or wire.TEXT_OID for o in prepared.oids), *[wire.TEXT_OID] * count]
            self.send(wire.message(b"t", struct.pack(f"!h{count}i", count, *oids[:count])))
            shape = await self._shape(prepared, count)
            self.send(wire.row_description(shape) if shape else wire.message(b"n"))
            return
        portal = self._portal(name)
        outcome = await self._outcome(portal)
        self.send(wire.row_description(portal.fields) if outcome.rows else wire.message(b"n"))

    async def _shape(self, prepared: _Prepared, count: int) -> tuple[wire.Field, ...] | None:
        """The columns of a prepared statement that can be known without running a query: a
        catalogue statement's (run with NULL parameters) and SHOW's."""
        statement = prepared.statement
        if statement.kind == "show":
            return (wire.Field(statement.name or "setting", wire.TEXT_OID),)
        if statement.kind == "catalog":
            rows = await self._catalog(statement, [None] * count)
            return rows.columns
        return None

    async def _execute(self, reader: wire.Reader) -> None:
        portal = self._portal(reader.string())
        limit = reader.int32()
        outcome = await self._outcome(portal)
        if outcome.empty:
            self.send(wire.message(b"I"))
            return
        if outcome.rows is None:
            self.send(wire.command_complete(outcome.tag))
            return
        rows = outcome.rows.rows[portal.sent :]
        if 0 < limit < len(rows):
            await self._rows(rows[:limit], portal.fields)
            portal.sent += limit
            self.send(wire.message(b"s"))
            return
        await self._rows(rows, portal.fields)
        portal.sent += len(rows)
        self.send(wire.command_complete(f"SELECT {portal.sent}"))

    async def _close_named(self, reader: wire.Reader) -> None:
        kind, name = reader.byte(), reader.string()
        (self.prepared if kind == b"S" else self.portals).pop(name, None)
        self.send(wire.message(b"3"))

    # answering one statement --------------------------------------------------------------------
    async def _answer(
        self, text: str, values: list[Any], statement: Statement | None = None
    ) -> _Outcome:
        """Answer one statement (its access-log line written whatever happens)."""
        if statement is None:
            statement = self._classify(text)  # a refusal here is logged there
        started = time.perf_counter()
        line = self._line(f"pg:{statement.kind}")
        try:
            if statement.kind in ("query", "explain", "catalog"):
                digest = hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()
                line["sql_sha256"] = digest
            outcome = await self._dispatch(statement, values, line)
        except (PgError, DpsqlError, duckdb.Error) as error:
            sqlstate, _, status, problem = refusal(error)
            line |= {"status": status, "problem": problem, "sqlstate": sqlstate}
            raise
        except Exception:
            line |= {"status": 500, "problem": "urn:dpsql:problem:internal", "sqlstate": "XX000"}
            raise
        else:
            line |= {"status": 200, "sqlstate": "00000"}
            return outcome
        finally:
            self._log(line, started)

    def _classify(self, text: str) -> Statement:
        """What ``text`` is; a statement refused here gets its access-log line too."""
        started = time.perf_counter()
        try:
            self.service.within_sql_length("sql", text)
            return classify(text, self._tables, self._dataset)
        except (PgError, DpsqlError) as error:
            sqlstate, _, status, problem = refusal(error)
            line = self._line("pg:statement")
            line |= {"status": status, "problem": problem, "sqlstate": sqlstate}
            self._log(line, started)
            raise

    async def _dispatch(
        self, statement: Statement, values: list[Any], line: dict[str, Any]
    ) -> _Outcome:
        kind = statement.kind
        if self.transaction == b"E" and kind not in ("commit", "rollback", "rollback_to"):
            raise PgError(
                "25P02",
                "current transaction is aborted, commands ignored until end of transaction block",
            )
        if kind == "empty":
            return _Outcome("", empty=True)
        if kind == "query":
            return await self._query(statement.text, values, line)
        if kind == "explain":
            return await self._explain(statement.value or "", values)
        if kind == "catalog":
            rows = await self._catalog(statement, values)
            return _Outcome(f"SELECT {len(rows.rows)}", rows)
        return self._session_statement(statement)

    def _session_statement(self, statement: Statement) -> _Outcome:
        kind, name = statement.kind, statement.name or ""
        if kind == "set":
            self.settings.set(name, statement.value or "")
            return _Outcome("SET", before=self._reported(name))
        if kind == "reset":
            self.settings.reset(name)
            return _Outcome("RESET", before=self._reported(name))
        if kind == "show":
            value = self.settings.show(name)
            rows = Rows((wire.Field(name, wire.TEXT_OID),), ((value,),))
            return _Outcome("SHOW", rows)
        if kind in ("begin", "rollback_to"):
            self.transaction = b"T"
        elif kind in ("commit", "rollback"):
            tag = "ROLLBACK" if self.transaction == b"E" else statement.tag
            self.transaction = b"I"
            return _Outcome(tag)
        return _Outcome(statement.tag)

    def _reported(self, name: str) -> tuple[bytes, ...]:
        spelled = next((n for n in REPORTED if n.lower() == name), None)
        if spelled is None:
            return ()
        value = self.settings.show(name)
        return (wire.parameter_status(spelled, value),)

    def _engine_sql(self, text: str, values: list[Any]) -> str:
        return bind_literals(unqualified(text, self._dataset), values)

    async def _query(self, text: str, values: list[Any], line: dict[str, Any]) -> _Outcome:
        identity = self.identity
        assert identity is not None
        self.service.admit(identity, "analyst")
        sql = self._engine_sql(text, values)
        result = await self.service.execute(
            identity, sql, dialect="postgres", options=self.settings.options()
        )
        line |= {
            "epsilon": result.epsilon,
            "delta": result.delta,
            "ledger_entry": result.ledger_entry,
        }
        rows = released(result, self.settings.intervals)
        return _Outcome(
            f"SELECT {len(rows.rows)}", rows, before=(notice(result, self.settings.intervals),)
        )

    async def _explain(self, text: str, values: list[Any]) -> _Outcome:
        identity = self.identity
        assert identity is not None
        self.service.admit(identity, "analyst")
        sql = self._engine_sql(text, values)
        options = self.settings.options()
        report = await self.service.in_session(
            identity, lambda s: s.explain(sql, dialect="postgres", **options)
        )
        lines = json.dumps(report, indent=2, default=str).splitlines()
        rows = Rows((wire.Field("QUERY PLAN", wire.TEXT_OID),), tuple((x,) for x in lines))
        return _Outcome("EXPLAIN", rows)

    async def _catalog(self, statement: Statement, values: list[Any]) -> Rows:
        catalogue = self.catalogue
        assert catalogue is not None and statement.expression is not None
        # Parameters become literals, as in a query: DuckDB would refuse a statement whose
        # rewriting dropped a placeholder.
        expression = (
            parse(bind_literals(statement.text, values)) if values else statement.expression
        )
        loop = asyncio.get_running_loop()
        timeout = min(CATALOGUE_TIMEOUT, self.service.settings.query_timeout)
        future = loop.run_in_executor(self.door.pool, catalogue.run, expression)
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            catalogue.interrupt()
            raise PgError(
                "57014", f"the statement passed the time limit of {timeout:g} s"
            ) from None


def tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """The server's TLS context from a certificate chain and its key (None without them);
    ``ssl.SSLError`` or ``OSError`` if they cannot be loaded."""
    if cert is None or key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


class PgFrontDoor:
    """The PostgreSQL port of one worker."""

    def __init__(self, service: Service):
        self.service = service
        self.active = 0
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="dpsql-pg-catalogue")
        settings = service.settings
        self.log = AccessLogFile(settings.access_log) if settings.access_log else None
        self.tls = tls_context(settings.pg_tls_cert, settings.pg_tls_key)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        settings = self.service.settings
        self._server = await asyncio.start_server(
            self._accept,
            settings.pg_host,
            settings.pg_port,
            reuse_address=True,
            reuse_port=settings.pg_reuse_port,
        )

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.active += 1
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await _Connection(self, reader, writer).serve()
        finally:
            self.active -= 1
            self._connections.discard(task)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.log is not None:
            self.log.close()
