"""The query path's stages before the charge, as public functions over explicit arguments.

``bind`` (parse, check against the allow-list, bind literals and keys in the database), then
``resolve_budget`` (epsilon and delta from the arguments, ``OPTIONS`` and the policy), then
``planner`` (the plan at any epsilon, priced from the policy), then the charge
(``dpsql.accountant.ledger``), then ``dpsql.engine.release`` reads and releases, and
``after_charge`` turns any failure after the charge into the one data-independent message. Every
stage reads the policy and metadata only, never a row, so a refusal charges nothing.
``Session`` (``dpsql.engine.session``), reports and streams call these stages; none reaches into
another's state.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from dpsql import deadline
from dpsql.accountant.units import check_budget_value
from dpsql.engine.accuracy import accuracy_details, accuracy_target, with_confidence
from dpsql.engine.backends import Backend
from dpsql.engine.literals import Binder, BoundShape
from dpsql.engine.planner import QueryPlan, plan_query
from dpsql.engine.plans.laplace import Laplace
from dpsql.engine.policy import Policy
from dpsql.engine.prepared import Template, fill, template_for
from dpsql.engine.relations import bind_relation, lift_query
from dpsql.errors import (
    FAILED_AFTER_CHARGE,
    DpsqlError,
    ExecutionError,
    ParameterError,
    TimeLimitError,
    UnsupportedQueryError,
)
from dpsql.memo import Kept
from dpsql.sql.analyze import analyze
from dpsql.sql.generate import ranges_per_group
from dpsql.sql.parse import parse, refusing_deep_recursion, tokenized
from dpsql.sql.shape import GroupKey, QueryShape
from dpsql.sql.slots import skeleton_of

__all__ = [
    "BoundQueries",
    "BoundQuery",
    "Budget",
    "after_charge",
    "bind",
    "cell_confidence",
    "cells",
    "check_ranges",
    "planner",
    "public_keys",
    "resolve_budget",
    "summary",
    "visible_catalog",
]

if TYPE_CHECKING:
    from sqlglot.dialects import Dialect
    from sqlglot.tokens import Token

T = TypeVar("T")


class BoundQuery(NamedTuple):
    """A query checked and bound to the database: its bound shape, its SQL as normalised for
    the ledger, and the policy it is planned under (the policy in force, with the relation it
    reads as one more table when it joins tables or reads a subquery:
    ``dpsql.engine.relations``)."""

    bound: BoundShape
    normalized: str
    policy: Policy
    binder: Binder
    """The binder planning needs: the session's, knowing the relation's columns if any."""


class Budget(NamedTuple):
    """What a query may spend: ``epsilon`` (None when ``target``, an accuracy, decides it) and
    ``delta``."""

    epsilon: float | None
    delta: float
    target: Any = None


def visible_catalog(backend: Backend, policy: Policy) -> dict[str, dict[str, str]]:
    """The tables an analyst may name: the policy's tables and public tables. Others do not
    exist for them: their names and column types are not the analyst's to read."""
    named = {name.lower() for name in (*policy.tables, *policy.public_tables)}
    return {t: c for t, c in backend.catalog().items() if t.lower() in named}


def bind(
    sql: str,
    *,
    dialect: str,
    policy: Policy,
    backend: Backend,
    binder: Binder,
    read: tuple[type[Dialect], list[Token]] | None = None,
) -> BoundQuery:
    """Parse ``sql`` (written in ``dialect``), check it against the allow-list over the tables
    ``policy`` exposes, and bind its literals, keys and expressions in the database
    (``dpsql.engine.literals``); within the request's time limit.

    Args:
        sql: the analyst's query text.
        dialect: the SQL dialect it is written in (sqlglot's name, e.g. "duckdb").
        policy: the policy in force: which tables exist for the analyst, and their rules.
        backend: the database the query will read (its catalog; the binder runs its probes).
        binder: converts literals and keys in ``backend``'s own semantics.
        read: ``sql``'s dialect and tokens (``dpsql.sql.parse.tokenized``), if read already.
    """
    parsed = parse(sql, dialect, read)
    deadline.check()
    with refusing_deep_recursion():
        catalog = visible_catalog(backend, policy)
        lifted, relation = lift_query(parsed, catalog, policy)
        normalized = parsed.expression.sql(dialect=backend.dialect)
        if relation is None:
            shape = analyze(parsed, catalog)
            deadline.check()
            return BoundQuery(binder.bind(shape, policy), normalized, policy, binder)
        shape = analyze(lifted, {**catalog, relation.name: relation.types})
        deadline.check()
        shape, policy, binder = bind_relation(relation, shape, policy, binder)
        return BoundQuery(binder.bind(shape, policy), normalized, policy, binder)


