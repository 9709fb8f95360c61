"""The policy of a relation over several tables, derived from the policies of the tables it reads.

``dpsql.sql.relations`` turns a FROM clause with joins, per-person subqueries or unit-local
windows into one relation whose rows each belong to one person. This module gives it what a table
of the policy has, derived from the policy and public tables only (never from private rows):

- **Contribution bounds.** A join's rows per person are at most the product of the joined private
  tables' bounds (``max_rows_per_unit``, ``max_groups_per_unit``, ``max_rows_per_group`` each
  multiply) times each public lookup's multiplicity (the most public rows one key matches, read
  from the public table). A per-person relation has one row per person (all bounds 1). These
  bounds are then *enforced* on the relation like on any table (the bounded aggregate keeps at
  most that many rows per person), so the guarantee does not rest on the data respecting them.
- **Column rules.** A column taken from a table keeps its rules (bounds, public keys, key domain);
  a count of one person's rows lies in ``[0, R]`` with ``R`` the rows bound above, and has the
  public keys ``0..R`` (when ``R`` ≤ 10,000); a sum of a column bounded by ``[L, U]`` lies in
  ``[R·min(L, 0), R·max(U, 0)]``; an average, minimum or lag stays within ``[L, U]``; a
  difference of bounded values within the difference of their bounds; a public table's column
  has the distinct values of the public table as its public keys (read from that table). Counts
  and sums are clamped to their bounds inside the relation, so filters and groups read the same
  values the bounds describe.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from sqlglot import exp

from dpsql.engine.literals import Binder
from dpsql.engine.policy import ColumnPolicy, Policy, TablePolicy
from dpsql.errors import PolicyError, UnsupportedQueryError
from dpsql.sql import relations
from dpsql.sql.analyze import check_filter
from dpsql.sql.generate import identifier
from dpsql.sql.parse import ParsedQuery
from dpsql.sql.relations import Origin, PrivateTable, Relation
from dpsql.sql.shape import AggregateKind, ColumnKind, QueryShape, RelationSql

__all__ = ["RelationRules", "bind_relation", "lift_query", "relation_policy"]

BOUND_CAP = 1_000_000
"""The largest contribution bound a relation may have (as for a table of the policy)."""
MAX_COUNT_KEYS = 10_000
"""Counts of rows per person get the public keys 0..R when R is at most this."""
MAX_PUBLIC_KEYS = 10_000
"""A public table's column is a key domain when it has at most this many distinct values."""


def private_tables(policy: Policy) -> dict[str, PrivateTable]:
    """The policy's private tables as the allow-list needs them."""
    return {
        name: PrivateTable(table.privacy_unit, table.partition_column, table.max_rows_per_unit)
        for name, table in policy.tables.items()
    }


def lift_query(
    parsed: ParsedQuery, catalog: Mapping[str, Mapping[str, str]], policy: Policy
) -> tuple[ParsedQuery, Relation | None]:
    """``parsed`` over one relation when it reads several tables or a relation subquery
    (``dpsql.sql.relations.lift``), with CTEs that join or group read as subqueries."""
    parsed = relations.with_ctes_as_subqueries(parsed)
    check = functools.partial(check_filter, parsed)
    return relations.lift(parsed, catalog, private_tables(policy), policy.public_tables, check)


def _table(policy: Policy, name: str) -> TablePolicy:
    table = policy.table(name)
    assert table is not None  # the allow-list reads only the policy's tables
    return table


