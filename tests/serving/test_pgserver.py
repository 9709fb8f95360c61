"""``dpsql serve --pg-port``: real PostgreSQL clients (psql, psycopg 3, SQLAlchemy + pandas)
against the real server on loopback. Every query is charged once in the ledger the HTTP API
charges; refusals are ErrorResponses with SQLSTATEs; the catalogue holds the policy's tables
only; the access log has a line per statement and per failed sign-in, without SQL literals."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pandas as pd
import psycopg
import pytest
import sqlalchemy

from dpsql.accountant.units import Cost
from dpsql.serving.tokens import TokenStore
from tests.serving.conftest import Server, demo_database, free_port, serve, start, stop
from tests.serving.test_concurrency import ADMITTED, CAPPED, EPSILON

SECRET_LITERAL = "IS"
COUNT = "SELECT COUNT(*) AS n FROM requests"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    """The demo served on both ports, its database holding a table outside the policy."""
    directory = tmp_path_factory.mktemp("pg")
    log = directory / "access.jsonl"
    database = demo_database(directory)
    with duckdb.connect(str(database)) as connection:
        connection.execute("CREATE TABLE salaries AS SELECT 1 AS user_id, 99999 AS salary")
    with TokenStore(database) as store:
        alice, bob, auditor = (store.create(n, r)[0] for n, r in (
            ("alice", "analyst"), ("bob", "analyst"), ("carol", "auditor")))  # fmt: skip
    pg_port = free_port()
    flags = ("--access-log", str(log), "--rate-limit", "100000", "--pg-port", str(pg_port))
    url, process = start(database, *flags)
    try:
        yield Server(url, database, alice, bob, auditor, process, pg_port), log
    finally:
        stop(process)


def connect(server: Server, token: str, user: str = "alice", **kwargs) -> psycopg.Connection:
    return psycopg.connect(
        host="127.0.0.1",
        port=server.pg_port,
        user=user,
        password=token,
        dbname="demo",
        autocommit=True,
        connect_timeout=20,
        **kwargs,
    )


def charges(server: Server) -> list[dict]:
    return [e for e in server.entries() if e["kind"] == "charge"]  # verified on open


def log_lines(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_psycopg_query_is_charged_once_in_the_same_ledger(server: tuple[Server, Path]) -> None:
    running, _ = server
    notices: list[tuple[str, str]] = []  # a Diagnostic is valid during its callback only
    before = len(charges(running))
    with connect(running, running.alice) as connection:
        connection.add_notice_handler(
            lambda d: notices.append((d.message_primary or "", d.message_detail or ""))
        )
        connection.execute("SET dpsql.epsilon = 0.05")
        cursor = connection.execute(
            "SELECT country, COUNT(*) AS n FROM requests WHERE status = %s GROUP BY country",
            (200,),
        )
        rows = cursor.fetchall()
        assert [c.name for c in cursor.description] == ["country", "n"]
        assert [c.type_code for c in cursor.description] == [25, 20]  # text, int8
    assert sorted(r[0] for r in rows) == ["DK", "FI", "IS", "NO", "SE"]
    after = charges(running)
    assert len(after) == before + 1
    entry = after[-1]
    assert entry["analyst"] == "alice" and entry["epsilon"] == pytest.approx(0.05)
    primary, detail_text = notices[-1]
    detail = json.loads(detail_text)
    assert detail["ledger_entry"] == entry["seq"] and detail["epsilon"] == pytest.approx(0.05)
    assert f"ledger entry {entry['seq']}" in primary
    # The stored answer is the one released: fetched again over HTTP, for free.
    stored = running.call("GET", f"/v1/results/{entry['seq']}", running.alice).json()
    assert sorted(map(tuple, stored["rows"])) == sorted(rows)
    assert len(charges(running)) == before + 1


def test_prepared_statements_charge_each_execution(server: tuple[Server, Path]) -> None:
    running, _ = server
    before = len(charges(running))
    with connect(running, running.alice) as connection:
        connection.execute("SET dpsql.epsilon = 0.01")
        for _ in range(3):  # a named prepared statement: Parse once, Bind/Execute three times
            connection.execute(f"{COUNT} WHERE country = %s", ("DK",), prepare=True)
    assert len(charges(running)) == before + 3


def test_numeric_parameters_of_either_sign_are_compared_values(
    server: tuple[Server, Path],
) -> None:
    """psycopg sends each value as ``$1``; the port writes it into the text. A negative one is
    written as a number after a space (never a comment, never a parenthesized expression the
    engine refuses): before, any negative numeric parameter was refused."""
    running, _ = server
    before = len(charges(running))
    with connect(running, running.alice) as connection:
        connection.execute("SET dpsql.epsilon = 0.01")
        for value in (-1, 3, -40, 25):
            connection.execute(f"{COUNT} WHERE age >= %s", (value,), prepare=True).fetchall()
            connection.execute(f"{COUNT} WHERE age BETWEEN %s AND 60", (value,)).fetchall()
    recorded = [entry["query"] for entry in charges(running)[before:]]
    assert len(recorded) == 8
    assert recorded[4].endswith("WHERE age >= -40")


def test_intervals_as_columns(server: tuple[Server, Path]) -> None:
    running, _ = server
    with connect(running, running.alice) as connection:
        connection.execute("SET dpsql.epsilon = 0.05")
        connection.execute("SET dpsql.intervals = on")
        cursor = connection.execute(f"{COUNT} WHERE country = 'SE'")
        (n, low, high), = cursor.fetchall()  # fmt: skip
        assert [c.name for c in cursor.description] == ["n", "n_low", "n_high"]
        assert cursor.description[1].type_code == 701  # float8
        assert low <= n <= high
        assert connection.execute("SHOW dpsql.intervals").fetchone() == ("on",)
        binary = connection.cursor(binary=True)  # results in binary format: int8, float8, text
        rows = binary.execute(
            "SELECT country, COUNT(*) AS n FROM requests WHERE country = %s GROUP BY country",
            ("NO",),
        ).fetchall()
        assert [c.type_code for c in binary.description] == [25, 20, 701, 701]
        assert sorted(row[0] for row in rows) == ["DK", "FI", "IS", "NO", "SE"]  # public keys
        for _, n, low, high in rows:
            assert isinstance(n, int) and low <= n <= high
            if low > 0:  # a count's interval is clamped at 0 (details["clamped"])
                assert high - low == pytest.approx(2 * (n - low))


def test_refusals_are_errors_with_sqlstates_and_charge_nothing(
    server: tuple[Server, Path],
) -> None:
    running, _ = server
    before = len(charges(running))
    refused = {
        "SELECT user_id FROM requests": "0A000",  # raw rows: outside the allow-list
        "SELECT COUNT(* FROM requests": "42601",
        "SELECT COUNT(*) AS n FROM requests WHERE nonsense = 1": "42703",
        "SELECT salary FROM salaries": "42P01",  # outside the policy: not even in the catalogue
        "DELETE FROM requests": "0A000",
    }
    with connect(running, running.alice) as connection:
        for sql, sqlstate in refused.items():
            with pytest.raises(psycopg.Error) as raised:
                connection.execute(sql)
            assert raised.value.sqlstate == sqlstate, (sql, raised.value)
        connection.execute("SET dpsql.epsilon = 1000")
        with pytest.raises(psycopg.Error) as raised:
            connection.execute(COUNT)
        assert raised.value.sqlstate == "53400"
        assert "budget" in str(raised.value)
        with pytest.raises(psycopg.Error) as raised:
            connection.execute("SET dpsql.epsilon = 'lots'")
        assert raised.value.sqlstate == "22023"
    assert len(charges(running)) == before


def test_catalogue_lists_only_policy_tables(server: tuple[Server, Path]) -> None:
    running, _ = server
    with connect(running, running.alice) as connection:
        tables = connection.execute(
            "SELECT table_catalog, table_schema, table_name FROM information_schema.tables"
        ).fetchall()
        assert tables == [("demo", "public", "requests")]
        columns = connection.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s",
            ("requests",),
        ).fetchall()
        assert {"user_id", "country", "status", "latency_ms"} <= {c for (c,) in columns}
        relations = connection.execute("SELECT relname FROM pg_catalog.pg_class").fetchall()
        assert ("salaries",) not in relations and ("requests",) in relations
        with pytest.raises(psycopg.Error) as raised:
            connection.execute("SELECT COUNT(*) FROM salaries")
        assert raised.value.sqlstate == "42P01"


def test_catalogue_never_reads_the_data(server: tuple[Server, Path]) -> None:
    running, _ = server
    before = len(charges(running))
    with connect(running, running.alice) as connection:
        # The catalogue's tables are empty copies: a query that names no policy table answers
        # from them (nothing), and the sealed database reads no file.
        assert connection.execute("SELECT 1 + 1 AS two").fetchone() == (2,)
        for sql in (
            f"SELECT * FROM read_csv('{running.database}')",
            f"SELECT * FROM read_parquet('{running.database}')",
            f"ATTACH '{running.database}' AS stolen",
        ):
            with pytest.raises(psycopg.Error) as raised:
                connection.execute(sql)
            assert raised.value.sqlstate in ("42501", "0A000"), raised.value
        version = connection.execute("SELECT version()").fetchone()[0]
        assert version.startswith("PostgreSQL 15.0 (dpsql")
        assert connection.execute("SELECT current_user, current_database()").fetchone() == (
            "alice",
            "demo",
        )
    assert len(charges(running)) == before


def test_sqlalchemy_and_pandas(server: tuple[Server, Path]) -> None:
    running, _ = server
    before = len(charges(running))
    engine = sqlalchemy.create_engine(
        f"postgresql+psycopg://alice:{running.alice}@127.0.0.1:{running.pg_port}/demo",
        connect_args={"options": "-c dpsql.epsilon=0.02"},
    )
    try:
        with engine.connect() as connection:
            inspector = sqlalchemy.inspect(connection)
            assert inspector.get_table_names() == ["requests"]
            assert inspector.has_table("requests") and not inspector.has_table("salaries")
            columns = {c["name"]: str(c["type"]) for c in inspector.get_columns("requests")}
            assert columns["user_id"] == "BIGINT" and columns["country"] == "VARCHAR"
            assert columns["latency_ms"] == "DOUBLE PRECISION"
        frame = pd.read_sql(
            sqlalchemy.text(
                "SELECT country, COUNT(*) AS n FROM requests WHERE status = :status "
                "GROUP BY country"
            ),
            engine,
            params={"status": 404},
        )
    finally:
        engine.dispose()
    assert list(frame.columns) == ["country", "n"]
    assert sorted(frame["country"]) == ["DK", "FI", "IS", "NO", "SE"]
    assert frame["n"].dtype.kind == "i"
    added = charges(running)[before:]
    assert len(added) == 1 and added[0]["epsilon"] == pytest.approx(0.02)


def test_psql(server: tuple[Server, Path]) -> None:
    psql = shutil.which("psql")
    if psql is None:
        pytest.skip("psql is not installed (Debian's postgresql-client)")
    running, _ = server
    before = len(charges(running))
    command = [psql, "-h", "127.0.0.1", "-p", str(running.pg_port), "-U", "alice", "-d", "demo"]
    command += ["-X", "-v", "ON_ERROR_STOP=1", "-c", "SET dpsql.epsilon = 0.03", "-c", COUNT]
    listed = subprocess.run(
        [*command[:-4], "-c", "\\dt"],
        env={**os.environ, "PGPASSWORD": running.alice, "PGCONNECT_TIMEOUT": "20"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    assert " requests " in listed.stdout and "salaries" not in listed.stdout
    done = subprocess.run(
        command,
        env={**os.environ, "PGPASSWORD": running.alice, "PGCONNECT_TIMEOUT": "20"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "(1 row)" in done.stdout
    entry = charges(running)[-1]
    assert len(charges(running)) == before + 1
    assert f"NOTICE:  dpsql: ledger entry {entry['seq']}: epsilon 0.03" in done.stderr
    wrong = subprocess.run(
        [*command[:-4], "-c", COUNT],
        env={**os.environ, "PGPASSWORD": running.bob, "PGCONNECT_TIMEOUT": "20"},
        capture_output=True,
        text=True,
        timeout=60,
    )  # bob's token is not alice's password
    assert wrong.returncode != 0
    assert 'password authentication failed for user "alice"' in wrong.stderr
    assert len(charges(running)) == before + 1


JDBC = Path("/usr/share/java/postgresql.jar")


def test_jdbc(server: tuple[Server, Path]) -> None:
    """pgjdbc, the driver of Metabase and DBeaver: metadata, a prepared query, its notice."""
    java = shutil.which("java")
    if java is None or not JDBC.exists():
        pytest.skip("java or pgjdbc (Debian's libpostgresql-jdbc-java) is not installed")
    running, _ = server
    before = len(charges(running))
    probe = Path(__file__).parent / "fixtures" / "JdbcProbe.java"
    done = subprocess.run(
        [java, "-cp", str(JDBC), str(probe), str(running.pg_port), running.alice],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "product PostgreSQL" in lines
    assert [line for line in lines if line.startswith("table ")] == ["table requests"]
    assert "column user_id int8" in lines and "column latency_ms float8" in lines
    assert "types text int8" in lines
    assert len([line for line in lines if line.startswith("row ")]) == 5
    entry = charges(running)[-1]
    assert len(charges(running)) == before + 1 and entry["epsilon"] == pytest.approx(0.02)
    assert f"warning dpsql: ledger entry {entry['seq']}: epsilon 0.02" in done.stdout
    assert "refused 0A000" in lines


def _startup(port: int, user: str, password: str, database: str = "demo") -> dict[str, str]:
    """Sign in with the bare protocol; the fields of the ErrorResponse, or {} on success."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        parameters = f"user\0{user}\0database\0{database}\0\0".encode()
        sock.sendall(struct.pack("!ii", 8 + len(parameters), 196608) + parameters)
        kind, body = _receive(sock)
        assert (kind, struct.unpack("!i", body)[0]) == (b"R", 3)  # cleartext password
        secret = password.encode() + b"\0"
        sock.sendall(b"p" + struct.pack("!i", 4 + len(secret)) + secret)
        kind, body = _receive(sock)
        if kind != b"E":
            return {}
        return {part[:1].decode(): part[1:].decode() for part in body.split(b"\0") if part}


