"""Schema discovery and stored answers over the service, against the real server: the HTTP API,
the remote client and the CLI's ``--url``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

import dpsql
from dpsql.engine.demo import DEMO_POLICY
from dpsql.engine.report import run_report
from dpsql.engine.report_spec import parse_report_spec
from dpsql.engine.session import connect, database_result
from tests.serving.conftest import Server, start, stop
from tests.serving.test_api import assert_problem, charges, run_cli

POLICY = (
    DEMO_POLICY
    + """
[tables.requests.columns.age]
key_domain = [0, 120]

[public_tables.age_bands]
description = "ten-year bands"
"""
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The demo with a public table, and a table outside the policy (``salaries``)."""
    directory = tmp_path_factory.mktemp("schema")
    database = directory / "demo.duckdb"
    from dpsql.engine.demo import build_demo
    from dpsql.engine.session import set_policy
    from dpsql.serving.tokens import TokenStore

    build_demo(database, rows=5_000, users=500)
    with duckdb.connect(str(database)) as connection:
        connection.execute("CREATE TABLE age_bands (low INTEGER, high INTEGER)")
        connection.execute("INSERT INTO age_bands VALUES (0, 9), (10, 19)")
        connection.execute("CREATE TABLE salaries (user_id BIGINT, salary_secret DOUBLE)")
    set_policy(database, POLICY)
    with TokenStore(database) as store:
        alice, _ = store.create("alice")
        bob, _ = store.create("bob")
        auditor, _ = store.create("carol", "auditor")
    url, process = start(database)
    try:
        yield Server(url, database, alice, bob, auditor, process)
    finally:
        stop(process)


def test_schema_shows_the_policy_tables_and_nothing_else(server: Server) -> None:
    response = server.call("GET", "/v1/schema", server.alice)
    assert response.status_code == 200, response.text
    schema = response.json()
    assert "salaries" not in response.text and "salary_secret" not in response.text
    assert [t["name"] for t in schema["tables"]] == ["requests"]
    requests = schema["tables"][0]
    assert requests["privacy_unit"] == "user_id"
    assert (requests["max_groups_per_unit"], requests["max_rows_per_unit"]) == (5, 20)
    columns = {c["name"]: c for c in requests["columns"]}
    assert columns["bytes"]["type"] == "BIGINT" and columns["bytes"]["bounds"] == [0, 100000]
    assert columns["country"]["public_keys"] == ["DK", "NO", "SE", "FI", "IS"]
    assert columns["status"]["public_keys"] == [200, 301, 404, 500]
    assert columns["age"]["key_domain"] == [0, 120]
    assert columns["day"]["type"] == "DATE"
    assert schema["public_tables"] == [
        {
            "name": "age_bands",
            "description": "ten-year bands",
            "columns": [{"name": "low", "type": "INTEGER"}, {"name": "high", "type": "INTEGER"}],
        }
    ]
    assert schema["dataset"]["default_query_epsilon"] == 0.5
    assert schema["dataset"]["name"] == "demo"
    assert schema["example_query"] == "SELECT country, COUNT(*) AS n FROM requests GROUP BY country"
    # the caller's budget lines, no other analyst's; the policy's allocations are not listed
    assert [(b["scope"], b["name"]) for b in schema["budget"]] == [
        ("dataset", "demo"),
        ("analyst", "alice"),
    ]
    assert "bob" not in response.text
    # what it describes is what a query accepts
    with dpsql.connect(server.url, token=server.alice) as session:
        assert session.schema() == schema
        session.explain(schema["example_query"])


def test_schema_is_the_local_sessions(server: Server) -> None:
    served = server.call("GET", "/v1/schema", server.bob).json()
    with connect(server.database, analyst="bob") as session:
        assert session.schema() == served


def test_schema_for_auditors_refusals_and_openapi(server: Server) -> None:
    audited = server.call("GET", "/v1/schema", server.auditor)
    assert audited.status_code == 200
    assert [b["scope"] for b in audited.json()["budget"]] == ["dataset"]
    assert [t["name"] for t in audited.json()["tables"]] == ["requests"]
    assert_problem(server.call("GET", "/v1/schema", None), 401, "unauthorized")
    assert_problem(server.call("GET", "/v1/schema", "dpsql_nope_nope"), 401, "unauthorized")
    document = server.call("GET", "/openapi.json", None).json()
    operation = document["paths"]["/v1/schema"]["get"]
    assert operation["security"] == [{"bearer": []}]
    assert operation["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/SchemaResponse"
    }
    assert "SchemaTable" in document["components"]["schemas"]
    seq = document["paths"]["/v1/results/{seq}"]["get"]["parameters"][0]
    assert seq["name"] == "seq" and seq["in"] == "path"


