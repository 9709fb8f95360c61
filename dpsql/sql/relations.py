"""A FROM clause over several tables, turned into one private relation the allow-list reads.

An analyst's schema has several tables: persons and their orders, public lookups. The shapes
here each build a relation in which **every row belongs to exactly one person and carries that
person's privacy unit**, so removing a person removes exactly their rows of it, and the rest of
dpsql (contribution bounding, sensitivity, keys) treats it as one private table:

- **Joins on the privacy unit** of private tables (``orders o JOIN customers c ON o.cid =
  c.cid``, ``USING (cid)``, ``LEFT JOIN``): a joined row pairs two rows of the same person. A join
  of private tables on anything else pairs rows of different persons and is refused.
- **Lookups in public tables** (``JOIN products p ON o.pid = p.pid``, equalities on any columns
  of one kind): a public row is the same in both neighbouring databases, so a joined row still
  belongs to the private row's person; the public table's multiplicity on the join key (read from
  the public table, never from private rows) scales the relation's contribution bounds.
- **Per-person aggregation** (``SELECT cid, COUNT(*) AS n, SUM(x) AS s FROM orders GROUP BY cid``
  in FROM or a CTE): one row per person; the outer query aggregates across persons.
- **Unit-local windows** (``LAG(d) OVER (PARTITION BY cid ORDER BY d)``, ``ROW_NUMBER()``, ...
  partitioned by the privacy unit): a transformation within one person's rows.

Every read of a private table goes through ``dpsql.sql.generate.private_rows`` (rows with a
unit, partition rules). Expressions are restricted to what cannot fail at run time on some rows:
per-row filters pass the same allow-list as WHERE; sums and averages run as DOUBLE; differences of
dates run as ``date_diff``. The engine (``dpsql.engine.relations``) derives the relation's policy
(contribution bounds, column bounds, key domains) from the policy of the tables it reads.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace

from sqlglot import exp

from dpsql.errors import SchemaError, UnsupportedQueryError
from dpsql.sql.generate import identifier, private_rows
from dpsql.sql.parse import ParsedQuery
from dpsql.sql.shape import ColumnKind

__all__ = ["Origin", "PrivateTable", "Relation", "lift", "with_ctes_as_subqueries"]

MAX_JOINS = 8
"""The most tables one FROM clause may join."""

_WINDOWS = {
    "ROW_NUMBER": "rank",
    "RANK": "rank",
    "DENSE_RANK": "rank",
    "LAG": "value",
    "LEAD": "value",
    "FIRST_VALUE": "value",
    "LAST_VALUE": "value",
    "MIN": "value",
    "MAX": "value",
    "COUNT": "count",
    "SUM": "sum",
    "AVG": "average",
}
_PER_PERSON = {"COUNT": "count", "SUM": "sum", "AVG": "average", "MIN": "value", "MAX": "value"}
_HINT_SUBQUERY = (
    "a subquery in FROM is either per person (SELECT unit, COUNT(*) AS n, SUM(x) AS s ... GROUP "
    "BY unit) or per row with windows partitioned by the unit (SELECT ..., LAG(x) OVER "
    "(PARTITION BY unit ORDER BY t) AS prev ...)"
)


@dataclass(frozen=True)
class PrivateTable:
    """What the allow-list needs of a private table's policy."""

    unit: str
    partition: str | None = None
    max_rows_per_unit: int = 1


@dataclass(frozen=True)
class Origin:
    """Where a column of a relation comes from, for its bounds and key domain.

    ``kind``: "unit" (the privacy unit), "value" (a value of ``table.column`` or NULL: the column
    itself, LAG/LEAD/FIRST_VALUE/MIN/MAX of it), "public" (a column of public ``table``), "count"
    (a count of one person's rows of the relation: COUNT per person, ROW_NUMBER, RANK), "sum" /
    "average" (of ``table.column`` over one person's rows), "difference" (``parts[0] -
    parts[1]``), "days" (a difference of dates in days).
    """

    kind: str
    table: str = ""
    column: str = ""
    parts: tuple[Origin, ...] = ()
    rows: tuple[str, ...] = ()
    """For "count" and "sum": the private tables whose rows per person multiply in the rows
    counted or summed (their contribution bounds bound the count)."""
    lookups: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """For "count" and "sum": the public lookups (table, join columns) multiplying them."""
    limits: tuple[float | None, float | None] = (None, None)
    """For "clamped": the low and high the query states (``LEAST(GREATEST(x, low), high)``)."""


@dataclass(frozen=True)
class Source:
    """A relation being built: SQL that reads it (``FROM <sql>``), its columns and their origins,
    its unit column, and the private tables and public joins it multiplies rows by."""

    sql: str
    types: dict[str, str]
    origins: dict[str, Origin]
    unit: str | None
    tables: tuple[str, ...] = ()
    public_joins: tuple[tuple[str, tuple[str, ...]], ...] = ()
    per_person: bool = False
    factors: tuple[str, ...] = ()
    """The private tables whose contribution bounds multiply in the rows per person (a
    per-person subquery contributes one row: none)."""

    def counted(self, kind: str, table: str = "", column: str = "", parts=()) -> Origin:
        """An origin counting or summing this source's rows of one person."""
        return Origin(kind, table, column, parts, self.factors, self.public_joins)


