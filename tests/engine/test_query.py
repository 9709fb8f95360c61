"""The query stages before the charge: bound queries kept for a text asked again."""

from __future__ import annotations

from pathlib import Path

import pytest

import dpsql
from dpsql.engine.demo import DEMO_POLICY
from dpsql.engine.literals import Binder
from dpsql.engine.policy import parse_policy
from dpsql.engine.query import BoundQueries, bind
from dpsql.engine.session import _limits as policy_limits
from dpsql.errors import SqlSyntaxError

SQL = "SELECT COUNT(*) FROM requests WHERE age BETWEEN 30 AND 50 AND device = 'mobile'"


def test_a_text_asked_again_is_bound_once_under_the_same_policy(demo_db: Path) -> None:
    with dpsql.connect(demo_db, analyst="alice") as db:
        first = db.bind(SQL)
        assert db.bind(SQL) is first
        assert db.bind(SQL, "postgres") is not first  # another dialect is another query
        assert db.bind(SQL + " ") is not first
        # bound again, it is what binding from scratch gives
        fresh = bind(SQL, dialect="duckdb", policy=db.policy, backend=db.backend, binder=db.binder)
        assert fresh == first
        # a refusal is not kept: it is raised again
        for _ in range(2):
            with pytest.raises(SqlSyntaxError):
                db.bind("SELECT COUNT(* FROM requests")


def test_a_new_policy_entry_binds_the_text_again(demo_db: Path) -> None:
    with dpsql.connect(demo_db, analyst="alice") as db:
        first = db.bind(SQL)
        plan = db.plan(SQL, epsilon=0.5)
        assert db.plan(SQL, epsilon=0.5) is plan and db.plan(SQL, epsilon=0.25) is not plan
        text = DEMO_POLICY.replace("max_rows_per_unit = 20", "max_rows_per_unit = 3")
        policy = parse_policy(text)
        db.ledger_store.set_policy(policy.model_dump(mode="json"), policy_limits(policy))
        again = db.bind(SQL)
        assert again is not first
        replanned = db.plan(SQL, epsilon=0.5)
        assert replanned is not plan
        assert replanned.bounds.max_rows_per_unit == 3 != plan.bounds.max_rows_per_unit


class _Unlocked(Binder):
    """A binder whose conversions may change later (a backend without locked settings)."""

    pure = False


def test_bound_queries_are_not_kept_for_a_binder_that_is_not_pure(demo_db: Path) -> None:
    with dpsql.connect(demo_db, analyst="alice") as db:
        kept = BoundQueries()
        arguments = {"dialect": "duckdb", "policy": db.policy, "backend": db.backend}
        first = kept.bound(SQL, **arguments, binder=db.binder)
        assert kept.bound(SQL, **arguments, binder=db.binder) is first
        unlocked = _Unlocked(db.backend, db.backend.catalog())
        again = kept.bound(SQL, **arguments, binder=unlocked)
        assert (again.bound, again.normalized) == (first.bound, first.normalized)
        assert again is not kept.bound(SQL, **arguments, binder=unlocked)


def test_a_fresh_text_is_tokenized_once(demo_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsql.sql import parse as parse_module

    calls: list[str] = []
    original = parse_module.tokenized

    def counted(sql: str, dialect: str = "duckdb"):  # type: ignore[no-untyped-def]
        calls.append(sql)
        return original(sql, dialect)

    monkeypatch.setattr(parse_module, "tokenized", counted)
    monkeypatch.setattr("dpsql.engine.query.tokenized", counted)
    with dpsql.connect(demo_db, analyst="alice") as db:
        texts = [f"SELECT COUNT(*) FROM requests WHERE age >= {low}" for low in (1, 2, 3)]
        for text in texts:  # seen, then its template made, then filled from it
            db.bind(text)
        # the text each time; the template is made from the text with its literal marked
        assert [c for c in calls if "__dpsql_slot" not in c] == texts
        assert len(calls) == 4