def test_paying_analyst_reads_an_answer_again_for_free(server: Server) -> None:
    with dpsql.connect(server.url, token=server.alice) as alice:
        paid = alice.execute("SELECT COUNT(*) AS n FROM requests", epsilon=0.1)
        before = len(server.entries())
        again = alice.result(paid.ledger_entry)
        assert again.rows == paid.rows and again.intervals == paid.intervals
        csv_text = server.call(
            "GET", f"/v1/results/{paid.ledger_entry}?format=csv", server.alice
        ).text
        assert csv_text.splitlines()[0] == "n,n_low,n_high"
        assert len(server.entries()) == before  # nothing charged, no new entry
        with pytest.raises(dpsql.ParameterError):
            alice.result(0)
    absent = server.call("GET", "/v1/results/99999", server.bob)
    theirs = server.call("GET", f"/v1/results/{paid.ledger_entry}", server.bob)
    for response, seq in ((absent, 99999), (theirs, paid.ledger_entry)):
        document = assert_problem(response, 404, "not-found")
        assert document["detail"] == f"ledger entry {seq} has no stored answer of yours"
    with dpsql.connect(server.url, token=server.bob) as bob, pytest.raises(dpsql.ServiceError):
        bob.result(paid.ledger_entry)
    assert_problem(
        server.call("GET", f"/v1/results/{paid.ledger_entry}", server.auditor), 403, "forbidden"
    )
    assert_problem(server.call("GET", "/v1/results/x1", server.alice), 400, "parameter")
    assert_problem(server.call("GET", "/v1/results/1", None), 401, "unauthorized")
    assert len(server.entries()) == before


def test_cli_schema_and_result_over_the_service(server: Server, tmp_path: Path) -> None:
    shown = run_cli("schema", "--url", server.url, "--token", server.alice)
    assert shown.returncode == 0, shown.stderr
    assert "requests: privacy unit user_id" in shown.stdout
    assert "age_bands (public): ten-year bands" in shown.stdout
    assert "salaries" not in shown.stdout
    as_json = run_cli("schema", "--format", "json", DPSQL_URL=server.url, DPSQL_TOKEN=server.bob)
    assert json.loads(as_json.stdout)["budget"][1]["name"] == "bob"
    local = run_cli("schema", "--db", str(server.database), "--analyst", "bob", "--format", "json")
    assert json.loads(local.stdout) == json.loads(as_json.stdout)
    both = run_cli("schema", "--url", server.url, "--token", server.bob, "--analyst", "bob")
    assert both.returncode == 2 and "takes the analyst from the token" in both.stderr

    paid = run_cli(
        "query", "--url", server.url, "--token", server.bob, "--format", "json", "--epsilon",
        "0.1", "SELECT COUNT(*) AS n FROM requests",
    )  # fmt: skip
    seq = json.loads(paid.stdout)["ledger_entry"]
    count = len(charges(server))
    fetched = run_cli("result", str(seq), "--format", "json", "--url", server.url, "--token",
                      server.bob)  # fmt: skip
    assert fetched.returncode == 0, fetched.stderr
    assert json.loads(fetched.stdout)["rows"] == json.loads(paid.stdout)["rows"]
    refused = run_cli("result", str(seq), "--url", server.url, "--token", server.alice)
    assert refused.returncode == 1
    assert (
        refused.stderr.strip() == f"dpsql: error: ledger entry {seq} has no stored answer of yours"
    )
    assert len(charges(server)) == count


REPORT = """
title = "Traffic"
epsilon = 0.2

[queries.by_country]
sql = "SELECT country, COUNT(*) AS n FROM requests GROUP BY country"

[queries.total]
sql = "SELECT COUNT(*) AS n FROM requests"
"""


def test_a_reports_answers_are_fetched_by_entry_and_query_name(
    server: Server, tmp_path: Path
) -> None:
    with connect(server.database, analyst="alice") as session:
        done = run_report(session, parse_report_spec(REPORT), tmp_path / "report")
    seq = done.ledger_entry["seq"]
    document = json.loads((tmp_path / "report" / "results.json").read_text())
    assert document["stored_results"]["total"] == {
        "ledger_entry": seq,
        "query": "total",
        "cli": f"dpsql result {seq} --query total",
        "http": f"/v1/results/{seq}?query=total",
    }
    before = len(server.entries())
    with dpsql.connect(server.url, token=server.alice) as alice:
        for name, answer in done.results.items():
            again = alice.result(seq, name)
            assert again.rows == answer.rows and again.ledger_entry == seq
        http = server.call("GET", document["stored_results"]["total"]["http"], server.alice)
        assert http.json()["rows"] == document["results"]["total"]["rows"]
    unnamed = server.call("GET", f"/v1/results/{seq}", server.alice)
    unnamed = assert_problem(unnamed, 400, "parameter")
    assert "by_country, total" in unnamed["detail"]
    unknown = server.call("GET", f"/v1/results/{seq}?query=nope", server.alice)
    theirs = server.call("GET", f"/v1/results/{seq}?query=total", server.bob)
    bare = server.call("GET", f"/v1/results/{seq}", server.bob)  # names no query of alice's
    for response in (unknown, theirs, bare):
        assert_problem(response, 404, "not-found")
    assert database_result(server.database, seq, query="by_country").rows == (
        done.results["by_country"].rows
    )
    for where in (("--url", server.url, "--token", server.alice), ("--db", str(server.database))):
        printed = run_cli("result", str(seq), "--query", "total", "--format", "json", *where)
        assert printed.returncode == 0, printed.stderr
        assert json.loads(printed.stdout)["rows"] == document["results"]["total"]["rows"]
    assert len(server.entries()) == before  # nothing charged again