def _receive(sock: socket.socket) -> tuple[bytes, bytes]:
    def exactly(count: int) -> bytes:
        data = b""
        while len(data) < count:
            piece = sock.recv(count - len(data))
            assert piece, "the server closed the connection"
            data += piece
        return data

    kind = exactly(1)
    length = struct.unpack("!i", exactly(4))[0]
    return kind, exactly(length - 4)


def test_wrong_password_and_database_are_refused_and_logged(server: tuple[Server, Path]) -> None:
    running, log = server
    port = running.pg_port
    assert port is not None
    refused = _startup(port, "alice", "dpsql_guess_secret")
    assert (refused["S"], refused["C"]) == ("FATAL", "28P01")
    assert refused["M"] == 'password authentication failed for user "alice"'
    assert _startup(port, "bob", running.alice)["C"] == "28P01"  # another analyst's token
    assert _startup(port, "carol", running.auditor)["C"] == "28000"  # an auditor cannot query
    other = _startup(port, "alice", running.alice, database="postgres")
    assert other["C"] == "3D000" and '"demo"' in other["M"]
    assert _startup(port, "alice", running.alice) == {}
    time.sleep(0.3)
    startups = [line for line in log_lines(log) if line["endpoint"] == "pg:startup"]
    failed = [line for line in startups if line["sqlstate"] == "28P01"]
    assert len(failed) >= 2 and all(line["status"] == 401 for line in failed)
    assert all(line["token_id"] is None for line in failed)
    assert any(line["status"] == 200 for line in startups)


