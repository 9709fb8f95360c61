"""Common table expressions that only filter and project one table, inlined into the query.

``WITH u AS (SELECT * FROM males WHERE "union" = 'yes') SELECT COUNT(*) FROM u`` is the query
``SELECT COUNT(*) FROM males WHERE ("union" = 'yes')``: a CTE whose body is ``SELECT <*, or
columns of the table> FROM <a table or an earlier such CTE> [WHERE ...]`` selects a subset of the
table's rows and columns, so reading it is reading the table under the conjunction of the filters.
``inline`` rewrites the query that way, and the allow-list then checks the result like any other
query: the filters are typed, probed for partitions and charged exactly as if written in WHERE.
Each person's influence stays on their own rows, since a row passes or fails on its own values.

Anything else in a CTE (aggregates, joins, renamed or computed columns, DISTINCT, LIMIT, a CTE
used twice or inside a subquery) is refused with the nearest supported rewrite.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from sqlglot import exp

from dpsql.errors import SchemaError, UnsupportedQueryError
from dpsql.sql.parse import ParsedQuery

__all__ = ["inline"]

_BODY_ARGS = {"expressions", "from", "from_", "where"}
_HINT = (
    "a CTE may only filter and project one table: WITH name AS (SELECT * or columns FROM "
    "table WHERE ...); aggregate in the main query"
)


@dataclass(frozen=True)
class _View:
    table: exp.Table
    where: exp.Expression | None
    columns: frozenset[str] | None
    """Lower-case names of the columns it keeps (None: all)."""


class _Inliner:
    def __init__(self, parsed: ParsedQuery, catalog: Mapping[str, Mapping[str, str]]):
        self.parsed = parsed
        self.catalog = {name.lower(): columns for name, columns in catalog.items()}

    def reject(self, node: exp.Expression, message: str, error: type = UnsupportedQueryError):
        line, column = self.parsed.position(node)
        raise error(message, line=line, column=column)

    def view(self, cte: exp.CTE, views: dict[str, _View]) -> _View:
        body = cte.this
        if not isinstance(body, exp.Select):
            self.reject(cte, _HINT)
        if cte.args.get("alias") is not None and cte.args["alias"].args.get("columns"):
            self.reject(cte, "column names after a CTE's name are not supported; " + _HINT)
        for key, value in body.args.items():
            if value and key not in _BODY_ARGS:
                self.reject(body, _HINT)
        source = body.args.get("from_") or body.args.get("from")
        table = source.this if source is not None else None
        if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
            self.reject(body, _HINT)
        base = views.get(table.name.lower())
        if base is None:
            if table.name.lower() not in self.catalog:
                self.reject(table, f"unknown table {table.name!r}", SchemaError)
            base = _View(exp.Table(this=exp.to_identifier(table.name, quoted=True)), None, None)
        columns: set[str] | None = set()
        for item in body.expressions:
            if isinstance(item, exp.Star):
                columns = None
                break
            if not isinstance(item, exp.Column) or isinstance(item.this, exp.Star):
                self.reject(item, "a CTE may select * or columns of its table, as they are named")
            assert columns is not None
            columns.add(item.name.lower())
        if columns is not None and base.columns is not None:
            missing = columns - base.columns
            if missing:
                self.reject(body, f"unknown column {sorted(missing)[0]!r}", SchemaError)
        kept = base.columns if columns is None else frozenset(columns)
        where = body.args.get("where")
        condition = _unqualified(where.this) if where is not None else None
        return _View(base.table, _and(base.where, condition), kept)

    def inline(self) -> ParsedQuery:
        select = self.parsed.expression
        key = "with_" if "with_" in select.args else "with"
        with_ = select.args.get(key)
        if with_ is None:
            return self.parsed
        if with_.args.get("recursive"):
            self.reject(with_, "WITH RECURSIVE is not supported; " + _HINT)
        views: dict[str, _View] = {}
        for cte in with_.expressions:
            views[cte.alias.lower()] = self.view(cte, views)
        query = select.copy()
        query.set(key, None)
        source = query.args.get("from_") or query.args.get("from")
        table = source.this if source is not None else None
        uses = [t for t in query.find_all(exp.Table) if t.name.lower() in views]
        if not isinstance(table, exp.Table) or table.name.lower() not in views:
            if uses:
                self.reject(uses[0], "a CTE can be read in the main query's FROM only")
            return replace(self.parsed, expression=query)
        if len(uses) > 1:
            self.reject(uses[1], "a CTE can be read once, in the main query's FROM only")
        view = views[table.name.lower()]
        if view.columns is not None:
            for column in query.find_all(exp.Column):
                if isinstance(column.this, exp.Identifier) and (
                    column.name.lower() not in view.columns and not _is_output_alias(column, query)
                ):
                    self.reject(
                        column,
                        f"unknown column {column.name!r} in CTE {table.name!r}",
                        SchemaError,
                    )
        replacement = view.table.copy()
        replacement.set("alias", exp.TableAlias(this=exp.to_identifier(table.alias or table.name)))
        replacement.meta.update(table.meta)
        table.replace(replacement)
        where = query.args.get("where")
        combined = _and(view.where, where.this if where is not None else None)
        if combined is not None:
            query.set("where", exp.Where(this=combined))
        return replace(self.parsed, expression=query)


def _is_output_alias(column: exp.Column, query: exp.Select) -> bool:
    return not column.table and any(
        isinstance(e, exp.Alias) and e.alias.lower() == column.name.lower()
        for e in query.expressions
    )


def _unqualified(node: exp.Expression) -> exp.Expression:
    """``node`` with table qualifiers dropped (one table is in scope once inlined)."""
    node = node.copy()
    for column in node.find_all(exp.Column):
        column.set("table", None)
    return node


def _and(left: exp.Expression | None, right: exp.Expression | None) -> exp.Expression | None:
    if left is None:
        return right
    if right is None:
        return left
    return exp.And(this=exp.Paren(this=left), expression=exp.Paren(this=right))


def inline(parsed: ParsedQuery, catalog: Mapping[str, Mapping[str, str]]) -> ParsedQuery:
    """``parsed`` with its filtering CTEs inlined (unchanged when it has none)."""
    if not isinstance(parsed.expression, exp.Select):
        return parsed
    return _Inliner(parsed, catalog).inline()
