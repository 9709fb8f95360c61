"""The service: ``dpsql serve``, ``dpsql token create|list|revoke``, and ``--url/--token`` (or
``DPSQL_URL``/``DPSQL_TOKEN``) in place of ``--db --analyst`` on the analyst commands.

``accept_remote(cli)`` gives the analyst commands their remote twin. Importing this module loads
neither FastAPI, uvicorn nor the HTTP client; the commands do when they run.
"""

from __future__ import annotations

import functools
import json
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from dpsql.cli.options import db_option, format_option
from dpsql.cli.output import (
    print_budget,
    print_ledger,
    print_result,
    print_schema,
    print_synopses,
    print_tokens,
)
from dpsql.errors import LedgerError, ParameterError

if TYPE_CHECKING:
    from dpsql.serving.client import RemoteSession
    from dpsql.serving.limits import ServerSettings

__all__ = ["accept_remote", "run_service", "serve", "serve_demo", "token"]


@click.command()
@db_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Worker processes sharing the ledger (2 on a 2-core machine; see the README).",
)
@click.option("--max-body-bytes", default=64 * 1024, show_default=True, type=click.IntRange(1024))
@click.option("--max-sql-length", default=20_000, show_default=True, type=click.IntRange(16))
@click.option(
    "--rate-limit", default=600, show_default=True, type=click.IntRange(1), help="Per token/minute."
)
@click.option("--query-timeout", default=60.0, show_default=True, type=click.FloatRange(min=0.001))
@click.option(
    "--verify-every",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds between re-verifications of the ledger's chain by each worker.",
)
@click.option(
    "--access-log",
    default=None,
    type=click.Path(dir_okay=False),
    help="Append one JSON line per request (refusals included; never SQL text) to this file; "
    "rotate it by renaming, the next line opens a new file.",
)
@click.option(
    "--pg-port",
    default=None,
    envvar="DPSQL_PG_PORT",
    type=click.IntRange(0, 65535),
    help="Also accept PostgreSQL clients on this port (user: the analyst, password: their "
    "token, database: the dataset); see docs/serving.md.",
)
@click.option(
    "--pg-host",
    default=None,
    help="Address of the PostgreSQL port (default: --host).",
)
@click.option(
    "--pg-tls-cert",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="PEM certificate chain for the PostgreSQL port; with --pg-tls-key, TLS is required.",
)
@click.option(
    "--pg-tls-key",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="PEM private key of --pg-tls-cert.",
)
def serve(
    database: str,
    host: str,
    port: int,
    workers: int,
    max_body_bytes: int,
    max_sql_length: int,
    rate_limit: int,
    query_timeout: float,
    verify_every: float,
    access_log: str | None,
    pg_port: int | None,
    pg_host: str | None,
    pg_tls_cert: str | None,
    pg_tls_key: str | None,
) -> None:
    """Serve the database over HTTP: the API under /v1, its docs at /docs, a console at /; with
    --pg-port, over the PostgreSQL protocol too."""
    from dpsql.engine.session import show_policy
    from dpsql.serving.limits import ServerSettings
    from dpsql.serving.tokens import TokenStore

    show_policy(database)  # a missing policy is a one-line error before anything starts
    TokenStore(database).close()
    if access_log is not None:
        try:
            with open(access_log, "a", encoding="utf-8"):
                pass
        except OSError as error:
            raise ParameterError(
                f"cannot append to the access log {access_log!r}: {error.strerror}"
            ) from None
    settings = ServerSettings(
        database=os.path.abspath(database),
        max_body_bytes=max_body_bytes,
        max_sql_length=max_sql_length,
        rate_per_minute=rate_limit,
        query_timeout=query_timeout,
        verify_every=verify_every,
        access_log=None if access_log is None else os.path.abspath(access_log),
        pg_host=pg_host or host,
        pg_port=pg_port,
        pg_reuse_port=workers > 1,
        pg_tls_cert=None if pg_tls_cert is None else os.path.abspath(pg_tls_cert),
        pg_tls_key=None if pg_tls_key is None else os.path.abspath(pg_tls_key),
    )
    if pg_port is not None:
        _check_postgres(settings)
    run_service(settings, host=host, port=port, workers=workers)