class RelationRules:
    """Bounds and key domains of a relation's columns (see the module docstring), with the
    public tables' multiplicities read once per query."""

    def __init__(self, policy: Policy, binder: Binder):
        self.policy = policy
        self.binder = binder
        self.multiplicities: dict[tuple[str, tuple[str, ...]], int] = {}

    def multiplicity(self, lookup: tuple[str, tuple[str, ...]]) -> int:
        """The most rows of a public table one value of its join columns matches (at least 1:
        a LEFT JOIN keeps a private row without a match)."""
        if lookup not in self.multiplicities:
            table, keys = lookup
            columns = ", ".join(identifier(k) for k in keys)
            present = " AND ".join(f"{identifier(k)} IS NOT NULL" for k in keys)
            frame = self.binder.run(
                f"SELECT COALESCE(MAX(__n), 0) AS __most FROM (SELECT COUNT(*) AS __n FROM "
                f"{identifier(table)} WHERE {present} GROUP BY {columns}) AS __matches"
            )
            self.multiplicities[lookup] = max(1, int(frame.iloc[0, 0]))
        return self.multiplicities[lookup]

    def rows(self, tables: Sequence[str], lookups: Sequence[tuple[str, tuple[str, ...]]]) -> int:
        """The most rows one person has in a join of ``tables`` and ``lookups``."""
        product = math.prod(_table(self.policy, t).max_rows_per_unit for t in tables)
        return product * math.prod(self.multiplicity(lookup) for lookup in lookups)

    def bounds(self, origin: Origin) -> tuple[float, float] | None:
        kind = origin.kind
        if kind == "value":
            return _table(self.policy, origin.table).column(origin.column).bounds
        if kind == "count":
            return (0.0, float(self.rows(origin.rows, origin.lookups)))
        if kind in ("sum", "average"):
            inner = self.bounds(origin.parts[0])
            if inner is None:
                return None
            if kind == "average":
                return inner
            most = self.rows(origin.rows, origin.lookups)
            return (most * min(inner[0], 0.0), most * max(inner[1], 0.0))
        if kind == "clamped":
            implied = self.bounds(origin.parts[0]) or (None, None)
            (low, high), (known_low, known_high) = origin.limits, implied
            # A clamp can only narrow the values: the tighter of the stated and implied side.
            if known_low is not None:
                low = known_low if low is None else max(low, known_low)
            if known_high is not None:
                high = known_high if high is None else min(high, known_high)
            if low is None or high is None or low > high or not math.isfinite(high - low):
                return None
            return (low, high)
        if kind == "difference":
            first, second = (self.bounds(part) for part in origin.parts)
            if first is None or second is None:
                return None
            return (first[0] - second[1], first[1] - second[0])
        return None

    def column(self, origin: Origin, name: str, relation: Relation, grouped: bool) -> ColumnPolicy:
        if origin.kind == "value":
            return _table(self.policy, origin.table).column(origin.column)
        if origin.kind == "public":
            if not grouped:
                return ColumnPolicy()
            return ColumnPolicy(public_keys=self.public_keys(origin, name, relation))
        bounds = self.bounds(origin)
        if bounds is None or not all(math.isfinite(b) for b in bounds):
            return ColumnPolicy()
        if origin.kind == "count" and bounds[1] <= MAX_COUNT_KEYS:
            return ColumnPolicy(bounds=bounds, public_keys=tuple(range(int(bounds[1]) + 1)))
        return ColumnPolicy(bounds=bounds)

    def public_keys(self, origin: Origin, name: str, relation: Relation) -> tuple | None:
        """The distinct values of a public table's column (its key domain), read from the
        public table; None when there are too many."""
        column = identifier(origin.column)
        frame = self.binder.run(
            f"SELECT DISTINCT {column} AS __key FROM {identifier(origin.table)} "
            f"WHERE {column} IS NOT NULL LIMIT {MAX_PUBLIC_KEYS + 1}"
        )
        if len(frame) > MAX_PUBLIC_KEYS or len(frame) == 0:
            return None
        kind = ColumnKind.of(relation.types[name])
        values = frame["__key"].tolist()
        if kind in (ColumnKind.DATE, ColumnKind.TIMESTAMP):
            return tuple(str(v) for v in values)
        if kind is ColumnKind.FLOAT:
            return tuple(float(v) for v in values if math.isfinite(float(v)))
        if kind in (ColumnKind.INTEGER, ColumnKind.BOOLEAN, ColumnKind.STRING):
            return tuple(values)
        return None


def relation_policy(
    relation: Relation, rules: RelationRules, group_by: Sequence[str]
) -> TablePolicy:
    """The relation's privacy unit, contribution bounds and column rules (module docstring).

    Args:
        relation: the relation the query reads (``dpsql.sql.relations``).
        rules: the policy of the tables it reads, and the reads of public tables
            (multiplicities, key domains).
        group_by: the query's group columns (public columns get key domains only there).
    """
    if relation.per_person:
        rows = groups = per_group = 1
    else:
        tables = [_table(rules.policy, t) for t in relation.factors]
        lookups = math.prod(rules.multiplicity(lookup) for lookup in relation.public_joins)
        rows = rules.rows(relation.factors, relation.public_joins)
        groups = math.prod(t.max_groups_per_unit for t in tables) * lookups
        per_group = math.prod(t.max_rows_per_group for t in tables) * lookups
    most = max(rows, groups, per_group)
    if most > BOUND_CAP:
        raise PolicyError(
            f"the join of {', '.join(relation.tables)} gives up to {most:,} rows per person (the "
            f"product of the tables' contribution bounds and the public tables' matches); at most "
            f"{BOUND_CAP:,}: lower the bounds or join fewer tables"
        )
    columns = {
        name: rules.column(origin, name, relation, name in group_by)
        for name, origin in relation.origins.items()
        if origin.kind != "unit"
    }
    return TablePolicy(
        privacy_unit=relation.unit,
        max_rows_per_unit=rows,
        max_groups_per_unit=min(groups, rows),
        max_rows_per_group=min(per_group, rows),
        columns={n: c for n, c in columns.items() if c != ColumnPolicy()},
    )


