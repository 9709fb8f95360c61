"""Check a parsed query against dpsql's allow-list and turn it into a typed ``QueryShape``.

Only the nodes named here pass; every rejection names the clause, line and column. A literal is
checked for its form here (a number for a numeric column, an ISO date for a DATE, ...) and emitted
as ``CAST('<text as written>' AS <the column's exact type>)``; ``dpsql.engine.literals`` then has
the database convert it, refuses inexact conversions, and replaces it by the database's own
spelling. Every comparison in the generated SQL is therefore between a column and a value of
exactly its type: none can fail at run time on some rows (a data-dependent error would itself
leak), and none is decided by implicit casts that Python would model differently.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation

from sqlglot import exp

from dpsql.errors import SchemaError, SqlSyntaxError, UnsupportedQueryError
from dpsql.sql import ctes, expressions, filters, postprocess, quantiles
from dpsql.sql.parse import ParsedQuery
from dpsql.sql.shape import (
    Aggregate,
    AggregateKind,
    ColumnKind,
    GroupKey,
    Having,
    QueryShape,
    RangeJoin,
)
from dpsql.sql.slots import SlotUse, slot_index

__all__ = ["analyze", "check_filter", "literal_for", "pattern_for"]

_SELECT_ARGS = {"expressions", "from", "from_", "where", "group", "having", "joins"}
_CLAUSE_NAMES = {
    "joins": "JOIN",
    "having": "HAVING",
    "order": "ORDER BY",
    "limit": "LIMIT",
    "offset": "OFFSET",
    "with": "WITH (common table expressions)",
    "with_": "WITH (common table expressions)",
    "distinct": "SELECT DISTINCT",
    "qualify": "QUALIFY",
    "windows": "WINDOW",
    "laterals": "LATERAL",
    "pivots": "PIVOT",
    "sample": "TABLESAMPLE",
    "into": "SELECT INTO",
}
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
_FLIPPED: Mapping[type[exp.Expression], type[exp.Expression]] = {
    exp.EQ: exp.EQ,
    exp.NEQ: exp.NEQ,
    exp.GT: exp.LT,
    exp.GTE: exp.LTE,
    exp.LT: exp.GT,
    exp.LTE: exp.GTE,
}
_DATE = r"\d{4}-\d{2}-\d{2}"
_FRACTION_DIGITS = {"TIMESTAMP_S": 0, "TIMESTAMP_MS": 3, "TIMESTAMP_NS": 9}
_ZONE = r"(Z|[+-]\d{2}(:?\d{2})?)"
MAX_IN_VALUES = 10_000
"""The most values of one IN list: each is converted by the database before the charge, so this
keeps binding to about a second."""
HAVING_LIMIT = 2**53
"""Largest |threshold| of HAVING: counts are exact integers below it."""


@functools.lru_cache(maxsize=256)
def _built_type(type_name: str) -> exp.DataType:
    """``type_name`` parsed once (a long IN list has one type for all its literals); callers
    copy it."""
    return exp.DataType.build(type_name, dialect="duckdb")


def is_enum(type_name: str) -> bool:
    """Whether ``type_name`` is a DuckDB ENUM (``ENUM('a', 'b')``, as the catalog spells it)."""
    return type_name.upper().startswith("ENUM")


def temporal_pattern(type_name: str) -> re.Pattern[str]:
    """The ISO form a literal for a column of ``type_name`` must take: a date for DATE; a date
    and optionally a time (seconds and as many fraction digits as the type keeps, optional) for
    TIMESTAMP types; for TIMESTAMP WITH TIME ZONE a time and an offset, both required. Nothing
    the database would ignore (an offset on a TIMESTAMP, digits beyond its precision) passes.

    >>> bool(temporal_pattern("TIMESTAMP").fullmatch("2024-01-01 00:00:00+00:01"))
    False
    >>> bool(temporal_pattern("TIMESTAMP WITH TIME ZONE").fullmatch("2024-01-01T10:00+01:00"))
    True
    """
    name = type_name.upper().strip()
    if name == "DATE":
        return re.compile(_DATE)
    with_zone = "TIME ZONE" in name or name == "TIMESTAMPTZ"
    digits = 6 if with_zone else _FRACTION_DIGITS.get(name, 6)
    fraction = rf"(\.\d{{1,{digits}}})?" if digits else ""
    time = rf"[ T]\d{{2}}:\d{{2}}(:\d{{2}}{fraction})?"
    return re.compile(_DATE + (time + _ZONE if with_zone else f"({time})?"))


class Analyzer:
    def __init__(
        self,
        parsed: ParsedQuery,
        catalog: Mapping[str, Mapping[str, str]],
        slots: dict[int, SlotUse] | None = None,
    ):
        self.parsed = parsed
        self.catalog = catalog
        self.slots = slots
        """Slot index -> where the analysis met it, when the query's WHERE literals are slots
        (``dpsql.sql.slots``); None: a query with its literals."""
        self.table = ""
        self.aliases: set[str] = set()
        self.columns: dict[str, str] = {}
        self.public_table = ""
        self.public_aliases: set[str] = set()
        self.public_columns: dict[str, str] = {}
        self.position: tuple[int | None, int | None] = (None, None)
        self.virtual: dict[str, exp.Expression] = {}
        self.group_expressions: dict[str, str] = {}
        """Normalized text of a GROUP BY expression -> its virtual key column."""

    def check_alias(self, alias: exp.Expression | None) -> None:
        """Refuse an unquoted alias that is a reserved word: ``FROM t GROUP`` is a GROUP BY
        missing its BY, not a table named t aliased "GROUP"."""
        identifier = alias.this if isinstance(alias, exp.TableAlias) else alias
        if not isinstance(identifier, exp.Identifier):
            return
        if not identifier.quoted and identifier.name.upper() in RESERVED_WORDS:
            word = identifier.name.upper()
            example = f" (e.g. {word} BY ...)" if word in ("GROUP", "ORDER") else ""
            self.reject(
                alias,
                f"{identifier.name!r} is a reserved word, read here as an alias; complete the "
                f"clause{example} or quote the alias",
                SqlSyntaxError,
            )

    def reject(
        self,
        node: exp.Expression,
        message: str,
        error: type[UnsupportedQueryError | SchemaError | SqlSyntaxError] = UnsupportedQueryError,
    ) -> None:
        line, column = self.parsed.position(node)
        raise error(message, line=line, column=column)

    def shape(self) -> QueryShape:
        select = self.parsed.expression
        if not isinstance(select, exp.Select):
            self.reject(select, f"only SELECT queries are supported, got {select.key.upper()}")
        for name, value in select.args.items():
            if name not in _SELECT_ARGS and value:
                clause = _CLAUSE_NAMES.get(name, name.upper())
                node = value[0] if isinstance(value, list) else value
                if not isinstance(node, exp.Expression):
                    node = select
                self.reject(
                    node,
                    f"{clause} is not supported; dpsql answers SELECT aggregates "
                    "FROM one table with optional WHERE and GROUP BY",
                )
        self.resolve_table(select.args.get("from_") or select.args.get("from"))
        range_join = self.range_join(select.args.get("joins") or [])
        where = select.args.get("where")
        predicate = self.predicate(where.this) if where is not None else None
        # A key named twice is one key (as in DuckDB): one released row per distinct value.
        group_by = tuple(
            dict.fromkeys(
                self.group_column(self.unaliased(node, select))
                for node in self.group_nodes(select)
            )
        )
        if range_join is not None and not group_by:
            self.reject(select, "a range JOIN needs GROUP BY the public table's range columns")
        outputs = tuple(self.output(node, group_by) for node in select.expressions)
        if not any(isinstance(o, Aggregate) for o in outputs):
            self.reject(select, "the select list needs an aggregate: COUNT, SUM or AVG")
        names = [o.name for o in outputs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            self.reject(select, f"output column names must be distinct, repeated: {duplicates}")
        types = dict(self.columns)
        types.update(expressions.key_types(self.virtual))
        kinds = {name: ColumnKind.of(type_name) for name, type_name in types.items()}
        having = select.args.get("having")
        return QueryShape(
            self.table,
            outputs,
            group_by,
            predicate,
            kinds,
            dict(self.parsed.options),
            self.having(having.this, outputs) if having is not None else None,
            range_join,
            types,
            virtual=dict(self.virtual),
        )

    # JOIN with a public range table and HAVING --------------------------------------------------
    def range_join(self, joins: list[exp.Expression]) -> RangeJoin | None:
        if not joins:
            return None
        if len(joins) > 1:
            self.reject(joins[1], "only one JOIN (with a public range table) is supported")
        (join,) = joins
        if join.args.get("side") or join.args.get("kind") not in (None, "", "INNER"):
            self.reject(join, "only an inner JOIN with a public range table is supported")
        if join.args.get("using") or join.args.get("method"):
            self.reject(
                join, "the JOIN needs ON column BETWEEN public_table.low AND public_table.high"
            )
        table = join.this
        if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
            self.reject(join, "JOIN must name one public table")
        self.check_alias(table.args.get("alias"))
        matches = [name for name in self.catalog if name.lower() == table.name.lower()]
        if not matches:
            self.reject(table, _unknown_table(table.name), SchemaError)
        if matches[0] == self.table:
            self.reject(table, "a table cannot be joined with itself")
        self.public_table = matches[0]
        self.public_columns = dict(self.catalog[self.public_table])
        self.public_aliases = {self.public_table.lower(), table.name.lower()}
        if table.alias:
            self.public_aliases.add(table.alias.lower())
        if self.aliases & self.public_aliases:
            self.reject(table, "the joined tables need distinct names or aliases")
        condition = join.args.get("on")
        if not isinstance(condition, exp.Between):
            self.reject(
                condition if condition is not None else join,
                "the JOIN needs ON column BETWEEN public_table.low AND public_table.high",
            )
        value = self.predicate_column(condition.this, "BETWEEN")
        low, high = (self.public_column(condition.args[k]) for k in ("low", "high"))
        kinds = {name: ColumnKind.of(t) for name, t in self.public_columns.items()}
        if (
            not (self.kind(value).numeric and kinds[low].numeric and kinds[high].numeric)
            and len({self.kind(value), kinds[low], kinds[high]}) != 1
        ):
            self.reject(condition, "the range JOIN compares values of different types")
        return RangeJoin(self.public_table, value, low, high, kinds)

    def public_column(self, node: exp.Expression) -> str:
        if not isinstance(node, exp.Column) or not self.public_table:
            self.reject(node, "expected a column of the joined public table")
        if not node.table or node.table.lower() not in self.public_aliases:
            self.reject(node, f"qualify {node.name!r} with the public table's name or alias")
        matches = [n for n in self.public_columns if n.lower() == node.name.lower()]
        if not matches:
            self.reject(
                node, f"unknown column {node.name!r} in table {self.public_table!r}", SchemaError
            )
        return matches[0]

    def having(self, node: exp.Expression, outputs: tuple[Aggregate | GroupKey, ...]) -> Having:
        operators = {exp.GT: False, exp.GTE: True, exp.LT: False, exp.LTE: True}
        if type(node) not in operators:
            self.reject(node, "HAVING supports COUNT(*) > n or COUNT(*) >= n for a number n")
        count, limit = node.this, node.expression
        if isinstance(node, (exp.LT, exp.LTE)):
            count, limit = limit, count
        if not (isinstance(count, exp.Count) and isinstance(count.this, exp.Star)):
            self.reject(node, "HAVING supports COUNT(*) > n or COUNT(*) >= n for a number n")
        negative = isinstance(limit, exp.Neg)
        inner = limit.this if negative else limit
        if not (isinstance(inner, exp.Literal) and not inner.is_string):
            self.reject(limit, "the HAVING threshold must be a number")
        threshold = float(inner.this) * (-1 if negative else 1)
        if not (math.isfinite(threshold) and abs(threshold) <= HAVING_LIMIT):
            self.reject(limit, f"the HAVING threshold must be a number within +-{HAVING_LIMIT}")
        name = next(
            (
                o.name
                for o in outputs
                if isinstance(o, Aggregate) and o.kind is AggregateKind.COUNT and o.column is None
            ),
            None,
        )
        if name is None:
            self.reject(node, "HAVING COUNT(*) needs COUNT(*) in the select list")
        return Having(threshold, operators[type(node)], name)

    def resolve_table(self, source: exp.Expression | None) -> None:
        if source is None:
            self.reject(self.parsed.expression, "the query needs FROM <table>")
        table = source.this
        if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
            self.reject(
                table, "FROM must name one table (subqueries and functions are not supported)"
            )
        for name, value in table.args.items():
            if name not in ("this", "db", "catalog", "alias") and value:
                clause = _CLAUSE_NAMES.get(name, name.upper())
                node = value[0] if isinstance(value, list) else value
                self.reject(
                    node if isinstance(node, exp.Expression) else table,
                    f"{clause} is not supported",
                )
        alias = table.args.get("alias")
        if alias is not None and alias.args.get("columns"):
            self.reject(alias, "column aliases in FROM are not supported")
        self.check_alias(alias)
        if table.args.get("db") or table.args.get("catalog"):
            self.reject(table, "qualified table names are not supported; name the table alone")
        wanted = table.name
        matches = [name for name in self.catalog if name.lower() == wanted.lower()]
        if not matches:
            self.reject(table, _unknown_table(wanted), SchemaError)
        self.table = matches[0]
        self.columns = dict(self.catalog[self.table])
        self.aliases = {self.table.lower(), wanted.lower()}
        if table.alias:
            self.aliases.add(table.alias.lower())

    def column(self, node: exp.Column) -> str:
        if node.args.get("db") or node.args.get("catalog"):
            self.reject(node, f"column reference {node.sql()!r} is qualified too deeply")
        if node.table and node.table.lower() in self.public_aliases:
            self.reject(
                node,
                f"{node.sql()!r}: only the range columns and GROUP BY may use the public table",
            )
        if node.table and node.table.lower() not in self.aliases:
            self.reject(node, f"unknown table or alias {node.table!r}", SchemaError)
        if isinstance(node.this, exp.Star):
            self.reject(node, "* is only allowed inside COUNT(*)")
        matches = [name for name in self.columns if name.lower() == node.name.lower()]
        if not matches:
            self.reject(node, f"unknown column {node.name!r} in table {self.table!r}", SchemaError)
        return matches[0]

    def kind(self, name: str) -> ColumnKind:
        return ColumnKind.of(self.columns[name])

    # WHERE ----------------------------------------------------------------------------------
    def predicate(self, node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Paren):
            return exp.Paren(this=self.predicate(node.this))
        if isinstance(node, (exp.And, exp.Or)):
            return type(node)(
                this=self.predicate(node.this), expression=self.predicate(node.expression)
            )
        if isinstance(node, exp.Not):
            return exp.Not(this=self.predicate(node.this))
        if filters.is_like(node):
            return filters.like(self, node)
        if isinstance(node, _COMPARISONS):
            if filters.is_text_operand(node.this) or filters.is_text_operand(node.expression):
                return filters.text_comparison(self, node, dict(_FLIPPED))
            return self.comparison(node)
        if isinstance(node, exp.Between):
            name = self.predicate_column(node.this, "BETWEEN")
            low = self.operand(node.args["low"], name)
            high = self.operand(node.args["high"], name)
            between = exp.Between(this=exp.column(name, quoted=True), low=low, high=high)
            if not node.args.get("symmetric"):
                return between
            swapped = exp.Between(
                this=exp.column(name, quoted=True), low=high.copy(), high=low.copy()
            )
            return exp.Paren(this=exp.Or(this=between, expression=swapped))
        if isinstance(node, exp.In):
            if node.args.get("query"):
                return filters.unit_filter(self, node)
            name = self.predicate_column(node.this, "IN")
            if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
                self.reject(node, "IN takes a list of literals, not a subquery")
            if not node.expressions:
                self.reject(node, "IN needs at least one value")
            if len(node.expressions) > MAX_IN_VALUES:
                self.reject(
                    node,
                    f"IN lists {len(node.expressions):,} values; dpsql takes at most "
                    f"{MAX_IN_VALUES:,} in one list",
                )
            values = [self.operand(value, name) for value in node.expressions]
            return exp.In(this=exp.column(name, quoted=True), expressions=values)
        if isinstance(node, exp.Is):
            name = self.predicate_column(node.this, "IS")
            if not isinstance(node.expression, exp.Null):
                self.reject(node, "IS is only supported as IS NULL / IS NOT NULL")
            return exp.Is(this=exp.column(name, quoted=True), expression=exp.Null())
        if isinstance(node, exp.Column):
            name = self.column(node)
            if self.kind(name) is not ColumnKind.BOOLEAN:
                self.reject(node, f"column {name!r} is not BOOLEAN and cannot stand alone in WHERE")
            return exp.column(name, quoted=True)
        if isinstance(node, exp.Boolean):
            return node.copy()
        self.reject(
            node,
            f"{node.key.upper()} is not supported in WHERE; use comparisons, "
            "BETWEEN, IN, IS NULL, AND, OR, NOT on columns and literals",
        )
        raise AssertionError

    def predicate_column(self, node: exp.Expression, operator: str) -> str:
        if not isinstance(node, exp.Column):
            self.reject(node, f"the left side of {operator} must be a column")
        return self.column(node)

    def comparison(self, node: exp.Expression) -> exp.Expression:
        left, right = node.this, node.expression
        operator: type[exp.Expression] = type(node)
        if not isinstance(left, exp.Column) and isinstance(right, exp.Column):
            left, right, operator = right, left, _FLIPPED[operator]
        if not isinstance(left, exp.Column):
            self.reject(left, "comparisons must be between a column and a literal")
        if isinstance(right, exp.Column):
            self.reject(node, "comparisons between two columns are not supported")
        name = self.column(left)
        return operator(this=exp.column(name, quoted=True), expression=self.operand(right, name))

    def operand(self, node: exp.Expression, name: str) -> exp.Expression:
        """The value compared with column ``name`` in a comparison, BETWEEN or IN: a typed
        literal (``literal``), or, when this query's literals are slots, a slot left in place
        and noted with its column. These three places are the only ones a slot may stand:
        ``literal`` alone decides what its value becomes (``dpsql.sql.slots``)."""
        index = slot_index(node)
        if index is not None and self.slots is not None:
            self.slots[index] = SlotUse(name)
            return node.copy()
        return self.literal(node, name)

    def literal(self, node: exp.Expression, name: str) -> exp.Expression:
        """A typed literal for comparing with column ``name``, or a precise rejection."""
        kind = self.kind(name)
        self.position = self.parsed.position(node)
        if isinstance(node, exp.Null):
            self.reject(node, f"comparing {name!r} with NULL is never true; use IS NULL")
        coerce: Callable[[exp.Expression, str], exp.Expression] | None = {
            ColumnKind.INTEGER: self.number,
            ColumnKind.FLOAT: self.number,
            ColumnKind.DECIMAL: self.number,
            ColumnKind.STRING: self.string,
            ColumnKind.BOOLEAN: self.boolean,
            ColumnKind.DATE: self.temporal,
            ColumnKind.TIMESTAMP: self.temporal,
        }.get(kind)
        if coerce is None:
            self.reject(
                node, f"column {name!r} has type {self.columns[name]}, which dpsql cannot filter on"
            )
            raise AssertionError
        return coerce(node, name)

    def typed(self, text: str, name: str) -> exp.Expression:
        """``CAST('<text>' AS <type of column name>)``, converted by the database later."""
        cast = exp.Cast(this=exp.Literal.string(text), to=_built_type(self.columns[name]).copy())
        cast.meta["position"] = self.position
        return cast

    def number(self, node: exp.Expression, name: str) -> exp.Expression:
        negative = isinstance(node, exp.Neg)
        inner = node.this if negative else node
        if not isinstance(inner, exp.Literal) or (inner.is_string and negative):
            self.reject(node, f"column {name!r} is numeric; compare it with a number")
        text = ("-" if negative else "") + inner.this
        try:
            finite = Decimal(text).is_finite()
        except InvalidOperation:
            finite = False
        if not finite:
            self.reject(node, f"literal compared with {name!r} is not a finite number")
        return self.typed(text, name)

    def string(self, node: exp.Expression, name: str) -> exp.Expression:
        if not (isinstance(node, exp.Literal) and node.is_string):
            self.reject(node, f"column {name!r} is a string; compare it with a quoted string")
        if is_enum(self.columns[name]):
            return self.typed(node.this, name)  # the database refuses a value not of the ENUM
        return exp.Literal.string(node.this)

    def boolean(self, node: exp.Expression, name: str) -> exp.Expression:
        if not isinstance(node, exp.Boolean):
            self.reject(node, f"column {name!r} is BOOLEAN; compare it with TRUE or FALSE")
        return node.copy()

    def temporal(self, node: exp.Expression, name: str) -> exp.Expression:
        kind = self.kind(name)
        if isinstance(node, exp.Cast) and isinstance(node.this, exp.Literal):
            node = node.this
        if not (isinstance(node, exp.Literal) and node.is_string):
            self.reject(
                node,
                f"column {name!r} is a {kind.value}; compare it with an ISO "
                "string such as '2024-01-31'",
            )
        type_name = self.columns[name]
        if not temporal_pattern(type_name).fullmatch(node.this):
            zone = "TIME ZONE" in type_name.upper() or type_name.upper() == "TIMESTAMPTZ"
            form = (
                "YYYY-MM-DD"
                if kind is ColumnKind.DATE
                else "YYYY-MM-DD HH:MM[:SS[.fraction]]"
                + ("+HH:MM (an offset is required)" if zone else " without an offset or time zone")
            )
            self.reject(
                node,
                f"{node.this!r} is not a {type_name} literal for column {name!r}; write {form}",
            )
        return self.typed(node.this, name)

    # SELECT list and GROUP BY ------------------------------------------------------------------
    def group_nodes(self, select: exp.Select) -> list[exp.Expression]:
        group = select.args.get("group")
        if group is None:
            return []
        for name, value in group.args.items():
            if name != "expressions" and value:
                self.reject(group, f"GROUP BY {name.upper()} is not supported")
        return list(group.expressions)

    def unaliased(self, node: exp.Expression, select: exp.Select) -> exp.Expression:
        """A GROUP BY name that is no column of the table but the alias of a selected column
        stands for that column, as in DuckDB (``SELECT country AS c ... GROUP BY c``)."""
        if not isinstance(node, exp.Column) or node.table or self.public_table:
            return node
        if any(name.lower() == node.name.lower() for name in self.columns):
            return node
        for output in select.expressions:
            if isinstance(output, exp.Alias) and output.alias.lower() == node.name.lower():
                return output.this
        return node

    def group_column(self, node: exp.Expression) -> str:
        if not isinstance(node, exp.Column) and not self.public_table:
            return expressions.group_key(self, node)
        if not isinstance(node, exp.Column):
            self.reject(node, "GROUP BY takes column names only")
        if self.public_table:
            return self.public_column(node)
        return self.column(node)

    def output(self, node: exp.Expression, group_by: tuple[str, ...]) -> Aggregate | GroupKey:
        alias = None
        if isinstance(node, exp.Alias):
            self.check_alias(node.args.get("alias"))
            alias, node = node.alias, node.this
        key = self.group_expressions.get(expressions.normalized(node))
        if key is not None and key in group_by:
            return GroupKey(key, alias or node.sql(dialect=self.parsed.dialect))
        if isinstance(node, exp.Column):
            name = self.public_column(node) if self.public_table else self.column(node)
            if name not in group_by:
                self.reject(node, f"column {name!r} must appear in GROUP BY or inside an aggregate")
            return GroupKey(name, alias or name)
        default = node.sql(dialect=self.parsed.dialect)
        quantile = quantiles.output(self, node, alias or default)
        if quantile is not None:
            return quantile
        if isinstance(node, exp.Filter):
            node = expressions.unfiltered(node)
        kinds = {
            exp.Count: AggregateKind.COUNT,
            exp.Sum: AggregateKind.SUM,
            exp.Avg: AggregateKind.AVG,
        }
        kind = kinds.get(type(node))
        if kind is None:
            refusal = expressions.nearest_rewrite(node)
            if refusal is not None:
                self.reject(node, refusal)
            self.reject(
                node,
                f"{node.sql(dialect=self.parsed.dialect)!r} is not supported in the "
                "select list; use group columns, COUNT, SUM or AVG",
            )
            raise AssertionError
        argument = node.this
        if isinstance(argument, exp.Distinct):
            distinct = argument.expressions
            if kind is not AggregateKind.COUNT or len(distinct) != 1 or not isinstance(
                distinct[0], exp.Column
            ):
                self.reject(
                    node,
                    f"{kind.value.upper()}(DISTINCT ...) is not supported; COUNT(DISTINCT "
                    "privacy_unit) counts persons",
                )
            column = self.column(distinct[0])
            return Aggregate(AggregateKind.PERSONS, column, alias or default)
        if node.args.get("expressions"):
            self.reject(node, f"{kind.value.upper()} takes one argument")
        if isinstance(argument, exp.Star):
            if kind is not AggregateKind.COUNT:
                self.reject(node, f"{kind.value.upper()}(*) is not valid")
            return Aggregate(kind, None, alias or default)
        if not isinstance(argument, exp.Column):
            column = f"{expressions.PREFIX}{len(self.virtual)}"
            self.virtual[column] = expressions.argument(self, argument, kind.value.upper())
            self.virtual[column].meta["text"] = argument.sql(dialect=self.parsed.dialect)
            return Aggregate(kind, column, alias or default)
        column = self.column(argument)
        if kind is not AggregateKind.COUNT and not self.kind(column).numeric:
            self.reject(
                node,
                f"{kind.value.upper()} needs a numeric column; {column!r} is "
                f"{self.columns[column]}",
            )
        return Aggregate(kind, column, alias or default)


def analyze(
    parsed: ParsedQuery,
    catalog: Mapping[str, Mapping[str, str]],
    slots: dict[int, SlotUse] | None = None,
) -> QueryShape:
    """Validate ``parsed`` against the allow-list and the catalog (table -> column -> type).

    Post-processing of the released answer (ORDER BY, LIMIT, arithmetic, windows, ...) is split
    off first (``dpsql.sql.postprocess``); the shape then carries it in ``post``. With ``slots``
    (an empty dict), ``parsed`` is a template whose literals are slots (``dpsql.sql.slots``): a
    slot is accepted only as a compared value or a LIKE's (or text function's) quoted string, left
    in the WHERE clause, and noted in ``slots`` with its use."""
    parsed = ctes.inline(parsed, catalog)
    try:
        inner, post = postprocess.split(parsed, catalog)
    except (UnsupportedQueryError, SchemaError, SqlSyntaxError):
        source = postprocess.source_only(parsed)
        if source is not None:
            Analyzer(source, catalog).shape()  # FROM and WHERE are read first
        raise
    shape = Analyzer(inner, catalog, slots).shape()
    if post is None:
        return shape
    post = dataclasses.replace(post, types=postprocess.released_types(shape, catalog))
    postprocess.check(post)
    return dataclasses.replace(shape, post=post)


def literal_for(
    parsed: ParsedQuery, columns: Mapping[str, str], node: exp.Expression, name: str
) -> exp.Expression:
    """What the analyzer makes of literal ``node`` compared with column ``name`` (of a table
    whose columns have types ``columns``) in ``parsed``: the value a template's slot takes
    (``dpsql.sql.slots``), decided by the same ``Analyzer.literal`` as in a parsed query."""
    analyzer = Analyzer(parsed, {})
    analyzer.columns = columns  # type: ignore[assignment]  # read only
    return analyzer.literal(node, name)


def pattern_for(parsed: ParsedQuery, node: exp.Expression, operator: str) -> exp.Expression:
    """What the analyzer makes of ``node`` as the quoted string of ``operator`` (a LIKE, a
    comparison of lower/upper/trim of a column) in ``parsed``: the value a template's pattern
    slot takes, decided by the same ``filters.pattern`` as in a parsed query."""
    return filters.pattern(Analyzer(parsed, {}), node, operator)


def check_filter(
    parsed: ParsedQuery, node: exp.Expression, columns: Mapping[str, str]
) -> exp.Expression:
    """``node``, a per-row filter over ``columns`` (name -> type) inside a subquery, checked
    against the WHERE allow-list and returned with typed literals (``dpsql.sql.relations``)."""
    analyzer = Analyzer(parsed, {"": columns})
    analyzer.columns = dict(columns)
    for found in node.find_all(exp.In):
        if found.args.get("query"):
            analyzer.reject(found, "a subquery's WHERE cannot hold another subquery")
    return analyzer.predicate(node)


def _unknown_table(name: str) -> str:
    """The same words whether the table is missing or outside the policy: which tables exist
    beyond the policy is not the analyst's to learn."""
    return f"unknown table {name!r}: a query may name the policy's tables and public tables only"