class BoundQueries:
    """The queries a session bound lately, for a binder whose conversions are pure
    (``Binder.pure``): binding is then a function of the text, its dialect, the policy in force
    and the backend's catalog, so a query asked again (a dashboard's refresh) is not parsed,
    checked and bound again, and a query asked again with other literals in its WHERE clause is
    bound from its template (``dpsql.engine.prepared``). A new policy entry or a registered
    table is a new object: what was bound under the old one is not found again
    (``dpsql.memo.Kept``)."""

    def __init__(self, size: int = 256):
        self._kept: Kept[BoundQuery] = Kept(size)
        self._templates: Kept[Template | None] = Kept(size)
        """By skeleton seen twice: its template, or None when it cannot have one."""
        self._seen: Kept[bool] = Kept(4 * size)
        """Skeletons seen once, apart: texts asked once never push templates out."""

    def bound(
        self, sql: str, *, dialect: str, policy: Policy, backend: Backend, binder: Binder
    ) -> BoundQuery:
        """``bind(sql, ...)``, or what it returned before for the same inputs."""

        def bound_now(read: tuple[type[Dialect], list[Token]] | None = None) -> BoundQuery:
            return bind(
                sql, dialect=dialect, policy=policy, backend=backend, binder=binder, read=read
            )

        if not binder.pure:
            return bound_now()
        catalog = backend.catalog()

        def by_template() -> BoundQuery:
            return self._by_template(sql, dialect, policy, backend, binder, catalog, bound_now)

        return self._kept.get((sql, dialect, policy, catalog), by_template)

    def _by_template(
        self,
        sql: str,
        dialect: str,
        policy: Policy,
        backend: Backend,
        binder: Binder,
        catalog: dict[str, dict[str, str]],
        bound_now: Callable[..., BoundQuery],
    ) -> BoundQuery:
        try:
            read = tokenized(sql, dialect)
        except DpsqlError:
            return bound_now()  # the same refusal, from the parse
        skeleton = skeleton_of(read[1])
        if skeleton is None:
            return bound_now(read)
        inputs = (skeleton.key, dialect, backend.dialect, policy, catalog)
        found = self._templates.find(inputs)
        if found is not None:
            try:
                filled = fill(found, sql, skeleton, dialect=dialect, policy=policy, binder=binder)
                return BoundQuery(filled.bound, filled.normalized, policy, binder)
            except (deadline.DeadlinePassed, TimeLimitError):
                raise
            except Exception:
                return bound_now(read)  # the refusal of the parsed text, with its position
        result = bound_now(read)
        if self._templates.known(inputs):
            return result  # this skeleton cannot have a template
        if self._seen.find(inputs) is None:
            self._seen.put(inputs, True)
            return result
        made = template_for(
            sql, skeleton, result, dialect=dialect, catalog=catalog, binder=binder,
            ledger_dialect=backend.dialect,
        )  # fmt: skip
        self._templates.put(inputs, made)
        return result


def check_ranges(shape: QueryShape, policy: Policy, backend: Backend) -> None:
    """Refuse a range JOIN whose GROUP BY groups hold several distinct ranges: one row would
    count in each of them while the noise is set for one (reads the public table only)."""
    join = shape.range_join
    if join is None:
        return
    if join.table.lower() not in {name.lower() for name in policy.public_tables}:
        return  # the planner refuses it, naming the missing declaration
    most = int(backend.run(ranges_per_group(shape, backend.dialect)).iloc[0, 0])
    if most > 1:
        raise UnsupportedQueryError(
            f"GROUP BY {', '.join(shape.group_by)} puts up to {most} different ranges of "
            f"{join.table!r} in one group; group by columns that identify one range (e.g. "
            "its low and high columns)"
        )


def public_keys(
    shape: QueryShape, policy: Policy, binder: Binder
) -> dict[str, tuple[Any, ...]]:
    """Public keys of the group columns as the database converted them."""
    table = policy.table(shape.table)
    if table is None or shape.range_join is not None:
        return {}
    return {
        column: binder.keys(shape.table, column, keys)
        for column in shape.group_by
        if (keys := table.column(column).public_keys or _schema_keys(shape, column)) is not None
    }


def _schema_keys(shape: QueryShape, column: str) -> tuple[str, ...] | None:
    """The keys the database listed from a group column's type (an ENUM's values)."""
    return shape.domains.get(column) if column not in shape.virtual else None


