"""Tokens: shown once, stored as a hash, recorded in the ledger, revocable."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from dpsql.accountant.ledger import Ledger
from dpsql.engine.session import database_ledger, ledger_path
from dpsql.errors import ParameterError, PolicyError
from dpsql.serving.tokens import TokenStore
from tests.serving.conftest import demo_database


@pytest.fixture
def database(tmp_path: Path) -> Path:
    return demo_database(tmp_path)


def test_only_a_hash_is_stored_and_creation_is_recorded(database: Path) -> None:
    with TokenStore(database) as store:
        token, record = store.create("alice")
        assert token.startswith(f"dpsql_{record.id}_") and len(token) > 50
        assert store.authenticate(token).name == "alice"
        assert store.authenticate(token + "x") is None
        assert store.authenticate("not a token") is None
    assert token.encode() not in ledger_path(database).read_bytes()
    (entry,) = [e for e in database_ledger(database) if e["kind"] == "token"]
    assert entry["analyst"] == "alice"
    assert entry["payload"] == {"action": "create", "token": record.id, "role": "analyst"}
    assert entry["epsilon"] == 0 and entry["delta"] == 0


def test_revocation_is_immediate_and_recorded(database: Path) -> None:
    with TokenStore(database) as store:
        token, record = store.create("auditor-1", "auditor")
        with TokenStore(database) as other:  # another worker sees it at once
            assert other.authenticate(token).role == "auditor"
            store.revoke(record.id)
            assert other.authenticate(token) is None
        with pytest.raises(ParameterError, match="already revoked"):
            store.revoke(record.id)
        with pytest.raises(ParameterError, match="no token with id"):
            store.revoke("nope")
        assert store.records()[0].revoked is not None
    actions = [e["payload"]["action"] for e in database_ledger(database) if e["kind"] == "token"]
    assert actions == ["create", "revoke"]


def test_refusals(database: Path, tmp_path: Path) -> None:
    with TokenStore(database) as store:
        with pytest.raises(PolicyError, match="'mallory' has no allocation"):
            store.create("mallory")
        with pytest.raises(ParameterError, match="role must be one of"):
            store.create("alice", "admin")
        assert store.records() == []
    with pytest.raises(PolicyError, match="no privacy policy"):
        TokenStore(tmp_path / "missing.duckdb")


def test_ledgers_from_before_tokens_are_migrated_with_their_chain(database: Path) -> None:
    path = ledger_path(database)
    connection = sqlite3.connect(path, isolation_level=None)
    (schema,) = connection.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'entries'"
    ).fetchone()
    old = schema.replace(", 'token'", "")
    connection.executescript(
        "DROP TRIGGER entries_no_update; DROP TRIGGER entries_no_delete;"
        "ALTER TABLE entries RENAME TO kept;"
        f"{old};"
        "INSERT INTO entries SELECT * FROM kept; DROP TABLE kept;"
    )
    connection.close()
    before = database_ledger(database)
    with TokenStore(database) as store:
        store.create("alice")
    after = database_ledger(database)
    assert after[: len(before)] == before and after[-1]["kind"] == "token"
    ledger = Ledger(path, dataset="demo")
    try:
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            ledger._connection.execute("DELETE FROM entries")
    finally:
        ledger.close()
