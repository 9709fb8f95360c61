"""The remote client and the CLI's --url/--token, against the real server."""

from __future__ import annotations

import json
import math

import pytest

import dpsql
from tests.serving.conftest import Server
from tests.serving.test_api import COUNT, run_cli


def test_remote_session_has_the_local_surface(server: Server) -> None:
    with dpsql.connect(server.url, token=server.alice) as db:
        assert isinstance(db, dpsql.RemoteSession)
        result = db.execute(
            "SELECT country, AVG(bytes) AS b FROM requests GROUP BY country", epsilon=0.2
        )
        assert isinstance(result, dpsql.QueryResult)
        assert result.analyst == "alice" and result.epsilon == 0.2
        assert math.isnan(result.noise_scale["b"])
        frame = result.to_pandas(intervals=True)
        assert list(frame.columns) == ["country", "b", "b_low", "b_high"] and len(frame) == 5
        report = db.explain(COUNT, epsilon=0.1)
        assert report["cost"]["epsilon"] == pytest.approx(0.1)
        budget = db.budget()
        assert isinstance(budget, dpsql.BudgetReport)
        assert budget.for_analyst("alice").epsilon_spent >= 0.2
        assert db.ledger()[-1]["seq"] == result.ledger_entry
        assert db.synopses() == []


def test_remote_synopsis_is_listed_and_answers_for_free(server: Server) -> None:
    with dpsql.connect(server.url, token=server.alice) as db:
        db.execute(
            "SELECT url, COUNT(*) AS n FROM requests GROUP BY url",
            epsilon=1,
            delta=1e-8,
            mechanism="alp",
        )
        (synopsis,) = db.synopses()
        assert synopsis["key_column"] == "url"
        free = db.execute("SELECT COUNT(*) AS n FROM requests WHERE url = '/home'")
        assert free.epsilon == 0 and free.mechanism.startswith("synopsis:")
    with dpsql.connect(server.url, token=server.bob) as other:  # share_synopses is off
        assert other.synopses() == []
        paid = other.execute("SELECT COUNT(*) AS n FROM requests WHERE url = '/home'", epsilon=0.1)
        assert paid.epsilon == 0.1 and not paid.mechanism.startswith("synopsis:")
    with dpsql.connect(server.url, token=server.auditor) as audit:
        assert [s["name"] for s in audit.synopses()] == [synopsis["name"]]


def test_remote_errors_are_the_local_classes(server: Server) -> None:
    with dpsql.connect(server.url, token=server.alice) as db:
        with pytest.raises(dpsql.SqlSyntaxError) as syntax:
            db.execute("SELEC 1")
        assert syntax.value.line == 1 and str(syntax.value).count("(line 1") == 1
        with pytest.raises(dpsql.UnsupportedQueryError):
            db.execute("SELECT MAX(bytes) FROM requests")
        with pytest.raises(dpsql.ParameterError, match="epsilon must be > 0"):
            db.execute(COUNT, epsilon=-1)
        with pytest.raises(dpsql.BudgetExceededError) as budget:
            db.execute(COUNT, epsilon=500)
        assert budget.value.requested == {"epsilon": 500.0, "delta": 0.0}
    with dpsql.connect(server.url, token=server.auditor) as audit:
        with pytest.raises(dpsql.AccessError) as forbidden:
            audit.execute(COUNT)
        assert forbidden.value.status == 403
        assert audit.verify()["verified"] is True
    with pytest.raises(dpsql.AccessError) as unknown, dpsql.connect(server.url, token="x") as bad:
        bad.budget()
    assert unknown.value.status == 401
    with pytest.raises(dpsql.AccessError, match="from the token"):
        dpsql.connect(server.url, analyst="bob", token=server.alice)