@dataclass(frozen=True)
class Relation:
    """A private relation one query reads in place of a table.

    ``select`` is its SQL (DuckDB's dialect) as a tree whose typed literals the binder converts;
    ``types`` and ``origins`` describe its columns; ``unit`` is its privacy unit; ``tables`` the
    private tables it reads; ``public_joins`` each joined public table with its join columns;
    ``per_person`` whether it holds one row per person.
    """

    name: str
    select: exp.Select
    types: dict[str, str]
    origins: dict[str, Origin]
    unit: str
    tables: tuple[str, ...]
    public_joins: tuple[tuple[str, tuple[str, ...]], ...]
    per_person: bool
    factors: tuple[str, ...]

    @property
    def description(self) -> str:
        """How the relation is formed, for EXPLAIN's measures line."""
        joined = " JOIN ".join((*self.tables, *(t for t, _ in self.public_joins)))
        return f"per person over {joined}" if self.per_person else joined


Check = Callable[[exp.Expression, Mapping[str, str]], exp.Expression]
"""Checks a per-row filter over columns (name -> type) against the WHERE allow-list and
returns it with typed literals (``dpsql.sql.analyze``)."""


class _Lifter:
    def __init__(
        self,
        parsed: ParsedQuery,
        catalog: Mapping[str, Mapping[str, str]],
        private: Mapping[str, PrivateTable],
        public: Collection[str],
        check: Check,
    ):
        self.parsed = parsed
        self.catalog = catalog
        self.private = {name.lower(): (name, rules) for name, rules in private.items()}
        self.public = {name.lower() for name in public}
        self.check = check
        self.counter = 0

    def reject(self, node: exp.Expression, message: str, error: type = UnsupportedQueryError):
        line, column = self.parsed.position(node)
        raise error(message, line=line, column=column)

    # tables -------------------------------------------------------------------------------------
    def table(self, node: exp.Expression) -> tuple[str, Source]:
        """A table named in FROM or JOIN: (its alias, the source reading it)."""
        if isinstance(node, exp.Subquery):
            alias = node.alias or self.fresh_alias()
            inner = node.this
            if not isinstance(inner, exp.Select):
                self.reject(node, "a subquery in FROM must be one SELECT; " + _HINT_SUBQUERY)
            return alias, self.subquery(inner)
        if not isinstance(node, exp.Table) or not isinstance(node.this, exp.Identifier):
            self.reject(node, "FROM and JOIN must name tables or per-person subqueries")
        if node.args.get("db") or node.args.get("catalog"):
            self.reject(node, "qualified table names are not supported; name the table alone")
        alias = node.args.get("alias")
        if alias is not None and alias.args.get("columns"):
            self.reject(alias, "column aliases in FROM are not supported")
        matches = [name for name in self.catalog if name.lower() == node.name.lower()]
        if not matches:
            self.reject(node, f"unknown table {node.name!r}", SchemaError)
        name = matches[0]
        types = dict(self.catalog[name])
        if name.lower() in self.private:
            rules = self.private[name.lower()][1]
            origins = {c: Origin("value", name, c) for c in types}
            origins[rules.unit] = Origin("unit", name, rules.unit)
            sql = f"(SELECT * FROM {private_rows(name, rules.unit, rules.partition)})"
            source = Source(sql, types, origins, rules.unit, tables=(name,), factors=(name,))
            return node.alias or name, source
        if name.lower() in self.public:
            origins = {c: Origin("public", name, c) for c in types}
            return node.alias or name, Source(identifier(name), types, origins, None)
        self.reject(node, f"table {name!r} is not covered by the privacy policy", SchemaError)
        raise AssertionError

    def fresh_alias(self) -> str:
        self.counter += 1
        return f"__s{self.counter}"

    # joins --------------------------------------------------------------------------------------
    def joined(self, select: exp.Select) -> tuple[Source, dict[tuple[str, str], str]]:
        """The relation of ``select``'s FROM and JOINs, and how its column references map to the
        relation's columns: (alias or "", column name, both lower-case) -> column."""
        source = select.args.get("from_") or select.args.get("from")
        if source is None:
            self.reject(select, "the query needs FROM <table>")
        joins = select.args.get("joins") or []
        if len(joins) + 1 > MAX_JOINS:
            self.reject(joins[MAX_JOINS - 1], f"at most {MAX_JOINS} tables can be joined")
        first_alias, first = self.table(source.this)
        if first.unit is None:
            self.reject(
                source.this,
                "put a private table first in FROM (public tables are joined to private rows)",
            )
        sides: list[tuple[str, Source]] = [(first_alias, first)]
        conditions: list[tuple[str, tuple[str, ...]]] = []
        kinds: list[str] = []
        merged: set[tuple[int, str]] = set()
        for join in joins:
            alias, right = self.table(join.this)
            if alias.lower() in {a.lower() for a, _ in sides}:
                self.reject(
                    join.this, f"the joined tables need distinct names or aliases: {alias!r}"
                )
            kind, on, using = self.join_kind(join)
            sides.append((alias, right))
            conditions.append(self.condition(join, sides, on, using, merged))
            kinds.append(kind)
        if len(sides) == 1:
            return first, {(c.lower(), ""): c for c in first.types} | {
                (c.lower(), first_alias.lower()): c for c in first.types
            }
        if all(s.unit is None for _, s in sides):
            self.reject(source.this, "the FROM clause needs a private table")
        if sides[0][1].unit is None:
            self.reject(
                source.this,
                "put a private table first in FROM (public tables are joined to private rows)",
            )
        return self.combine(sides, conditions, kinds, merged)

    def join_kind(self, join: exp.Join) -> tuple[str, exp.Expression | None, list[str]]:
        side = (join.args.get("side") or "").upper()
        kind = (join.args.get("kind") or "").upper()
        if kind in ("CROSS",) or join.args.get("method"):
            self.reject(join, f"{(join.args.get('method') or kind).upper()} JOIN is not supported")
        if side in ("RIGHT", "FULL"):
            self.reject(
                join,
                f"{side} JOIN is not supported: put the table whose rows are kept first and use "
                "LEFT JOIN",
            )
        if kind not in ("", "INNER", "OUTER") or (kind == "OUTER" and side != "LEFT"):
            self.reject(join, f"{kind} JOIN is not supported; use JOIN or LEFT JOIN")
        using = [u.name for u in join.args.get("using") or []]
        on = join.args.get("on")
        if on is None and not using:
            self.reject(join, "a JOIN needs ON or USING (cross joins are not supported)")
        return ("LEFT JOIN" if side == "LEFT" else "JOIN"), on, using

    def condition(
        self,
        join: exp.Join,
        sides: list[tuple[str, Source]],
        on: exp.Expression | None,
        using: list[str],
        merged: set[tuple[int, str]],
    ) -> tuple[str, tuple[str, ...]]:
        """The ON condition of the newest side, checked: private tables join on the unit, public
        tables on equalities of one kind. Returns it over the sides' aliases, and the newest
        side's join columns."""
        right_index = len(sides) - 1
        alias, right = sides[right_index]
        pairs: list[tuple[tuple[int, str], tuple[int, str]]] = []
        if using:
            for name in using:
                left = self.resolve(sides[:right_index], name, "", join)
                right_column = self.resolve([sides[right_index]], name, "", join)
                pairs.append((left, (right_index, right_column[1])))
                merged.add((right_index, right_column[1]))
        else:
            assert on is not None
            for term in _conjuncts(on):
                if not isinstance(term, exp.EQ):
                    self.reject(
                        term,
                        "a JOIN condition is column = column (AND ...); other tests go in WHERE",
                    )
                a, b = term.this, term.expression
                if not (isinstance(a, exp.Column) and isinstance(b, exp.Column)):
                    self.reject(term, "a JOIN condition compares two columns")
                first = self.resolve(sides, a.name, a.table, a)
                second = self.resolve(sides, b.name, b.table, b)
                if first[0] == right_index and second[0] != right_index:
                    first, second = second, first
                if second[0] != right_index or first[0] == right_index:
                    self.reject(
                        term, f"the JOIN condition must compare {alias!r} with a table before it"
                    )
                pairs.append((first, second))
        left_sources = {i for (i, _), _ in pairs}
        for (i, left_column), (_, right_column) in pairs:
            left_kind = ColumnKind.of(sides[i][1].types[left_column])
            right_kind = ColumnKind.of(right.types[right_column])
            if left_kind is not right_kind and not (left_kind.numeric and right_kind.numeric):
                self.reject(
                    join,
                    f"the JOIN compares {left_column!r} ({sides[i][1].types[left_column]}) with "
                    f"{right_column!r} ({right.types[right_column]}): values of different types",
                )
        if right.unit is not None:
            # A private table joins on the privacy unit, and only on it: any other key pairs rows
            # of different persons, so one person's rows would reach others' joined rows.
            units = [(sides[i][1].unit, lc, rc) for (i, lc), (_, rc) in pairs]
            if not joins_on_unit(units, right.unit):
                self.reject(
                    join,
                    f"private tables join on the privacy unit only ({right.unit!r} of {alias!r} = "
                    "the unit of a private table before it): a join on another key pairs rows of "
                    "different persons",
                )
        elif len(left_sources) != 1:
            self.reject(join, "a public table joins to one table before it")
        text = " AND ".join(
            f"{identifier(sides[i][0])}.{identifier(lc)} = {identifier(alias)}.{identifier(rc)}"
            for (i, lc), (_, rc) in pairs
        )
        return text, tuple(rc for _, (_, rc) in pairs)

    def resolve(
        self,
        sides: list[tuple[str, Source]],
        name: str,
        qualifier: str,
        node: exp.Expression,
    ) -> tuple[int, str]:
        found = [
            (i, column)
            for i, (alias, source) in enumerate(sides)
            if not qualifier or alias.lower() == qualifier.lower()
            for column in source.types
            if column.lower() == name.lower()
        ]
        if not found:
            where = f" in {qualifier!r}" if qualifier else ""
            self.reject(node, f"unknown column {name!r}{where}", SchemaError)
        if len(found) > 1:
            self.reject(node, f"column {name!r} is ambiguous: qualify it with a table alias")
        return found[0]

    def combine(
        self,
        sides: list[tuple[str, Source]],
        conditions: list[tuple[str, tuple[str, ...]]],
        kinds: list[str],
        merged: set[tuple[int, str]],
    ) -> tuple[Source, dict[tuple[str, str], str]]:
        counts: dict[str, int] = {}
        for i, (_, source) in enumerate(sides):
            for column in source.types:
                if (i, column) not in merged:
                    counts[column.lower()] = counts.get(column.lower(), 0) + 1
        names: dict[tuple[int, str], str] = {}
        taken: set[str] = set()
        for i, (alias, source) in enumerate(sides):
            for column in source.types:
                if (i, column) in merged:
                    continue
                name = column if counts[column.lower()] == 1 else f"{alias}_{column}"
                if name.lower() in taken:
                    self.reject(
                        self.parsed.expression,
                        f"the joined tables give two columns named {name!r}; alias a table",
                    )
                taken.add(name.lower())
                names[(i, column)] = name
        unit_side = sides[0][1]
        assert unit_side.unit is not None
        unit = names[(0, unit_side.unit)]
        items, types, origins = [], {}, {}
        references: dict[tuple[str, str], str] = {}
        for i, (alias, source) in enumerate(sides):
            for column in source.types:
                if (i, column) in merged:
                    continue
                name = names[(i, column)]
                origin = source.origins[column]
                if origin.kind == "unit" and i != 0:
                    origin = Origin("value", origin.table, origin.column)
                items.append(f"{identifier(alias)}.{identifier(column)} AS {identifier(name)}")
                types[name] = source.types[column]
                origins[name] = origin
        for i, (alias, source) in enumerate(sides):
            for column in source.types:
                target = names.get((i, column))
                if target is None:  # merged by USING: the kept side's column
                    target = next(
                        names[(j, c)]
                        for j in range(i)
                        for c in sides[j][1].types
                        if c.lower() == column.lower() and (j, c) in names
                    )
                references[(column.lower(), alias.lower())] = target
                if counts.get(column.lower(), 0) <= 1:
                    references[(column.lower(), "")] = target
        private = sum(source.unit is not None for _, source in sides)
        reads = [self.truncated(source) if private > 1 else source.sql for _, source in sides]
        text = f"{reads[0]} AS {identifier(sides[0][0])}"
        lookups: list[tuple[str, tuple[str, ...]]] = []
        for (alias, source), read, kind, (condition, keys) in zip(
            sides[1:], reads[1:], kinds, conditions, strict=True
        ):
            text += f" {kind} {read} AS {identifier(alias)} ON {condition}"
            if source.unit is None:
                lookups.append((source.origins[next(iter(source.types))].table, keys))
        combined = Source(
            sql=f"(SELECT {', '.join(items)} FROM {text})",
            types=types,
            origins=origins,
            unit=unit,
            tables=tuple(t for _, s in sides for t in s.tables),
            public_joins=tuple(lookups)
            + tuple(p for _, s in sides if s.unit is not None for p in s.public_joins),
            per_person=False,
            factors=tuple(t for _, s in sides for t in s.factors),
        )
        return combined, references

    def truncated(self, source: Source) -> str:
        """A private side of a join of private tables, keeping at most its contribution bound of
        rows per person (the product of its tables' ``max_rows_per_unit``), in an order fixed by
        the person's own rows. The join's size is then bounded per person before it is
        computed: one person's many rows in two tables cannot make it quadratic (a time or
        memory failure after the charge that would depend on them). Which rows a person keeps
        depends on that person's rows only."""
        if source.unit is None or source.per_person:
            return source.sql
        most = math.prod(self.private[t.lower()][1].max_rows_per_unit for t in source.factors)
        columns = ", ".join(identifier(c) for c in source.types)
        order = ", ".join(f"{identifier(c)} NULLS LAST" for c in source.types)
        return (
            f"(SELECT {columns} FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY "
            f"{identifier(source.unit)} ORDER BY {order}) AS __kept FROM {source.sql} AS "
            f"__side) AS __sides WHERE __kept <= {int(most)})"
        )

    # subqueries ---------------------------------------------------------------------------------
    def subquery(self, select: exp.Select) -> Source:
        """A SELECT in FROM (or a CTE's body): per person (GROUP BY the unit) or per row."""
        for name, value in select.args.items():
            if value and name not in {"expressions", "from", "from_", "where", "group", "joins"}:
                node = value[0] if isinstance(value, list) else value
                self.reject(
                    node if isinstance(node, exp.Expression) else select,
                    f"{name.upper()} is not supported in a subquery; " + _HINT_SUBQUERY,
                )
        inner, references = self.joined(select)
        if inner.unit is None:
            self.reject(select, "the subquery needs a private table")
        if inner.per_person and select.args.get("group"):
            self.reject(select, "a per-person subquery cannot be aggregated per person again")
        where = select.args.get("where")
        condition = None
        if where is not None:
            if any(where.find_all(exp.Select, exp.Subquery)):
                self.reject(where, "a subquery's WHERE cannot hold another subquery")
            condition = self.check(self.renamed(where.this, references), inner.types)
        group = select.args.get("group")
        if group is not None:
            return self.per_person(select, inner, references, group, condition)
        return self.per_row(select, inner, references, condition)

    def renamed(
        self, node: exp.Expression, references: dict[tuple[str, str], str]
    ) -> exp.Expression:
        """``node`` with each column reference replaced by the relation column it names."""
        node = node.copy()
        for column in list(node.find_all(exp.Column)):
            if isinstance(column.this, exp.Star):
                continue
            target = references.get((column.name.lower(), column.table.lower()))
            if target is None:
                known = {name for (name, qualifier) in references if qualifier == ""}
                if (
                    column.name.lower() in {n for n, _ in references}
                    and not column.table
                    and (column.name.lower() not in known)
                ):
                    self.reject(column, f"column {column.name!r} is ambiguous: qualify it")
                self.reject(column, f"unknown column {column.sql()!r}", SchemaError)
            column.replace(exp.column(target, quoted=True))
        return node

    def output_name(self, item: exp.Expression, default: str | None) -> str:
        if isinstance(item, exp.Alias):
            return item.alias
        if default is not None:
            return default
        self.reject(item, "name each computed column of a subquery: ... AS name")
        raise AssertionError

    def per_person(
        self,
        select: exp.Select,
        inner: Source,
        references: dict[tuple[str, str], str],
        group: exp.Group,
        condition: exp.Expression | None,
    ) -> Source:
        keys = [self.renamed(k, references) for k in group.expressions]
        if len(keys) != 1 or not isinstance(keys[0], exp.Column) or keys[0].name != inner.unit:
            self.reject(
                group,
                f"a subquery groups by the privacy unit {inner.unit!r} alone (one row per person)",
            )
        items, types, origins = [], {}, {}
        for item in select.expressions:
            body = item.this if isinstance(item, exp.Alias) else item
            body = self.renamed(body, references)
            if isinstance(body, exp.Column):
                if body.name != inner.unit:
                    self.reject(
                        item,
                        f"{body.name!r} is not the privacy unit: a per-person subquery selects "
                        "the unit and aggregates of the person's rows",
                    )
                name = self.output_name(item, body.name)
                items.append(f"{identifier(inner.unit)} AS {identifier(name)}")
                types[name], origins[name] = inner.types[inner.unit], inner.origins[inner.unit]
                continue
            name = self.output_name(item, None)
            if isinstance(body, exp.Least | exp.Greatest):
                sql, type_name, origin = self.clamped(item, body, inner, self.aggregate)
            else:
                sql, type_name, origin = self.aggregate(item, body, inner)
            items.append(f"{sql} AS {identifier(name)}")
            types[name], origins[name] = type_name, origin
        self.check_names(select, types)
        if not any(o.kind == "unit" for o in origins.values()):
            self.reject(select, f"a per-person subquery selects the privacy unit {inner.unit!r}")
        unit = next(n for n, o in origins.items() if o.kind == "unit")
        where = f" WHERE {condition.sql(dialect='duckdb')}" if condition is not None else ""
        sql = (
            f"(SELECT {', '.join(items)} FROM {inner.sql} AS __rows{where} "
            f"GROUP BY {identifier(inner.unit)})"
        )
        return replace(
            inner,
            sql=sql,
            types=types,
            origins=origins,
            unit=unit,
            per_person=True,
            factors=(),
            public_joins=(),
        )

    def aggregate(
        self, item: exp.Expression, body: exp.Expression, inner: Source
    ) -> tuple[str, str, Origin]:
        name = type(body).__name__.upper()
        label = {"COUNT": "COUNT", "SUM": "SUM", "AVG": "AVG", "MIN": "MIN", "MAX": "MAX"}.get(name)
        if label is None:
            self.reject(
                item,
                f"{body.sql(dialect='duckdb')!r}: a per-person subquery computes COUNT, SUM, AVG, "
                "MIN or MAX of the person's rows",
            )
        argument = body.this
        distinct = isinstance(argument, exp.Distinct)
        if distinct:
            if label != "COUNT" or len(argument.expressions) != 1:
                self.reject(item, "DISTINCT is supported in COUNT(DISTINCT column) only")
            argument = argument.expressions[0]
        if label == "COUNT" and isinstance(argument, exp.Star):
            return "COUNT(*)", "BIGINT", inner.counted("count")
        if not isinstance(argument, exp.Column):
            self.reject(item, f"{label} of a subquery takes one column")
        column = argument.name
        origin = inner.origins[column]
        kind = ColumnKind.of(inner.types[column])
        quoted = identifier(column)
        if label == "COUNT":
            count = f"COUNT(DISTINCT {quoted})" if distinct else f"COUNT({quoted})"
            return count, "BIGINT", inner.counted("count")
        if label in ("MIN", "MAX"):
            if kind is ColumnKind.BOOLEAN:
                self.reject(item, f"{label} of a BOOLEAN column is not supported")
            return f"{label}({quoted})", inner.types[column], _value(origin)
        if not kind.numeric:
            self.reject(item, f"{label}({column}) needs a numeric column")
        kind_name = "sum" if label == "SUM" else "average"
        return (
            f"{label}(CAST({quoted} AS DOUBLE))",
            "DOUBLE",
            inner.counted(kind_name, origin.table, origin.column, (origin,)),
        )

    def check_names(self, node: exp.Expression, types: Mapping[str, str]) -> None:
        names = [n.lower() for n in types]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated or len(names) != len(set(names)):
            self.reject(node, f"the subquery's column names must be distinct, repeated: {repeated}")

    def per_row(
        self,
        select: exp.Select,
        inner: Source,
        references: dict[tuple[str, str], str],
        condition: exp.Expression | None,
    ) -> Source:
        items, types, origins = [], {}, {}
        for item in select.expressions:
            body = item.this if isinstance(item, exp.Alias) else item
            if isinstance(body, exp.Star) or (
                isinstance(body, exp.Column) and isinstance(body.this, exp.Star)
            ):
                for column in inner.types:
                    items.append(identifier(column))
                    types[column], origins[column] = inner.types[column], inner.origins[column]
                continue
            if any(body.find_all(exp.AggFunc)) and not any(body.find_all(exp.Window)):
                self.reject(
                    item,
                    f"aggregates in a subquery need GROUP BY the privacy unit {inner.unit!r}",
                )
            body = self.renamed(body, references)
            if isinstance(body, exp.Column):
                name = self.output_name(item, body.name)
                items.append(f"{identifier(body.name)} AS {identifier(name)}")
                types[name], origins[name] = inner.types[body.name], inner.origins[body.name]
                continue
            name = self.output_name(item, None)
            sql, type_name, origin = self.computed(item, body, inner)
            items.append(f"{sql} AS {identifier(name)}")
            types[name], origins[name] = type_name, origin
        self.check_names(select, types)
        units = [n for n, o in origins.items() if o.kind == "unit"]
        if not units:
            self.reject(select, f"the subquery must select the privacy unit {inner.unit!r}")
        where = f" WHERE {condition.sql(dialect='duckdb')}" if condition is not None else ""
        return replace(
            inner,
            sql=f"(SELECT {', '.join(items)} FROM {inner.sql} AS __rows{where})",
            types=types,
            origins=origins,
            unit=units[0],
        )

    def computed(
        self, item: exp.Expression, body: exp.Expression, inner: Source
    ) -> tuple[str, str, Origin]:
        """A window function partitioned by the unit, or a difference of a column and one."""
        if isinstance(body, exp.Window):
            return self.window(item, body, inner)
        if isinstance(body, exp.Least | exp.Greatest):
            return self.clamped(item, body, inner)
        if isinstance(body, exp.Sub) or (
            isinstance(body, exp.Anonymous | exp.DateDiff) and _is_date_diff(body)
        ):
            return self.difference(item, body, inner)
        self.reject(
            item,
            f"{body.sql(dialect='duckdb')!r}: a per-row subquery selects columns, window "
            "functions partitioned by the privacy unit, and differences of them",
        )
        raise AssertionError

    def clamped(
        self,
        item: exp.Expression,
        body: exp.Expression,
        inner: Source,
        operand: Callable[..., tuple[str, str, Origin]] | None = None,
    ) -> tuple[str, str, Origin]:
        """``LEAST(x, high)`` / ``GREATEST(x, low)`` (nested for both) with a number literal:
        the query states bounds of a value the policy does not bound (a gap, a difference), or
        narrows them. ``operand`` reads ``x`` (default: a column, window or difference; a
        per-person subquery passes its aggregates)."""
        operand = operand or self.operand
        arguments = [body.this, *body.expressions]
        literals = [a for a in arguments if _number(a) is not None]
        others = [a for a in arguments if _number(a) is None]
        if len(arguments) != 2 or len(literals) != 1 or len(others) != 1:
            self.reject(item, f"{body.key.upper()} takes an expression and a number literal")
        limit = _number(literals[0])
        assert limit is not None
        value = others[0]
        if isinstance(value, exp.Least | exp.Greatest):
            sql, _, origin = self.clamped(item, value, inner, operand)
        else:
            sql, type_name, origin = operand(item, value, inner)
            if not ColumnKind.of(type_name).numeric:
                self.reject(item, f"{body.key.upper()} bounds numbers")
            sql = f"CAST({sql} AS DOUBLE)"
            origin = Origin("clamped", parts=(origin,))
        low, high = origin.limits
        if isinstance(body, exp.Least):
            high = limit if high is None else min(high, limit)
            text = f"LEAST({sql}, {limit!r})"
        else:
            low = limit if low is None else max(low, limit)
            text = f"GREATEST({sql}, {limit!r})"
        return text, "DOUBLE", replace(origin, limits=(low, high))

    def operand(
        self, item: exp.Expression, node: exp.Expression, inner: Source
    ) -> tuple[str, str, Origin]:
        if isinstance(node, exp.Paren):
            node = node.this
        if isinstance(node, exp.Column):
            return identifier(node.name), inner.types[node.name], inner.origins[node.name]
        if isinstance(node, exp.Window):
            return self.window(item, node, inner)
        if isinstance(node, exp.Sub | exp.DateDiff | exp.Anonymous):
            return self.difference(item, node, inner)
        self.reject(node, "a difference is between columns and window functions")
        raise AssertionError

    def difference(
        self, item: exp.Expression, body: exp.Expression, inner: Source
    ) -> tuple[str, str, Origin]:
        if isinstance(body, exp.Sub):
            left, right = body.this, body.expression
            unit_name = None
        else:
            unit_node, right, left = _date_diff_parts(body)
            unit_name = unit_node
        a_sql, a_type, a_origin = self.operand(item, left, inner)
        b_sql, b_type, b_origin = self.operand(item, right, inner)
        a_kind, b_kind = ColumnKind.of(a_type), ColumnKind.of(b_type)
        temporal = {ColumnKind.DATE, ColumnKind.TIMESTAMP}
        if a_kind in temporal and b_kind in temporal:
            part = unit_name or "day"
            if part not in ("day", "hour", "minute", "second", "week", "month", "year"):
                self.reject(item, f"date_diff part {part!r} is not supported")
            return (
                f"date_diff('{part}', {b_sql}, {a_sql})",
                "BIGINT",
                Origin("days", parts=(a_origin, b_origin)),
            )
        if unit_name is not None or not (a_kind.numeric and b_kind.numeric):
            self.reject(item, "a difference takes two numbers or two dates")
        return (
            f"(CAST({a_sql} AS DOUBLE) - CAST({b_sql} AS DOUBLE))",
            "DOUBLE",
            Origin("difference", parts=(_value(a_origin), _value(b_origin))),
        )

    def window(
        self, item: exp.Expression, node: exp.Window, inner: Source
    ) -> tuple[str, str, Origin]:
        function = node.this
        if node.args.get("spec") is not None:
            self.reject(node, "window frames (ROWS/RANGE BETWEEN ...) are not supported")
        if node.args.get("alias") or node.args.get("over") not in (None, "OVER"):
            self.reject(node, "named windows are not supported; write OVER (PARTITION BY ...)")
        partition = node.args.get("partition_by") or []
        names = [p.name for p in partition if isinstance(p, exp.Column)]
        if len(names) != len(partition) or not partitions_by_unit(names, inner.unit):
            self.reject(
                node,
                f"a window must be PARTITION BY the privacy unit {inner.unit!r}: a window over "
                "several persons' rows mixes their data",
            )
        order = node.args.get("order")
        order_sql = ""
        if order is not None:
            parts = []
            for ordered in order.expressions:
                column = ordered.this
                if not isinstance(column, exp.Column):
                    self.reject(ordered, "a window orders by columns")
                direction = " DESC" if ordered.args.get("desc") else ""
                parts.append(f"{identifier(column.name)}{direction} NULLS LAST")
            order_sql = " ORDER BY " + ", ".join(parts)
        over = f" OVER (PARTITION BY {', '.join(identifier(n) for n in names)}{order_sql})"
        label = _function_name(function)
        role = _WINDOWS.get(label)
        if role is None:
            self.reject(node, f"window function {label} is not supported")
        argument = function.this if not isinstance(function, exp.Anonymous) else None
        if isinstance(function, exp.Anonymous):
            arguments = function.expressions
            argument = arguments[0] if arguments else None
        if role == "rank":
            return f"{label}(){over}", "BIGINT", inner.counted("count")
        if label == "COUNT" and (argument is None or isinstance(argument, exp.Star)):
            return f"COUNT(*){over}", "BIGINT", inner.counted("count")
        if not isinstance(argument, exp.Column):
            self.reject(node, f"{label} takes a column")
        column = argument.name
        origin = inner.origins[column]
        quoted = identifier(column)
        if label in ("LAG", "LEAD"):
            offset = function.args.get("offset")
            extra = ""
            if offset is not None:
                if not (isinstance(offset, exp.Literal) and offset.is_int):
                    self.reject(offset, f"the {label} offset must be a whole number")
                if not 0 <= int(offset.this) <= 1_000:
                    self.reject(offset, f"the {label} offset must be between 0 and 1000")
                extra = f", {int(offset.this)}"
            if function.args.get("default") is not None:
                self.reject(function, f"{label} with a default value is not supported")
            return f"{label}({quoted}{extra}){over}", inner.types[column], _value(origin)
        if role == "value":
            return f"{label}({quoted}){over}", inner.types[column], _value(origin)
        if role == "count":
            return f"COUNT({quoted}){over}", "BIGINT", inner.counted("count")
        if not ColumnKind.of(inner.types[column]).numeric:
            self.reject(node, f"{label}({column}) needs a numeric column")
        kind = "sum" if role == "sum" else "average"
        return (
            f"{label}(CAST({quoted} AS DOUBLE)){over}",
            "DOUBLE",
            inner.counted(kind, origin.table, origin.column, (origin,)),
        )