def _check_postgres(settings: ServerSettings) -> None:
    """Refuse, in one line and before anything starts, a PostgreSQL port that is taken or a
    certificate that does not load."""
    from dpsql.serving.pgserver import tls_context

    if (settings.pg_tls_cert is None) != (settings.pg_tls_key is None):
        raise ParameterError("give both --pg-tls-cert and --pg-tls-key, or neither")
    try:
        tls_context(settings.pg_tls_cert, settings.pg_tls_key)
    except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
        raise ParameterError(f"cannot load the PostgreSQL port's certificate: {error}") from None
    assert settings.pg_port is not None
    _listening_socket(settings.pg_host, settings.pg_port).close()


def run_service(settings: ServerSettings, *, host: str, port: int, workers: int) -> None:
    """Start uvicorn with ``workers`` processes on ``host:port``; returns when it stops."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from dpsql.serving.app import SETTINGS_VARIABLE

    os.environ[SETTINGS_VARIABLE] = settings.model_dump_json()
    config = uvicorn.Config(
        "dpsql.serving.app:app_from_environment",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level="warning",
        access_log=False,  # uvicorn's own; dpsql's --access-log holds token ids, no SQL
        proxy_headers=False,  # nothing reads client addresses (limits are per token): no rewrite
        server_header=False,  # no software banner in every response
    )
    listening = _listening_socket(host, port)
    postgres = (
        ""
        if settings.pg_port is None
        else f" and postgresql://{settings.pg_host}:{settings.pg_port}"
    )
    click.echo(
        f"dpsql: serving {settings.database} on http://{host}:{port}{postgres} "
        f"({workers} worker(s))",
        err=True,
    )
    if workers > 1:
        Multiprocess(config, sockets=[listening]).run()
    else:
        uvicorn.Server(config).run(sockets=[listening])


def serve_demo(database: str, *, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Print an analyst and an auditor token for the demo database, then serve it."""
    from dpsql.serving.limits import ServerSettings
    from dpsql.serving.tokens import TokenStore

    with TokenStore(database) as store:
        alice, _ = store.create("alice", "analyst")
        auditor, _ = store.create("auditor", "auditor")
    click.echo(
        f"\nConsole: http://{host}:{port}/   API docs: http://{host}:{port}/docs\n"
        f"  analyst alice: {alice}\n"
        f"  auditor:       {auditor}\n"
        "Stop with Ctrl-C."
    )
    settings = ServerSettings(database=os.path.abspath(database))
    run_service(settings, host=host, port=port, workers=1)


