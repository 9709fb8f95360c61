"""``dpsql ledger backup`` while another process charges, and ``ledger verify --file --head``."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from dpsql.accountant.ledger import Ledger
from dpsql.cli import main
from dpsql.engine.session import database_ledger

CHARGER = """
import sys
from dpsql.engine.session import connect
with connect(sys.argv[1], analyst="alice") as session:
    for _ in range(int(sys.argv[2])):
        result = session.execute("SELECT COUNT(*) AS n FROM requests", epsilon=0.01)
        print(result.ledger_entry, flush=True)  # committed: the charge precedes the answer
"""


def backed_up(path: Path) -> list[int]:
    copy = Ledger(path, dataset="d", read_only=True)  # verifies the chain
    try:
        return [entry.seq for entry in copy.entries()]
    finally:
        copy.close()


def test_a_backup_taken_while_charging_holds_every_committed_entry(
    db: str, tmp_path: Path, capsys
) -> None:
    charger = subprocess.Popen(
        [sys.executable, "-c", CHARGER, db, "60"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert charger.stdout is not None
    backups = []
    for line in charger.stdout:
        committed = int(line)
        if committed % 6 == 0:  # mid-run, while the other process keeps charging
            target = tmp_path / f"ledger-{committed}.sqlite"
            assert main(["ledger", "backup", "--db", db, "--out", str(target)]) == 0
            backups.append((committed, target))
    assert charger.wait(timeout=120) == 0
    assert len(backups) == 10
    final = [entry["seq"] for entry in database_ledger(db)]
    for committed, target in backups:
        seqs = backed_up(target)
        assert committed in seqs  # every entry committed before the backup began
        assert seqs == final[: len(seqs)]  # a prefix of the ledger: one consistent snapshot
        assert not Path(f"{target}-wal").exists()  # one self-contained file
    last = tmp_path / "final.sqlite"
    assert main(["ledger", "backup", "--db", db, "--out", str(last)]) == 0
    assert backed_up(last) == final
    head = database_ledger(db)[-1]["hash"]
    assert f"head {head}" in capsys.readouterr().out

    before = hashlib.sha256(last.read_bytes()).hexdigest()
    assert main(["ledger", "verify", "--file", str(last), "--head", head]) == 0
    assert hashlib.sha256(last.read_bytes()).hexdigest() == before  # verifying changes nothing
    assert f"{len(final)} entries, chain intact" in capsys.readouterr().out
    older = backups[0][1]
    assert main(["ledger", "verify", "--file", str(older), "--head", head]) == 1
    assert "does not end at" in capsys.readouterr().err
    assert main(["ledger", "verify", "--file", str(older), "--expect", head]) == 1


def test_backup_refusals(db: str, tmp_path: Path, capsys) -> None:
    target = tmp_path / "copy.sqlite"
    target.write_text("keep me")
    assert main(["ledger", "backup", "--db", db, "--out", str(target)]) == 1
    assert "exists; give a new file" in capsys.readouterr().err
    assert target.read_text() == "keep me"
    assert main(["ledger", "verify", "--file", str(tmp_path / "none.sqlite")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["ledger", "verify", "--file", str(target)]) == 1
    assert "is unreadable" in capsys.readouterr().err
    assert main(["ledger", "verify", "--db", db, "--file", str(target)]) == 2