def _clamped(select: exp.Select, table: TablePolicy, relation: Relation) -> exp.Select:
    """The relation's counts and sums clamped to their bounds, where the relation makes them."""
    select = select.copy()
    for item in select.expressions:
        name = item.alias_or_name
        origin = relation.origins.get(name)
        if origin is None or origin.kind not in ("count", "sum"):
            continue
        bounds = table.column(name).bounds
        if bounds is None:
            continue
        low, high = (exp.Literal.number(repr(float(b))) for b in bounds)
        body = item.this if isinstance(item, exp.Alias) else item
        typed = "BIGINT" if origin.kind == "count" else "DOUBLE"
        clamp = exp.Case(
            ifs=[exp.If(this=exp.Is(this=body.copy(), expression=exp.Null()), true=exp.Null())],
            default=exp.Cast(
                this=exp.Least(
                    this=exp.Greatest(this=body.copy(), expressions=[low]), expressions=[high]
                ),
                to=exp.DataType.build(typed),
            ),
        )
        item.replace(exp.alias_(clamp, name, quoted=True))
    return select


def bind_relation(
    relation: Relation, shape: QueryShape, policy: Policy, binder: Binder
) -> tuple[QueryShape, Policy, Binder]:
    """The query's shape reading the relation's SQL, the policy with the relation as one of its
    tables, and a binder that knows the relation's columns.

    Args:
        relation: the relation (``dpsql.sql.relations.lift``).
        shape: the analysed query over it.
        policy: the policy in force.
        binder: the session's binder.
    """
    for column in shape.group_by:
        origin = relation.origins.get(column)
        if origin is not None and (
            origin.kind == "unit"
            or (
                origin.kind == "value"
                and origin.column == _table(policy, origin.table).privacy_unit
            )
        ):
            raise UnsupportedQueryError(
                f"GROUP BY {column!r}, the privacy unit, would release one group per person; "
                "aggregate per person in a subquery, then across persons"
            )
    rules = RelationRules(policy, binder)
    table = relation_policy(relation, rules, shape.group_by)
    for name, origin in relation.origins.items():
        if (
            origin.kind in ("value", "public")
            and ColumnKind.of(relation.types[name]) is ColumnKind.STRING
        ):
            binder.check_binary(origin.table, [origin.column])
    select = _clamped(relation.select, table, relation)
    casts = [c for c in select.find_all(exp.Cast) if isinstance(c.this, exp.Literal)]
    for old, new in zip(casts, binder.convert(casts, "literal"), strict=True):
        old.set("this", new.this)
    sql = select.sql(dialect="duckdb")
    _check_bounded(shape, table, relation)
    try:  # the database binds every expression of the relation over no rows
        binder.run(f"SELECT * FROM ({sql}) AS __relation WHERE false")
    except Exception:  # binding only: no row was read
        raise UnsupportedQueryError(
            "an expression of the joined tables or subquery does not type-check in the "
            "database; nothing was charged"
        ) from None
    overlay = policy.model_copy(update={"tables": {**policy.tables, relation.name: table}})
    bound = RelationSql(sql, _rule(relation, table, rules))
    return (
        replace(shape, relation=bound),
        overlay,
        binder.with_relation(relation.name, relation.types),
    )


def _rule(relation: Relation, table: TablePolicy, rules: RelationRules) -> str:
    """The contribution bound of a relation, in words, for EXPLAIN's measures line."""
    if relation.per_person:
        return f"one row per person of {relation.description}"
    factors = [f"{t} {_table(rules.policy, t).max_rows_per_unit}" for t in relation.factors]
    factors += [f"{rules.multiplicity(j)} match(es) in {j[0]}" for j in relation.public_joins]
    return (
        f"rows of {relation.description}, at most {table.max_rows_per_unit} per person (the "
        f"product of max_rows_per_unit: {' × '.join(factors)})"
    )


def _check_bounded(shape: QueryShape, table: TablePolicy, relation: Relation) -> None:
    """A sum, mean or quantile of a relation's column whose bounds the policy does not imply
    is refused here, saying how the query can state them."""
    for output in shape.aggregates:
        if output.kind in (AggregateKind.COUNT, AggregateKind.PERSONS) or output.column is None:
            continue
        column = output.column
        if column in shape.virtual or column not in relation.origins:
            continue
        rules = table.column(column)
        if rules.bounds is None and rules.auto_bounds is None:
            raise PolicyError(
                f"{output.kind.name}({column}): the policy implies no bounds for {column!r} of "
                "the subquery; state them there, e.g. LEAST(GREATEST(<expression>, low), high) "
                f"AS {column}"
            )
