"""What every front door of one worker shares: tokens, the rate limit, the engine runner.

The HTTP application (``dpsql.serving.app``) and the PostgreSQL front door
(``dpsql.serving.pgserver``) both authenticate with ``Service.authenticate``, admit with
``Service.admit`` and answer a query with ``Service.execute``: the same token check, the same
rate limit, the same engine thread and time limit, so the same ledger entry, whichever door a
query came through.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from dpsql.accountant.ledger import current_actor
from dpsql.engine.results import QueryResult
from dpsql.engine.session import Session
from dpsql.errors import AccessError, ServiceError
from dpsql.serving.limits import RateLimiter, ServerSettings
from dpsql.serving.runner import EngineRunner, RunnerTimeout
from dpsql.serving.tokens import Identity, TokenStore

__all__ = ["RateLimited", "Service"]

T = TypeVar("T")


class RateLimited(ServiceError):
    """The token's requests passed the administrator's rate (429)."""

    def __init__(self, per_minute: int, wait: float):
        super().__init__(
            f"rate limit of {per_minute} requests per minute for this token exceeded; "
            f"retry in {math.ceil(wait)} s",
            status=429,
        )
        self.retry_after = math.ceil(wait)


@dataclass(frozen=True)
class Service:
    """What every request of one worker shares."""

    settings: ServerSettings
    database: Path
    tokens: TokenStore
    runner: EngineRunner
    limiter: RateLimiter

    @classmethod
    def open(cls, settings: ServerSettings) -> Service:
        """The service of ``settings.database`` (its policy must be set)."""
        database = Path(settings.database)
        return cls(
            settings,
            database,
            TokenStore(database),
            EngineRunner(database, verify_every=settings.verify_every),
            RateLimiter(settings.rate_per_minute, f"{database}.dpsql.rate.sqlite"),
        )

    def close(self) -> None:
        self.runner.close()
        self.tokens.close()
        self.limiter.close()

    def authenticate(self, token: str) -> Identity:
        """The identity ``token`` names; ``AccessError`` (401) for an invalid or revoked one."""
        identity = self.tokens.authenticate(token)
        if identity is None:
            raise AccessError("invalid or revoked token", status=401)
        return identity

    def admit(self, identity: Identity, role: str | None) -> None:
        """Take one request from the token's rate; refuse a caller not in ``role`` (any role
        when None) with 403."""
        wait = self.limiter.admit(identity.token_id)
        if wait is not None:
            raise RateLimited(self.settings.rate_per_minute, wait)
        if role is not None and identity.role != role:
            action = "query" if role == "analyst" else "do this"
            raise AccessError(
                f"role {identity.role!r} cannot {action}; use an {role} token", status=403
            )

    def within_sql_length(self, what: str, text: str | None) -> None:
        """Refuse ``text`` longer than the administrator's SQL length (413)."""
        limit = self.settings.max_sql_length
        if text is not None and len(text) > limit:
            raise ServiceError(
                f"{what} has {len(text)} characters; the limit is {limit}", status=413
            )

    async def _run(self, work: Callable[[Session | None], T], analyst: str | None) -> T:
        timeout = self.settings.query_timeout
        try:
            return await self.runner.run(work, analyst=analyst, timeout=timeout)
        except RunnerTimeout:
            raise ServiceError(
                f"the request did not finish within the time limit of {timeout:g} s; "
                "a query that was charged stays charged",
                status=504,
            ) from None

    async def in_session(self, identity: Identity, work: Callable[[Session], T]) -> T:
        """``work`` in the analyst's session on the engine thread, within the time limit; every
        ledger entry it writes records the token (beside the server's operating-system user)."""
        actor = {**current_actor(), "token": identity.token_id}

        def acting(session: Session | None) -> T:
            assert session is not None
            session.act_as(actor)
            return work(session)

        return await self._run(acting, identity.name)

    async def in_thread(self, work: Callable[[], T]) -> T:
        """``work`` (no session: auditor reads) on the engine thread, within the time limit."""
        return await self._run(lambda _: work(), None)

    async def execute(
        self, identity: Identity, sql: str, *, dialect: str, options: dict[str, Any]
    ) -> QueryResult:
        """Answer ``sql`` for ``identity`` (an admitted analyst), charging first: what
        ``POST /v1/query`` and a query on the PostgreSQL port both do."""
        self.within_sql_length("sql", sql)
        return await self.in_session(identity, lambda s: s.execute(sql, dialect=dialect, **options))