def joins_on_unit(pairs: list[tuple[str | None, str, str]], unit: str) -> bool:
    """Whether a private table's join condition, as (unit of the left table, left column,
    right column) pairs, is exactly one equality of its privacy unit ``unit`` with the unit
    of a private table before it."""
    return len(pairs) == 1 and pairs[0][2] == unit and pairs[0][0] == pairs[0][1]


def partitions_by_unit(columns: list[str], unit: str) -> bool:
    """Whether a window partitioned by ``columns`` stays within one person's rows."""
    return unit in columns


def _value(origin: Origin) -> Origin:
    """A value taken from a column (LAG, MIN, ...): the column's rules; a unit is a value of it."""
    if origin.kind == "unit":
        return Origin("value", origin.table, origin.column)
    return origin


def _number(node: exp.Expression) -> float | None:
    """The finite value of a number literal (``-3`` included), else None."""
    negative = isinstance(node, exp.Neg)
    inner = node.this if negative else node
    if not (isinstance(inner, exp.Literal) and not inner.is_string):
        return None
    try:
        value = float(inner.this)
    except ValueError:
        return None
    if value != value or value in (float("inf"), float("-inf")):
        return None
    return -value if negative else value


def _function_name(function: exp.Expression) -> str:
    if isinstance(function, exp.Anonymous):
        return str(function.this).upper()
    return {
        "RowNumber": "ROW_NUMBER",
        "Lag": "LAG",
        "Lead": "LEAD",
        "FirstValue": "FIRST_VALUE",
        "LastValue": "LAST_VALUE",
        "Min": "MIN",
        "Max": "MAX",
        "Count": "COUNT",
        "Sum": "SUM",
        "Avg": "AVG",
    }.get(type(function).__name__, type(function).__name__.upper())


