"""End-to-end tests of the HTTP API against the real server (a ``dpsql serve`` subprocess)."""

from __future__ import annotations

import csv
import io
import json
import os
import sqlite3
import subprocess
import sys

import httpx
import pytest

from dpsql.engine.session import ledger_path
from tests.serving.conftest import Server, serve, stop

COUNT = "SELECT COUNT(*) AS n FROM requests"
PROBLEM = "application/problem+json"


def run_cli(*arguments: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``dpsql ARGUMENTS`` in a subprocess, as an administrator or analyst would run it."""
    return subprocess.run(
        [sys.executable, "-m", "dpsql.cli", *arguments],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )


def charges(server: Server) -> list[dict]:
    return [e for e in server.entries() if e["kind"] == "charge"]


def assert_problem(response: httpx.Response, status: int, kind: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    document = response.json()
    assert document["type"] == f"urn:dpsql:problem:{kind}"
    assert document["status"] == status
    assert "Traceback" not in response.text
    return document


def test_health_openapi_and_docs(server: Server) -> None:
    health = server.call("GET", "/v1/health", None)
    assert health.json()["status"] == "ok"
    assert "server" not in health.headers  # no software banner
    document = server.call("GET", "/openapi.json", None).json()
    paths = document["paths"]
    for path in ("/v1/query", "/v1/explain", "/v1/budget", "/v1/ledger", "/v1/ledger/verify"):
        assert path in paths
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    secured = {
        path
        for path, operations in paths.items()
        for operation in operations.values()
        if operation.get("security") == [{"bearer": []}]
    }
    assert secured == set(paths) - {"/v1/health"}
    # Endpoints read their body and parameters themselves; the document still states them.
    for path in ("/v1/query", "/v1/explain"):
        body = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": "#/components/schemas/QueryRequest"}
    request_schema = document["components"]["schemas"]["QueryRequest"]
    assert request_schema["required"] == ["sql"] and request_schema["additionalProperties"] is False
    for path, method in (("/v1/query", "post"), ("/v1/ledger", "get")):
        (parameter,) = paths[path][method]["parameters"]
        assert parameter["name"] == "format" and parameter["schema"]["enum"] == ["json", "csv"]
    assert "swagger" in server.call("GET", "/docs", None).text.lower()
    console = server.call("GET", "/", None)
    assert "<title>dpsql console</title>" in console.text
    assert console.headers["content-security-policy"] == "default-src 'self'"
    assert server.call("GET", "/console/console.js", None).status_code == 200
    assert assert_problem(server.call("GET", "/v1/nothing", None), 404, "not-found")


def test_query_answers_like_the_cli_and_charges_once(server: Server) -> None:
    before = server.call("GET", "/v1/budget", server.alice).json()["lines"]
    response = server.query(
        server.alice,
        {"sql": "SELECT country, COUNT(*) AS n FROM requests GROUP BY country", "epsilon": 0.25},
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert set(answer) == {
        "columns",
        "rows",
        "intervals",
        "confidence",
        "noise_scale",
        "epsilon_spent",
        "delta_spent",
        "mechanism",
        "analyst",
        "ledger_entry",
        "details",
        "measures",
    }
    assert answer["columns"] == ["country", "n"]
    assert [row[0] for row in answer["rows"]] == ["DK", "NO", "SE", "FI", "IS"]
    assert answer["analyst"] == "alice" and answer["epsilon_spent"] == 0.25
    entry = charges(server)[-1]
    assert entry["seq"] == answer["ledger_entry"] and entry["analyst"] == "alice"
    # The entry records who acted: the server's OS user and the id of alice's token.
    assert entry["actor"]["os_user"] and f"_{entry['actor']['token']}_" in server.alice
    after = server.call("GET", "/v1/budget", server.alice).json()["lines"]
    assert after[1]["epsilon_spent"] == pytest.approx(before[1]["epsilon_spent"] + 0.25)


def test_avg_noise_scale_is_null_not_nan(server: Server) -> None:
    response = server.query(server.alice, {"sql": "SELECT AVG(bytes) AS b FROM requests"})
    assert response.status_code == 200
    assert "NaN" not in response.text
    assert response.json()["noise_scale"] == {"b": None}


def test_csv_answers_and_ledger(server: Server) -> None:
    by_header = server.query(
        server.alice, {"sql": COUNT, "epsilon": 0.1}, headers={"Accept": "text/csv"}
    )
    assert by_header.headers["content-type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(by_header.text)))
    assert rows[0] == ["n", "n_low", "n_high"] and len(rows) == 2
    low, value, high = float(rows[1][1]), float(rows[1][0]), float(rows[1][2])
    assert low <= value <= high
    by_parameter = server.call(
        "POST", "/v1/query?format=csv", server.alice, json={"sql": COUNT, "epsilon": 0.1}
    )
    assert by_parameter.text.splitlines()[0] == "n,n_low,n_high"
    ledger = server.call("GET", "/v1/ledger?format=csv", server.alice).text.splitlines()
    assert ledger[0] == "seq,time,kind,analyst,os_user,epsilon,delta,mechanism,query"
    assert all(",charge,alice," in line for line in ledger[1:])


def test_explain_prices_without_charging(server: Server) -> None:
    before = len(server.entries())
    report = server.call(
        "POST", "/v1/explain", server.alice, json={"sql": COUNT, "epsilon": 0.3}
    ).json()
    assert report["cost"]["epsilon"] == pytest.approx(0.3)
    assert [line["scope"] for line in report["draws_on"]] == ["dataset", "analyst"]
    assert len(server.entries()) == before


def test_analyst_reads_only_own_entries_auditor_reads_all(server: Server) -> None:
    assert server.query(server.bob, {"sql": COUNT, "epsilon": 0.1}).status_code == 200
    assert server.query(server.alice, {"sql": COUNT, "epsilon": 0.1}).status_code == 200
    bob = server.call("GET", "/v1/ledger", server.bob).json()
    assert bob and {e["analyst"] for e in bob} == {"bob"} and {e["kind"] for e in bob} == {"charge"}
    everything = server.call("GET", "/v1/ledger", server.auditor).json()
    assert {"alice", "bob"} <= {e["analyst"] for e in everything}
    assert {"policy", "token", "charge"} <= {e["kind"] for e in everything}
    budget = server.call("GET", "/v1/budget", server.bob).json()["lines"]
    assert [(line["scope"], line["name"]) for line in budget] == [
        ("dataset", "demo"),
        ("analyst", "bob"),
    ]
    audited = server.call("GET", "/v1/budget", server.auditor).json()["lines"]
    assert {line["name"] for line in audited if line["scope"] == "analyst"} == {"alice", "bob"}


def test_roles(server: Server) -> None:
    assert_problem(server.query(server.auditor, {"sql": COUNT}), 403, "forbidden")
    assert_problem(
        server.call("POST", "/v1/explain", server.auditor, json={"sql": COUNT}), 403, "forbidden"
    )
    assert_problem(server.call("GET", "/v1/ledger/verify", server.alice), 403, "forbidden")
    verified = server.call("GET", "/v1/ledger/verify", server.auditor).json()
    assert verified["verified"] is True and verified["entries"] == len(server.entries())
    assert server.call("GET", "/v1/me", server.auditor).json() == {
        "name": "carol",
        "role": "auditor",
    }


def test_identity_comes_from_the_token_only(server: Server) -> None:
    before = len(server.entries())
    for field in ("analyst", "seed", "rng", "memory_limit"):
        response = server.query(server.alice, {"sql": COUNT, "epsilon": 0.1, field: "bob"})
        assert field in assert_problem(response, 400, "parameter")["detail"]
    assert len(server.entries()) == before


@pytest.mark.parametrize(
    ("body", "status", "kind", "message"),
    [
        ({"sql": "SELEC COUNT(*) FROM requests"}, 400, "sql-syntax", "malformed SQL"),
        ({"sql": "SELECT MAX(bytes) FROM requests"}, 400, "unsupported-query", "MAX(bytes)"),
        ({"sql": "SELECT COUNT(*) FROM nowhere"}, 400, "schema", "nowhere"),
        ({"sql": COUNT, "epsilon": -1}, 400, "parameter", "epsilon must be > 0, got -1.0"),
        ({"sql": COUNT, "epsilon": "a lot"}, 400, "parameter", "epsilon"),
        ({"sql": COUNT, "epsilon": True}, 400, "parameter", "epsilon: Input should be a valid"),
        ({"sql": COUNT, "epsilon": "0.5"}, 400, "parameter", "epsilon: Input should be a valid"),
        ({"sql": COUNT, "max_answers": 2.0}, 400, "parameter", "max_answers"),
        ({"sql": COUNT, "mechanism": "magic"}, 400, "parameter", "mechanism"),
        ({"sql": ""}, 400, "parameter", "sql"),
        ({"sql": COUNT, "epsilon": 500}, 409, "budget-exceeded", "budget exceeded"),
        (
            {"sql": "SELECT COUNT(*) FROM requests WHERE url = '" + "x" * 2100 + "'"},
            413,
            "too-large",
            "limit is 2000",
        ),
    ],
)
def test_refusals_are_problems_and_charge_nothing(
    server: Server, body: dict, status: int, kind: str, message: str
) -> None:
    before = len(server.entries())
    document = assert_problem(server.query(server.alice, body), status, kind)
    assert message in document["detail"]
    assert len(server.entries()) == before


def test_bodies_must_be_json_objects_and_formats_known(server: Server) -> None:
    before = len(server.entries())
    as_text = server.call(
        "POST",
        "/v1/query",
        server.alice,
        content=json.dumps({"sql": COUNT}),
        headers={"Content-Type": "text/plain"},
    )
    assert "Content-Type: application/json" in assert_problem(as_text, 400, "parameter")["detail"]
    for content in ("", "[1]", "{"):
        response = server.call(
            "POST",
            "/v1/explain",
            server.alice,
            content=content,
            headers={"Content-Type": "application/json"},
        )
        assert assert_problem(response, 400, "parameter")["detail"]
    unknown = server.query(server.alice, {"sql": COUNT}, params={"format": "xml"})
    assert "format" in assert_problem(unknown, 400, "parameter")["detail"]
    assert len(server.entries()) == before


def test_messages_match_the_cli(server: Server) -> None:
    sql = "SELECT COUNT(*) FROM requests WHERE"
    document = server.query(server.alice, {"sql": sql}).json()
    cli = run_cli("query", "--db", str(server.database), "--analyst", "alice", sql)
    assert cli.stderr.strip() == f"dpsql: error: {document['detail']}"
    assert document["line"] == 1 and f"column {document['column']})" in document["detail"]


def test_budget_refusal_says_requested_and_remaining(server: Server) -> None:
    document = server.query(server.alice, {"sql": COUNT, "epsilon": 500}).json()
    assert document["requested"] == {"epsilon": 500.0, "delta": 0.0}
    assert 0 < document["remaining"]["epsilon"] <= 10


def test_tokens_missing_invalid_and_revoked(server: Server) -> None:
    missing = server.query(None, {"sql": COUNT})  # type: ignore[arg-type]
    assert assert_problem(missing, 401, "unauthorized")["detail"].startswith("missing token")
    assert missing.headers["www-authenticate"] == "Bearer"
    assert_problem(server.query("dpsql_0_guess", {"sql": COUNT}), 401, "unauthorized")
    created = run_cli("token", "create", "--db", str(server.database), "--analyst", "alice")
    token = created.stdout.strip()
    assert server.call("GET", "/v1/me", token).json() == {"name": "alice", "role": "analyst"}
    token_id = token.split("_")[1]
    listed = run_cli("token", "list", "--db", str(server.database), "--format", "json").stdout
    assert {"id": token_id, "name": "alice", "role": "analyst"}.items() <= json.loads(listed)[
        -1
    ].items()
    assert token not in listed
    assert run_cli("token", "revoke", "--db", str(server.database), token_id).returncode == 0
    assert_problem(server.call("GET", "/v1/me", token), 401, "unauthorized")
    assert_problem(server.query(token, {"sql": COUNT}), 401, "unauthorized")


def test_body_too_large_whether_declared_or_streamed(server: Server) -> None:
    big = b'{"sql": "' + b"x" * 5000 + b'"}'
    declared = server.call(
        "POST", "/v1/query", server.alice, content=big, headers={"content-type": "application/json"}
    )
    assert "4096 bytes" in assert_problem(declared, 413, "too-large")["detail"]

    def chunks():
        for start in range(0, len(big), 1000):
            yield big[start : start + 1000]

    streamed = server.call(
        "POST",
        "/v1/query",
        server.alice,
        content=chunks(),
        headers={"content-type": "application/json"},
    )
    assert_problem(streamed, 413, "too-large")


def test_rate_limit_per_token_across_workers(tmp_path) -> None:
    limited = serve(tmp_path, "--rate-limit", "3", "--workers", "2")
    try:
        statuses = [limited.call("GET", "/v1/me", limited.alice) for _ in range(4)]  # new
        # connection each time: the kernel spreads them over both workers, which share buckets
        assert [r.status_code for r in statuses] == [200, 200, 200, 429]
        assert int(statuses[-1].headers["retry-after"]) >= 1
        assert_problem(statuses[-1], 429, "rate-limited")
        assert limited.call("GET", "/v1/me", limited.bob).status_code == 200  # its own bucket
    finally:
        stop(limited.process)


def test_timeout_is_one_data_independent_error(tmp_path) -> None:
    slow = serve(tmp_path, "--query-timeout", "0.001")
    try:
        response = slow.query(slow.alice, {"sql": COUNT, "epsilon": 0.1})
        document = assert_problem(response, 504, "timeout")
        assert document["detail"] == (
            "the request did not finish within the time limit of 0.001 s; "
            "a query that was charged stays charged"
        )
        assert len(charges(slow)) <= 1  # charged before the limit or not at all; never answered
        assert slow.call("GET", "/v1/health", None).status_code == 200
    finally:
        stop(slow.process)


def test_an_edited_ledger_stops_the_service(tmp_path) -> None:
    served = serve(tmp_path, "--verify-every", "0")
    try:
        assert served.query(served.alice, {"sql": COUNT, "epsilon": 0.1}).status_code == 200
        connection = sqlite3.connect(ledger_path(served.database))
        connection.execute("DROP TRIGGER entries_no_update")
        connection.execute("UPDATE entries SET epsilon_units = 1 WHERE kind = 'charge'")
        connection.commit()
        connection.close()
        refused = served.query(served.alice, {"sql": COUNT, "epsilon": 0.1})
        assert "fails verification" in assert_problem(refused, 503, "ledger")["detail"]
        verified = served.call("GET", "/v1/ledger/verify", served.auditor).json()
        assert verified["verified"] is False and "fails verification" in verified["detail"]
    finally:
        stop(served.process)
