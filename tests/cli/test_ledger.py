"""``dpsql policy``, ``budget`` and ``ledger [verify|head]``: the views of what was spent, the
hash chain's check, both orders of ``--db``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dpsql.cli import main
from dpsql.engine.session import ledger_path


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


def test_ledger_db_before_or_after_the_subcommand_and_head_check(db: str, capsys) -> None:
    assert main(["ledger", "--db", db, "verify"]) == 0
    assert main(["ledger", "verify", "--db", db]) == 0
    capsys.readouterr()
    copy = Path(f"{ledger_path(db)}.copy")
    shutil.copy(ledger_path(db), copy)
    sql = "SELECT COUNT(*) FROM requests"
    assert main(["query", "--db", db, "--analyst", "alice", sql]) == 0
    capsys.readouterr()
    assert main(["ledger", "head", "--db", db]) == 0
    head = capsys.readouterr().out.strip()
    assert len(head) == 64
    assert main(["ledger", "--db", db, "verify", "--expect", head]) == 0
    # The newest entry deleted (the ledger put back as it was before the query): the chain
    # alone is intact, the recorded head is not in it.
    shutil.copy(copy, ledger_path(db))
    assert main(["ledger", "verify", "--db", db]) == 0
    capsys.readouterr()
    assert main(["ledger", "verify", "--db", db, "--expect", head]) == 1
    assert "not in the ledger" in capsys.readouterr().err


@pytest.mark.parametrize("order", ["before", "after"])
def test_ledger_without_db_is_a_usage_error(order: str, capsys) -> None:
    argv = ["ledger", "verify"] if order == "after" else ["ledger", "head"]
    assert main(argv) == 2
    assert "Missing option '--db'" in capsys.readouterr().err


def test_every_entry_records_the_operating_system_user(db: str, capsys) -> None:
    import getpass

    assert main(["query", "--db", db, "--analyst", "alice", "SELECT COUNT(*) FROM requests"]) == 0
    capsys.readouterr()
    assert main(["ledger", "--db", db, "--format", "json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert [e["kind"] for e in entries] == ["policy", "charge"]
    assert all(e["os_user"] == getpass.getuser() for e in entries)
    assert all(e["actor"] == {"os_user": getpass.getuser()} for e in entries)