def _is_date_diff(node: exp.Expression) -> bool:
    if isinstance(node, exp.DateDiff):
        return True
    return isinstance(node, exp.Anonymous) and str(node.this).lower() in ("date_diff", "datediff")


def _date_diff_parts(node: exp.Expression) -> tuple[str, exp.Expression, exp.Expression]:
    """(part, start, end) of ``date_diff('part', start, end)``."""
    if isinstance(node, exp.DateDiff):
        unit = node.args.get("unit")
        part = (unit.name if unit is not None else "day").lower()
        return part, node.expression, node.this
    arguments = node.expressions
    if len(arguments) != 3 or not isinstance(arguments[0], exp.Literal):
        raise UnsupportedQueryError("date_diff takes ('part', start, end)")
    return str(arguments[0].this).lower(), arguments[1], arguments[2]


def _conjuncts(node: exp.Expression) -> list[exp.Expression]:
    if isinstance(node, exp.Paren):
        return _conjuncts(node.this)
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    return [node]


def _is_relation_subquery(inner: exp.Expression, units: Collection[str]) -> bool:
    """Whether a subquery in FROM forms a relation (per person: GROUP BY a privacy unit; per
    row: no aggregate outside a window) rather than being the DP query whose released answer
    the outer query post-processes (``dpsql.sql.postprocess``)."""
    if not isinstance(inner, exp.Select):
        return False
    group = inner.args.get("group")
    if group is not None:
        keys = group.expressions
        return len(keys) == 1 and isinstance(keys[0], exp.Column) and keys[0].name.lower() in units
    if inner.args.get("joins"):
        return True
    aggregates = [a for a in inner.find_all(exp.AggFunc) if not a.find_ancestor(exp.Window)]
    return not aggregates