def test_oversized_message_is_refused_before_it_is_read(server: tuple[Server, Path]) -> None:
    running, _ = server
    with socket.create_connection(("127.0.0.1", running.pg_port), timeout=20) as sock:
        sock.sendall(struct.pack("!ii", 1 << 30, 196608))  # a 1 GiB start-up message
        kind, body = _receive(sock)
    assert kind == b"E" and b"C54000" in body


def test_access_log_has_statements_without_literals(server: tuple[Server, Path]) -> None:
    running, log = server
    with connect(running, running.alice) as connection:
        connection.execute("SET dpsql.epsilon = 0.01")
        connection.execute(f"{COUNT} WHERE country = '{SECRET_LITERAL}'")
        with pytest.raises(psycopg.Error):
            connection.execute(f"SELECT user_id FROM requests WHERE country = '{SECRET_LITERAL}'")
        with pytest.raises(psycopg.Error):  # refused when parsed, before it is a query
            connection.execute(f"DELETE FROM requests WHERE country = '{SECRET_LITERAL}'")
    time.sleep(0.3)
    text = log.read_text()
    assert f"'{SECRET_LITERAL}'" not in text and "WHERE" not in text
    lines = [line for line in log_lines(log) if line["method"] == "PG"]
    answered = [line for line in lines if line["endpoint"] == "pg:query" and line["status"] == 200]
    assert answered and all(len(line["sql_sha256"]) == 64 for line in answered)
    last = answered[-1]
    assert last["analyst"] == "alice" and last["epsilon"] == pytest.approx(0.01)
    assert last["ledger_entry"] == charges(running)[-1]["seq"]
    refused = [line for line in lines if line.get("sqlstate") == "0A000"]
    assert [line["endpoint"] for line in refused[-2:]] == ["pg:query", "pg:statement"]
    assert all(line["status"] == 400 and line["analyst"] == "alice" for line in refused)


