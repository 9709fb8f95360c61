"""Access tokens: who may call the service, and as which role.

A token is ``dpsql_<id>_<secret>`` with 256 random bits of secret, shown once at creation. Only
its SHA-256 is stored (a salt adds nothing to a secret this long), in the ``tokens`` table of the
ledger's SQLite file; creation and revocation are also appended to the hash-chained ledger. The
service takes the analyst's identity from the token alone.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from dpsql.accountant.ledger import Ledger
from dpsql.accountant.stores import LedgerFileStore
from dpsql.engine.session import ledger_path, show_policy
from dpsql.errors import ParameterError, PolicyError

__all__ = ["ROLES", "Identity", "Role", "TokenRecord", "TokenStore"]

Role = Literal["analyst", "auditor"]
ROLES: tuple[Role, ...] = ("analyst", "auditor")
_PREFIX = "dpsql_"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('analyst', 'auditor')),
    created TEXT NOT NULL,
    revoked TEXT
)
"""


@dataclass(frozen=True)
class Identity:
    """The caller a valid token names."""

    token_id: str
    name: str
    role: Role


@dataclass(frozen=True)
class TokenRecord:
    """A stored token (never its secret)."""

    id: str
    name: str
    role: Role
    created: str
    revoked: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class TokenStore(LedgerFileStore):
    """The tokens of one database, in its ledger file. Safe to share between threads."""

    def __init__(self, database: str | Path):
        self.database = Path(database)
        path = ledger_path(database)
        if not path.exists():
            raise PolicyError(f"no privacy policy is set for {str(database)!r}")
        super().__init__(path, schema=_SCHEMA, what="token table of", threads=True)
        self._lock = threading.Lock()

    def __enter__(self) -> TokenStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _record(self, action: str, record: TokenRecord) -> None:
        """Append the event to the ledger (verified on open; fails closed like a charge)."""
        dataset = show_policy(self.database).dataset.name or self.database.stem
        ledger = Ledger(ledger_path(self.database), dataset=dataset)
        try:
            ledger.record_token_event(
                analyst=record.name,
                payload={"action": action, "token": record.id, "role": record.role},
            )
        finally:
            ledger.close()

    def create(self, name: str, role: str = "analyst") -> tuple[str, TokenRecord]:
        """A fresh token for ``name`` with ``role``: returns (the token, its record)."""
        if role not in ROLES:
            raise ParameterError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        if not name:
            raise ParameterError("a token needs a non-empty analyst name")
        if role == "analyst" and name not in show_policy(self.database).analysts:
            raise PolicyError(
                f"analyst {name!r} has no allocation in the policy; add [analysts.{name}] first"
            )
        token_id = secrets.token_hex(6)
        token = f"{_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
        record = TokenRecord(token_id, name, role, _now(), None)  # type: ignore[arg-type]
        self._record("create", record)  # record first: a failure leaves no usable token
        with self._lock:
            self._connection.execute(
                "INSERT INTO tokens (id, hash, name, role, created) VALUES (?, ?, ?, ?, ?)",
                (token_id, _digest(token), name, role, record.created),
            )
        return token, record

    def records(self) -> list[TokenRecord]:
        """Every token ever created, oldest first."""
        with self._lock:
            rows = self._connection.execute(
                "SELECT id, name, role, created, revoked FROM tokens ORDER BY created, id"
            ).fetchall()
        return [TokenRecord(*row) for row in rows]

    def revoke(self, token_id: str) -> TokenRecord:
        """Revoke a token by its id; it is refused from the next request on."""
        found = next((r for r in self.records() if r.id == token_id), None)
        if found is None:
            raise ParameterError(f"no token with id {token_id!r}")
        if found.revoked is not None:
            raise ParameterError(f"token {token_id!r} was already revoked at {found.revoked}")
        revoked = TokenRecord(found.id, found.name, found.role, found.created, _now())
        with self._lock:  # revoke first: a failure to record can only leave it revoked
            self._connection.execute(
                "UPDATE tokens SET revoked = ? WHERE id = ?", (revoked.revoked, token_id)
            )
        self._record("revoke", revoked)
        return revoked

    def authenticate(self, token: str) -> Identity | None:
        """The identity of a valid, unrevoked token, else None."""
        if not token.startswith(_PREFIX) or len(token) > 200:
            return None
        with self._lock:
            row = self._connection.execute(
                "SELECT id, name, role FROM tokens WHERE hash = ? AND revoked IS NULL",
                (_digest(token),),
            ).fetchone()
        return Identity(*row) if row else None