def _needs_relation(select: exp.Select, units: Collection[str]) -> bool:
    """Whether ``select`` reads more than one table or a relation subquery (a lone range JOIN
    with a public table keeps its own path, ``dpsql.sql.analyze``)."""
    source = select.args.get("from_") or select.args.get("from")
    if source is not None and isinstance(source.this, exp.Subquery):
        return _is_relation_subquery(source.this.this, units)
    joins = select.args.get("joins") or []
    if not joins:
        return False
    return not (len(joins) == 1 and isinstance(joins[0].args.get("on"), exp.Between))


def with_ctes_as_subqueries(parsed: ParsedQuery) -> ParsedQuery:
    """``parsed`` with each CTE read as a subquery in its place, when a CTE (or the main query)
    joins, groups or uses windows; CTEs that only filter one table are left to
    ``dpsql.sql.ctes``, which folds them into WHERE."""
    select = parsed.expression
    key = "with_" if "with_" in select.args else "with"
    with_ = select.args.get(key)
    if with_ is None or with_.args.get("recursive"):
        return parsed

    def complex_body(body: exp.Expression) -> bool:
        if not isinstance(body, exp.Select):
            return False
        source = body.args.get("from_") or body.args.get("from")
        return bool(
            body.args.get("group")
            or body.args.get("joins")
            or any(body.find_all(exp.Window))
            or (source is not None and isinstance(source.this, exp.Subquery))
        )

    if not (select.args.get("joins") or any(complex_body(c.this) for c in with_.expressions)):
        return parsed
    views: dict[str, exp.Expression] = {}

    def substituted(node: exp.Expression) -> exp.Expression:
        for table in list(node.find_all(exp.Table)):
            body = views.get(table.name.lower())
            if body is None or table.args.get("db"):
                continue
            alias = exp.TableAlias(this=exp.to_identifier(table.alias or table.name))
            subquery = exp.Subquery(this=body.copy(), alias=alias)
            subquery.meta.update(table.meta)
            table.replace(subquery)
        return node

    for cte in with_.expressions:
        views[cte.alias.lower()] = substituted(cte.this.copy())
    query = select.copy()
    query.set(key, None)
    return replace(parsed, expression=substituted(query))


