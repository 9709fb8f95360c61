"""The command line's small promises from issue 17: valid JSON, both option orders for the ledger,
the newest hash and its check, a clear message for a locked database, the bounds helper."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpsql.cli import main
from dpsql.engine.session import ledger_path
from tests.test_cli import db  # noqa: F401 - the demo database fixture


def _strict_json(text: str) -> dict:
    def refuse(constant: str) -> None:
        raise ValueError(f"invalid JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


def test_json_output_is_valid_json_with_null_for_avg_noise_scale(db: str, capsys) -> None:  # noqa: F811
    sql = "SELECT country, AVG(latency_ms) AS l FROM requests GROUP BY country"
    assert main(["query", "--db", db, "--analyst", "alice", "--format", "json", sql]) == 0
    out = _strict_json(capsys.readouterr().out)
    assert out["noise_scale"] == {"l": None}
    assert out["measures"]["l"].startswith("mean of latency_ms clamped to [0, 2000]")
    # IS has no rows: its mean is the middle of the bounds, its interval all of them.
    iceland = out["columns"].index("l"), [r[0] for r in out["rows"]].index("IS")
    assert out["intervals"]["l"][iceland[1]] == [0, 2000]
    assert out["rows"][iceland[1]][1] == 1000


def test_ledger_db_before_or_after_the_subcommand_and_head_check(db: str, capsys) -> None:  # noqa: F811
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


def test_a_database_locked_by_another_process_gets_a_clear_message(db: str, capsys) -> None:  # noqa: F811
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import duckdb, time; c = duckdb.connect({db!r}); print('ready', flush=True); "
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        sql = "SELECT COUNT(*) FROM requests"
        assert main(["query", "--db", db, "--analyst", "alice", sql]) == 1
        err = capsys.readouterr().err
        assert "another process has it open for writing" in err and "IOException" not in err
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    assert main(["ledger", "--db", db, "--analyst", "alice"]) == 0
    assert "SELECT COUNT" not in capsys.readouterr().out  # nothing was charged


def test_contributions_command_prints_suggested_bounds(db: str, capsys) -> None:  # noqa: F811
    args = ["contributions", "--db", db, "--analyst", "alice", "--table", "requests"]
    assert main([*args, "--group-by", "country", "--suggest"]) == 0
    out = capsys.readouterr().out
    assert "suggested max_groups_per_unit" in out and "spent epsilon=0.1" in out


@pytest.mark.parametrize("order", ["before", "after"])
def test_ledger_without_db_is_a_usage_error(order: str, capsys) -> None:
    argv = ["ledger", "verify"] if order == "after" else ["ledger", "head"]
    assert main(argv) == 2
    assert "Missing option '--db'" in capsys.readouterr().err


def test_a_released_answer_is_fetched_again_for_free_by_its_analyst_only(
    db: str,  # noqa: F811
    capsys,
) -> None:
    sql = "SELECT country, COUNT(*) AS n FROM requests GROUP BY country"
    assert main(["query", "--db", db, "--analyst", "alice", "--format", "json", sql]) == 0
    first = _strict_json(capsys.readouterr().out)
    seq = first["ledger_entry"]
    assert main(["budget", "--db", db, "--format", "json"]) == 0
    spent = json.loads(capsys.readouterr().out)["lines"][0]["epsilon_spent"]
    assert main(["result", "--db", db, "--analyst", "alice", "--format", "json", str(seq)]) == 0
    assert _strict_json(capsys.readouterr().out) == first
    assert main(["result", "--db", db, "--format", "json", str(seq)]) == 0  # administrator
    assert _strict_json(capsys.readouterr().out) == first
    assert main(["result", "--db", db, "--analyst", "bob", str(seq)]) == 1
    assert f"ledger entry {seq} has no stored answer of analyst 'bob'" in capsys.readouterr().err
    assert main(["budget", "--db", db, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["lines"][0]["epsilon_spent"] == spent


def test_every_entry_records_the_operating_system_user(db: str, capsys) -> None:  # noqa: F811
    import getpass

    assert main(["query", "--db", db, "--analyst", "alice", "SELECT COUNT(*) FROM requests"]) == 0
    capsys.readouterr()
    assert main(["ledger", "--db", db, "--format", "json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert [e["kind"] for e in entries] == ["policy", "charge"]
    assert all(e["os_user"] == getpass.getuser() for e in entries)
    assert all(e["actor"] == {"os_user": getpass.getuser()} for e in entries)
