"""The command line, end to end on the demo data: output formats, one-line errors, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dpsql.cli import main
from dpsql.engine.demo import DEMO_POLICY, build_demo


@pytest.fixture
def db(tmp_path: Path) -> str:
    database = build_demo(tmp_path / "d.duckdb", rows=5_000, users=500)
    (tmp_path / "policy.toml").write_text(DEMO_POLICY)
    assert (
        main(["policy", "set", "--db", str(database), "--file", str(tmp_path / "policy.toml")]) == 0
    )
    return str(database)


def test_query_json_layout(db: str, capsys) -> None:
    sql = "SELECT country, COUNT(*) AS n, AVG(latency_ms) AS l FROM requests GROUP BY country"
    assert (
        main(
            ["query", "--db", db, "--analyst", "alice", "--epsilon", "0.3", "--format", "json", sql]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["columns"] == ["country", "n", "l"]
    assert len(out["rows"]) == 5 and set(out["intervals"]) == {"n", "l"}
    assert out["epsilon_spent"] == 0.3 and out["delta_spent"] == 0.0
    assert out["mechanism"] == "discrete_laplace" and out["confidence"] == 0.95
    assert all(
        lo <= row[1] <= hi for row, (lo, hi) in zip(out["rows"], out["intervals"]["n"], strict=True)
    )


def test_query_table_and_csv(db: str, capsys) -> None:
    assert (
        main(
            [
                "query",
                "--db",
                db,
                "--analyst",
                "bob",
                "--epsilon",
                "0.5",
                "SELECT COUNT(*) AS n FROM requests",
            ]
        )
        == 0
    )
    assert "spent epsilon=0.5" in capsys.readouterr().out
    assert (
        main(
            [
                "query",
                "--db",
                db,
                "--analyst",
                "bob",
                "--format",
                "csv",
                "SELECT COUNT(*) AS n FROM requests",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "n,n_low,n_high" and len(lines) == 2


def test_budget_ledger_policy_and_explain(db: str, capsys) -> None:
    main(
        [
            "query",
            "--db",
            db,
            "--analyst",
            "alice",
            "--epsilon",
            "1",
            "SELECT COUNT(*) FROM requests",
        ]
    )
    capsys.readouterr()
    assert main(["budget", "--db", db, "--analyst", "alice", "--format", "json"]) == 0
    lines = json.loads(capsys.readouterr().out)["lines"]
    assert [(x["scope"], x["epsilon_spent"], x["epsilon_remaining"]) for x in lines] == [
        ("dataset", 1.0, 9.0),
        ("analyst", 1.0, 3.0),
    ]
    assert main(["ledger", "--db", db, "--format", "json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert [e["kind"] for e in entries] == ["policy", "charge"]
    assert main(["policy", "show", "--db", db]) == 0
    assert json.loads(capsys.readouterr().out)["tables"]["requests"]["privacy_unit"] == "user_id"
    assert (
        main(
            [
                "explain",
                "--db",
                db,
                "--analyst",
                "alice",
                "--epsilon",
                "0.2",
                "SELECT COUNT(*) FROM requests",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["cost"]["epsilon"] == 0.2
    assert main(["budget", "--db", db, "--format", "json"]) == 0
    assert (
        json.loads(capsys.readouterr().out)["lines"][1]["epsilon_spent"] == 1.0
    )  # explain is free


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--epsilon", "0.1", "SELECT COUNT(* FROM requests"], "malformed SQL"),
        (
            ["--epsilon", "0.1", "SELECT url, SUM(bytes) FROM requests GROUP BY url"],
            "single GROUP BY column with COUNT(*) only",
        ),
        (["--epsilon", "-1", "SELECT COUNT(*) FROM requests"], "epsilon must be > 0"),
        (["--epsilon", "nan", "SELECT COUNT(*) FROM requests"], "epsilon must be finite"),
        (
            ["--epsilon", "0.1", "--delta", "2", "SELECT COUNT(*) FROM requests"],
            "delta must be < 1",
        ),
        (["--epsilon", "50", "SELECT COUNT(*) FROM requests"], "budget exceeded"),
        (["--epsilon", "0.1", "DROP TABLE requests"], "only SELECT"),
    ],
)
def test_errors_are_one_line_on_stderr_and_charge_nothing(db: str, capsys, args, fragment) -> None:
    assert main(["query", "--db", db, "--analyst", "alice", *args]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("dpsql: error: ") and fragment in captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    main(["ledger", "--db", db, "--format", "json"])
    assert len(json.loads(capsys.readouterr().out)) == 1


def test_the_analyst_cannot_set_a_memory_limit(db: str, capsys) -> None:
    args = ["--epsilon", "0.1", "--memory-limit", "8MB", "SELECT COUNT(*) FROM requests"]
    assert main(["query", "--db", db, "--analyst", "alice", *args]) == 2
    assert "No such option '--memory-limit'" in capsys.readouterr().err
    main(["ledger", "--db", db, "--format", "json"])
    assert len(json.loads(capsys.readouterr().out)) == 1


def test_console_script_runs_the_demo(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dpsql.cli", "demo", "--dir", str(tmp_path), "--rows", "5000"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Requests per country" in done.stdout and "Privacy budget" in done.stdout
    assert "refused: MAX(bytes) is not released" in done.stdout
    assert "synopsis:requests_url_" in done.stdout
    missing = subprocess.run(
        [
            sys.executable,
            "-m",
            "dpsql.cli",
            "query",
            "--db",
            str(tmp_path / "no.duckdb"),
            "--analyst",
            "a",
            "SELECT 1",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_ledger_verify_names_the_first_tampered_entry(db: str, capsys) -> None:
    import sqlite3

    main(
        [
            "query",
            "--db",
            db,
            "--analyst",
            "alice",
            "--epsilon",
            "1",
            "SELECT COUNT(*) FROM requests",
        ]
    )
    assert main(["ledger", "verify", "--db", db]) == 0
    assert "2 entries, chain intact" in capsys.readouterr().out
    connection = sqlite3.connect(f"{db}.dpsql.sqlite")
    connection.execute("DROP TRIGGER entries_no_update")
    connection.execute("UPDATE entries SET epsilon_units = 1 WHERE seq = 2")
    connection.commit()
    connection.close()
    assert main(["ledger", "verify", "--db", db]) == 1
    assert "fails verification at entry 2" in capsys.readouterr().err
    assert main(["query", "--db", db, "--analyst", "alice", "SELECT COUNT(*) FROM requests"]) == 1
    assert "fails verification" in capsys.readouterr().err