def resolve_budget(
    shape: QueryShape,
    policy: Policy,
    *,
    epsilon: float | None,
    delta: float | None,
    accuracy: float | None,
) -> Budget:
    """The epsilon and delta a query asks for: the arguments, else ``OPTIONS``, else the
    policy's defaults; an accuracy target (argument or ``OPTIONS``) replaces epsilon.

    Args:
        shape: the bound query's shape (its ``OPTIONS``).
        policy: the policy in force (its default epsilon and delta).
        epsilon: the caller's epsilon, or None.
        delta: the caller's delta, or None.
        accuracy: the caller's accuracy target, or None.
    """
    options = shape.options
    for name, given in (("epsilon", epsilon), ("delta", delta)):
        if given is not None and name in options and options[name] != given:
            raise ParameterError(
                f"{name} is given both in OPTIONS ({options[name]}) and as "
                f"an argument ({given}); give it once"
            )
    target = accuracy_target(accuracy, options, epsilon)
    epsilon = (
        epsilon
        if epsilon is not None or target is not None
        else options.get("epsilon", policy.dataset.default_query_epsilon)
    )
    if epsilon is None and target is None:
        raise ParameterError(
            "no epsilon given: pass epsilon=..., use "
            "WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=...), or set "
            "dataset.default_query_epsilon in the policy"
        )
    delta = delta if delta is not None else options.get("delta", policy.dataset.default_query_delta)
    delta = check_budget_value("delta", delta, allow_zero=True)
    if target is not None:
        return Budget(None, delta, target)
    return Budget(check_budget_value("epsilon", epsilon, allow_zero=False), delta)


def planner(
    bound: BoundShape,
    policy: Policy,
    binder: Binder,
    *,
    delta: float,
    mechanism: str | None = None,
    max_answers: int | None = None,
    simultaneous: bool = False,
) -> Callable[[float], QueryPlan]:
    """Plans of a bound query at any epsilon, with the policy's (or ``OPTIONS``') confidence;
    public keys are converted once. Reads no data.

    Args:
        bound: the bound query.
        policy: the policy in force (a report may replace its confidence).
        binder: converts the group columns' public keys in the database.
        delta: the query's delta.
        mechanism: how keys without public keys are released (None: the default).
        max_answers: the sparse vector technique's cut-off for a range JOIN (None: default).
        simultaneous: every interval of the answer holds at once (as
            ``OPTIONS(simultaneous=true)``; a report's ``simultaneous = true``).
    """
    policy = with_confidence(policy, bound.shape.options)
    keys = public_keys(bound.shape, policy, binder)
    simultaneous = simultaneous or bool(bound.shape.options.get("simultaneous"))

    def plan_at(epsilon: float, level: Policy = policy) -> QueryPlan:
        return plan_query(
            bound.shape,
            level,
            epsilon=epsilon,
            delta=delta,
            mechanism=mechanism,
            max_answers=max_answers,
            keys=keys,
            partition=bound.partition,
        )

    split: list[Policy] = []  # the policy at the cells' level: cells do not depend on epsilon

    def plan_together(epsilon: float) -> QueryPlan:
        if not split:
            cell = cell_confidence(plan_at(epsilon), policy.dataset.confidence)
            dataset = policy.dataset.model_copy(update={"confidence": cell})
            split.append(policy.model_copy(update={"dataset": dataset}))
        return plan_at(epsilon, split[0])

    return plan_together if simultaneous else plan_at


def cells(plan: QueryPlan) -> int:
    """The intervals an answer states: one per group and noisy output."""
    outputs = sum(1 for output in plan.shape.outputs if not isinstance(output, GroupKey))
    return plan.groups * outputs


def cell_confidence(plan: QueryPlan, confidence: float) -> float:
    """The level of each interval such that all of an answer's intervals hold at once with
    probability at least ``confidence`` (a union bound over ``cells(plan)``: Bonferroni). Only
    answers over public groups state their cells before the data is read.

    >>> round(1 - (1 - 0.95) / 10, 6)
    0.995
    """
    if not isinstance(plan.family, Laplace):
        raise ParameterError(
            "simultaneous=true needs an answer whose cells are known before the data is read: "
            "COUNT, SUM or AVG over public keys with declared bounds"
        )
    return 1 - (1 - confidence) / max(1, cells(plan))


def summary(plan: QueryPlan, shape: QueryShape, accuracy: float | None) -> dict[str, Any]:
    """The plan as EXPLAIN and the ledger show it, with the accuracy target when one chose the
    epsilon."""
    target = accuracy_target(accuracy, shape.options, None)
    shown = plan.summary()
    if shape.options.get("simultaneous"):
        shown["simultaneous"] = {
            "cells": cells(plan),
            "confidence": 1 - (1 - plan.confidence) * cells(plan),
            "cell_confidence": plan.confidence,
            "rule": "every interval of the answer holds at once with probability at least the "
            "table's confidence: each cell's level is 1 - (1 - confidence) / cells (a union "
            "bound)",
        }
    if target is None:
        return shown
    return {**shown, "accuracy": accuracy_details(plan, target)}


def after_charge(work: Callable[[], T]) -> T:
    """``work()``, or the one data-independent ``ExecutionError`` whatever went wrong: whether,
    where and why a charged query fails may depend on the rows it read. The error is raised
    outside the handler, so no exception chain carries more."""
    deadline.mark_charged()
    answer = None
    with contextlib.suppress(Exception):
        answer = work()
    if answer is None:
        raise ExecutionError(FAILED_AFTER_CHARGE)
    return answer