RESERVED_WORDS = frozenset(
    {
        "ALL",
        "ANALYSE",
        "ANALYZE",
        "AND",
        "ANY",
        "ARRAY",
        "AS",
        "ASC",
        "ASYMMETRIC",
        "BOTH",
        "CASE",
        "CAST",
        "CHECK",
        "COLLATE",
        "COLUMN",
        "CONSTRAINT",
        "CREATE",
        "DEFAULT",
        "DEFERRABLE",
        "DESC",
        "DESCRIBE",
        "DISTINCT",
        "DO",
        "ELSE",
        "END",
        "EXCEPT",
        "FALSE",
        "FETCH",
        "FOR",
        "FOREIGN",
        "FROM",
        "GROUP",
        "HAVING",
        "IN",
        "INITIALLY",
        "INTERSECT",
        "INTO",
        "LAMBDA",
        "LATERAL",
        "LEADING",
        "LIMIT",
        "NOT",
        "NULL",
        "OFFSET",
        "ON",
        "ONLY",
        "OR",
        "ORDER",
        "PIVOT",
        "PIVOT_LONGER",
        "PIVOT_WIDER",
        "PLACING",
        "PRIMARY",
        "QUALIFY",
        "REFERENCES",
        "RETURNING",
        "SELECT",
        "SHOW",
        "SOME",
        "SUMMARIZE",
        "SYMMETRIC",
        "TABLE",
        "THEN",
        "TO",
        "TRAILING",
        "TRUE",
        "UNION",
        "UNIQUE",
        "UNPIVOT",
        "USING",
        "VARIADIC",
        "WHEN",
        "WHERE",
        "WINDOW",
        "WITH",
    }
)
"""DuckDB's reserved keywords (``duckdb_keywords()``, category 'reserved'), which no unquoted
alias may be."""