def _relation_name(sql: str, tables: tuple[str, ...]) -> str:
    digest = hashlib.sha256(sql.encode()).hexdigest()[:8]
    return f"{' ⋈ '.join(dict.fromkeys(tables))} #{digest}"


def lift(
    parsed: ParsedQuery,
    catalog: Mapping[str, Mapping[str, str]],
    private: Mapping[str, PrivateTable],
    public: Collection[str],
    check: Check,
) -> tuple[ParsedQuery, Relation | None]:
    """The query over one relation: ``parsed`` unchanged (None) when it reads one table, else
    the query rewritten to read the relation its FROM clause forms, and that relation.

    Args:
        parsed: the analyst's query, CTEs substituted (``with_ctes_as_subqueries``).
        catalog: the tables the analyst may name, with their columns' types.
        private: the policy's private tables (unit, partition column).
        public: the names of the policy's public tables.
        check: checks a per-row filter against the WHERE allow-list (see ``Check``).
    """
    select = parsed.expression
    units = {rules.unit.lower() for rules in private.values()}
    if not isinstance(select, exp.Select) or not _needs_relation(select, units):
        return parsed, None
    lifter = _Lifter(parsed, catalog, private, public, check)
    source, references = lifter.joined(select)
    if source.unit is None:
        lifter.reject(select, "the FROM clause needs a private table")
    name = _relation_name(source.sql, source.tables)
    query = select.copy()
    query.set("joins", None)
    table = exp.Table(this=exp.to_identifier(name, quoted=True))
    query.set("from_" if "from_" in query.args else "from", exp.From(this=table))
    if any(query.find_all(exp.Subquery)):
        lifter.reject(
            next(query.find_all(exp.Subquery)),
            "a query over joined tables or a subquery cannot hold another subquery",
        )
    for column in list(query.find_all(exp.Column)):
        if isinstance(column.this, exp.Star):
            continue
        target = references.get((column.name.lower(), column.table.lower()))
        if target is None and not column.table:
            if any(qualifier == "" and n == column.name.lower() for n, qualifier in references):
                continue
            if any(n == column.name.lower() for n, _ in references):
                lifter.reject(column, f"column {column.name!r} is ambiguous: qualify it")
            continue  # an output alias (ORDER BY n) or unknown: the allow-list names it
        if target is None:
            lifter.reject(column, f"unknown column {column.sql()!r}", SchemaError)
        column.replace(exp.column(target, quoted=True))
    assert source.unit is not None
    relation = Relation(
        name=name,
        select=_parsed_select(source.sql),
        types=dict(source.types),
        origins=dict(source.origins),
        unit=source.unit,
        tables=tuple(dict.fromkeys(source.tables)),
        public_joins=source.public_joins,
        per_person=source.per_person,
        factors=source.factors,
    )
    return replace(parsed, expression=query), relation


@functools.lru_cache(maxsize=64)
def _parsed(sql: str) -> exp.Expression:
    import sqlglot

    return sqlglot.parse_one(sql, read="duckdb")


def _parsed_select(sql: str) -> exp.Select:
    node = _parsed(sql).copy()
    while isinstance(node, exp.Subquery | exp.Paren):
        node = node.this
    assert isinstance(node, exp.Select)
    return node