def test_cap_under_concurrent_clients(tmp_path: Path) -> None:
    running = serve(
        tmp_path, "--workers", "2", "--rate-limit", "100000", policy=CAPPED, postgres=True
    )
    outcomes: list[str] = []
    lock = threading.Lock()

    def client(token: str, user: str) -> None:
        with connect(running, token, user=user) as connection:
            connection.execute(f"SET dpsql.epsilon = {EPSILON}")
            for _ in range(8):
                try:
                    connection.execute(COUNT)
                    outcome = "answered"
                except psycopg.Error as error:
                    outcome = error.sqlstate or "?"
                with lock:
                    outcomes.append(outcome)

    try:
        threads = [
            threading.Thread(target=client, args=(token, user))
            for token, user in [(running.alice, "alice"), (running.bob, "bob")] * 4
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=180)
        assert Counter(outcomes) == {"answered": ADMITTED, "53400": 8 * 8 - ADMITTED}
        spent = charges(running)  # the chain verifies
        assert len(spent) == ADMITTED
        total = sum(e["epsilon_units"] for e in spent)
        assert total == Cost.cap(ADMITTED * EPSILON, 0).epsilon_units
    finally:
        stop(running.process)


def test_tls_is_required_with_a_certificate(tmp_path: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed (to make a test certificate)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    running = serve(
        tmp_path, "--pg-tls-cert", str(cert), "--pg-tls-key", str(key), postgres=True
    )
    try:
        with connect(
            running, running.alice, sslmode="verify-ca", sslrootcert=str(cert)
        ) as connection:
            assert connection.pgconn.ssl_in_use
            sql = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=0.01) COUNT(*) FROM requests"
            assert connection.execute(sql).fetchone()[0] > 0
        with pytest.raises(psycopg.OperationalError, match="TLS connections only"):
            connect(running, running.alice, sslmode="disable")
    finally:
        stop(running.process)