def test_dialect_is_read_as_locally(server: Server) -> None:
    sql = "SELECT COUNT(*) AS n FROM requests WHERE url = `x`"  # backticks quote in MySQL only
    duckdb_reader = dpsql.connect(server.url, token=server.alice)
    with duckdb_reader, pytest.raises(dpsql.SqlSyntaxError):
        duckdb_reader.explain(sql, epsilon=0.1)
    with dpsql.connect(server.url, token=server.alice, dialect="mysql") as mysql_reader:
        with pytest.raises(dpsql.UnsupportedQueryError, match="between two columns"):
            mysql_reader.explain(sql, epsilon=0.1)  # `x` is a column in MySQL
        mysql_reader.dialect = "nope"
        with pytest.raises(dpsql.ParameterError, match="unknown SQL dialect 'nope'"):
            mysql_reader.explain(COUNT, epsilon=0.1)
    answered = run_cli(
        "query",
        "--dialect",
        "mysql",
        "--format",
        "json",
        "--epsilon",
        "0.1",
        COUNT,
        DPSQL_URL=server.url,
        DPSQL_TOKEN=server.alice,
    )
    assert answered.returncode == 0, answered.stderr


def test_unreachable_service_is_a_service_error() -> None:
    with dpsql.connect("http://127.0.0.1:9", token="t") as db, pytest.raises(dpsql.ServiceError):
        db.budget()


def test_cli_url_and_token_replace_db_and_analyst(server: Server) -> None:
    answered = run_cli("query", "--url", server.url, "--token", server.alice, "--format", "json")
    assert answered.returncode == 2 and "Missing argument" in answered.stderr
    answered = run_cli(
        "query", "--url", server.url, "--token", server.alice, "--format", "json", COUNT
    )
    assert answered.returncode == 0, answered.stderr
    assert json.loads(answered.stdout)["analyst"] == "alice"
    by_env = run_cli("budget", "--format", "json", DPSQL_URL=server.url, DPSQL_TOKEN=server.bob)
    lines = json.loads(by_env.stdout)["lines"]
    assert [line["name"] for line in lines] == ["demo", "bob"]
    explained = run_cli(
        "explain", "--epsilon", "0.1", COUNT, DPSQL_URL=server.url, DPSQL_TOKEN=server.alice
    )
    assert json.loads(explained.stdout)["cost"]["epsilon"] == pytest.approx(0.1)
    ledger = run_cli("ledger", "--format", "csv", DPSQL_URL=server.url, DPSQL_TOKEN=server.bob)
    assert ledger.stdout.startswith("seq,time,kind,analyst")
    verified = run_cli("ledger", "verify", DPSQL_URL=server.url, DPSQL_TOKEN=server.auditor)
    assert "verified" in verified.stdout and verified.returncode == 0
    synopses = run_cli(
        "synopses", "--format", "json", DPSQL_URL=server.url, DPSQL_TOKEN=server.alice
    )
    assert isinstance(json.loads(synopses.stdout), list)


def test_cli_remote_errors_are_one_line(server: Server) -> None:
    refused = run_cli(
        "query", "SELECT MAX(bytes) FROM requests", DPSQL_URL=server.url, DPSQL_TOKEN=server.alice
    )
    assert refused.returncode == 1
    assert refused.stderr.startswith("dpsql: error: MAX(bytes) is not released")
    assert len(refused.stderr.strip().splitlines()) == 1
    forbidden = run_cli("ledger", "verify", DPSQL_URL=server.url, DPSQL_TOKEN=server.alice)
    assert forbidden.returncode == 1 and "auditor token" in forbidden.stderr
    no_token = run_cli("budget", "--url", server.url, DPSQL_TOKEN="")
    assert no_token.returncode == 2 and "--token" in no_token.stderr
    neither = run_cli("query", COUNT, DPSQL_URL="")
    assert neither.returncode == 2 and "Missing option '--db' (or --url/--token)" in neither.stderr
    both = run_cli("budget", "--db", str(server.database), "--url", server.url)
    assert both.returncode == 2 and "not both" in both.stderr
    impersonating = run_cli(
        "ledger", "--analyst", "bob", DPSQL_URL=server.url, DPSQL_TOKEN=server.alice
    )
    assert impersonating.returncode == 2 and "from the token" in impersonating.stderr


def test_accuracy_first_queries_go_through_the_service(server: Server) -> None:
    with dpsql.connect(server.url, token=server.alice) as db:
        shown = db.explain(COUNT, accuracy=80)
        result = db.execute(COUNT, accuracy=80)
    assert shown["plan"]["accuracy"]["target"] == 80
    assert result.epsilon == shown["cost"]["epsilon"]
    assert result.details["accuracy"]["expected_error"] == shown["expected_error"]