def _listening_socket(host: str, port: int) -> socket.socket:
    """The service's listening socket, bound with the TCP protocol number.

    uvicorn binds its multi-worker socket with protocol 0, and asyncio then never sets
    TCP_NODELAY on the connections: every response stalls 40 ms on delayed ACKs. So dpsql binds
    the socket itself (as uvicorn's ``run`` would) and hands it to uvicorn's supervisor.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )[0]
        listening = socket.socket(family, kind, proto)
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind(address)
    except OSError as error:
        raise ParameterError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    listening.set_inheritable(True)
    return listening


@click.group()
def token() -> None:
    """Create, list or revoke access tokens of the service (administrator, on the server)."""


@token.command("create")
@db_option
@click.option("--analyst", "name", required=True, help="Analyst (or auditor) the token names.")
@click.option(
    "--role", type=click.Choice(["analyst", "auditor"]), default="analyst", show_default=True
)
def token_create(database: str, name: str, role: str) -> None:
    """Print a fresh token once; only its hash is kept."""
    from dpsql.serving.tokens import TokenStore

    with TokenStore(database) as store:
        secret, record = store.create(name, role)
    click.echo(secret)
    click.echo(
        f"token {record.id} for {role} {name!r}: store it now, it is not shown again", err=True
    )


@token.command("list")
@db_option
@format_option("table", "json", "csv")
def token_list(database: str, output_format: str) -> None:
    """List tokens (ids, names, roles, times; never secrets)."""
    from dpsql.serving.tokens import TokenStore

    with TokenStore(database) as store:
        records = [r.to_dict() for r in store.records()]
    print_tokens(records, output_format)


@token.command("revoke")
@db_option
@click.argument("token_id")
def token_revoke(database: str, token_id: str) -> None:
    """Revoke a token by id; the service refuses it from the next request on."""
    from dpsql.serving.tokens import TokenStore

    with TokenStore(database) as store:
        record = store.revoke(token_id)
    click.echo(f"token {record.id} of {record.name!r} revoked at {record.revoked}")


# Remote analyst commands: the same output as the local ones, through a RemoteSession. ----------
def _query_options(options: dict[str, Any]) -> dict[str, Any]:
    return {k: options[k] for k in ("epsilon", "delta", "mechanism", "max_answers", "accuracy")}


def _remote_query(
    session: RemoteSession, *, sql: str, dialect: str, output_format: str, **options: Any
) -> None:
    session.dialect = dialect
    print_result(session.execute(sql, **_query_options(options)), output_format)


def _remote_explain(session: RemoteSession, *, sql: str, **options: Any) -> None:
    click.echo(json.dumps(session.explain(sql, **_query_options(options)), indent=2))


def _remote_budget(session: RemoteSession, *, output_format: str, **_: Any) -> None:
    print_budget(session.budget(), output_format)


def _remote_ledger(session: RemoteSession, *, output_format: str, **_: Any) -> None:
    print_ledger(session.ledger(), output_format)


def _remote_verify(session: RemoteSession, **_: Any) -> None:
    report = session.verify()
    if not report["verified"]:
        raise LedgerError(report["detail"])
    click.echo(f"ledger at {session.url} verified: {report['detail']}")


def _remote_result(
    session: RemoteSession,
    *,
    entry: int,
    output_format: str,
    query_name: str | None = None,
    **_: Any,
) -> None:
    print_result(session.result(entry, query_name), output_format)
    if output_format == "table":
        click.echo("fetched from the service's stored answers: nothing was charged again")


def _remote_schema(session: RemoteSession, *, output_format: str, **_: Any) -> None:
    print_schema(session.schema(), output_format)


def _remote_synopses(session: RemoteSession, *, output_format: str, **_: Any) -> None:
    print_synopses(session.synopses(), output_format)


def _accept_remote(command: click.Command, remote: Callable[..., None]) -> None:
    """Let ``command`` take ``--url/--token`` instead of ``--db``/``--analyst``.

    The local options become optional to click and are checked here, so that each usage error
    names both ways of calling the command.
    """
    required = [p for p in command.params if p.name in ("database", "analyst") and p.required]
    for param in required:
        param.required = False
    command.params += [
        click.Option(["--url"], envvar="DPSQL_URL", help="A dpsql service (instead of --db)."),
        click.Option(["--token"], envvar="DPSQL_TOKEN", help="Access token for --url."),
    ]
    local = command.callback
    assert local is not None

    @functools.wraps(local)
    def callback(url: str | None, token: str | None, **options: Any) -> Any:
        context = click.get_current_context()
        if isinstance(command, click.Group) and context.invoked_subcommand is not None:
            return local(**options)  # the group's own set-up (e.g. --db for its subcommands)
        given = context.get_parameter_source("url") == ParameterSource.COMMANDLINE
        if options.get("database") is None and url is not None:
            if token is None:
                raise click.UsageError("Missing option '--token' (or DPSQL_TOKEN) for --url.")
            if options.pop("analyst", None) is not None:
                raise click.UsageError("with --url the service takes the analyst from the token")
            options.pop("database")
            from dpsql.serving.client import RemoteSession

            with RemoteSession(url, token=token) as session:
                remote(session, **options)
            return None
        if given:
            raise click.UsageError("give either --url/--token or --db/--analyst, not both")
        for param in required:
            if options.get(param.name or "") is None:
                flag = max(param.opts, key=len)
                raise click.UsageError(f"Missing option '{flag}' (or --url/--token).")
        return local(**options)

    command.callback = callback


def accept_remote(cli: click.Group) -> None:
    """Let ``cli``'s analyst commands reach a service with ``--url/--token``."""
    commands = cli.commands
    ledger = commands["ledger"]
    assert isinstance(ledger, click.Group)
    for command, remote in (
        (commands["query"], _remote_query),
        (commands["explain"], _remote_explain),
        (commands["budget"], _remote_budget),
        (ledger, _remote_ledger),
        (ledger.commands["verify"], _remote_verify),
        (commands["synopses"], _remote_synopses),
        (commands["result"], _remote_result),
        (commands["schema"], _remote_schema),
    ):
        _accept_remote(command, remote)
