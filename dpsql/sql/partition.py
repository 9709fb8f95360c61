"""Which declared values of a partition column a WHERE clause may read, decided by the database.

The charged set of values and the rows the generated SQL reads must agree by construction, in the
database's own semantics (types, casts, collations), not in a second model of them. So:

1. ``domain_probe`` builds a query that evaluates the WHERE clause over the declared values of the
   partition column, every condition on another column replaced by NULL (unknown). Under SQL's
   three-valued logic a clause that is FALSE with some conditions unknown is FALSE whatever they
   are (Kleene logic is monotone), so a value for which it is not FALSE is one some row may pass:
   that value is charged. The database runs the probe; it reads no table.
2. ``restrict`` adds ``AND column IN (<the charged values>)`` to the clause the generated SQL
   runs. Whatever the probe decided, no row outside the charged values is ever read: a gap in
   the reasoning can make an answer smaller, never free.

>>> import sqlglot
>>> where = sqlglot.parse_one("SELECT 1 FROM t WHERE c = 'DK' OR age > 3").args["where"].this
>>> probe = domain_probe(where, "c", [exp.Literal.string("DK"), exp.Literal.string("NO")])
>>> probe.split(" WHERE ")[1]
"(c = 'DK' OR CAST(NULL AS BOOLEAN)) IS NOT FALSE ORDER BY __i"
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

__all__ = ["domain_probe", "literal_value", "mentions", "restrict"]

_CONNECTIVES = (exp.And, exp.Or, exp.Not, exp.Paren)


def mentions(node: exp.Expression | None, column: str) -> bool:
    """Whether ``node`` refers to ``column``."""
    return node is not None and any(c.name == column for c in node.find_all(exp.Column))


def _keep_only(node: exp.Expression, column: str) -> exp.Expression:
    """``node`` with every condition that refers to another column replaced by NULL."""
    if isinstance(node, _CONNECTIVES):
        node = node.copy()
        for key in ("this", "expression"):
            child = node.args.get(key)
            if isinstance(child, exp.Expression):
                node.set(key, _keep_only(child, column))
        return node
    others = {c.name for c in node.find_all(exp.Column)} - {column}
    if others:
        return exp.cast(exp.Null(), "BOOLEAN")
    return node.copy()


def domain_probe(where: exp.Expression, column: str, values: Sequence[exp.Expression]) -> str:
    """SQL (DuckDB dialect) listing the positions in ``values`` (typed literals of the partition
    column) for which ``where`` may hold on some row."""
    rows = ", ".join(f"({i}, {v.sql(dialect='duckdb')})" for i, v in enumerate(values))
    name = exp.to_identifier(column, quoted=True).sql(dialect="duckdb")
    condition = _keep_only(where, column).sql(dialect="duckdb")
    return (
        f"SELECT __i FROM (VALUES {rows}) AS __domain(__i, {name}) "
        f"WHERE ({condition}) IS NOT FALSE ORDER BY __i"
    )


def restrict(
    where: exp.Expression | None, column: str, values: Sequence[exp.Expression]
) -> exp.Expression:
    """``where AND column IN (values)``: the clause the generated SQL runs."""
    inside = exp.In(this=exp.column(column, quoted=True), expressions=[v.copy() for v in values])
    if where is None:
        return inside
    return exp.And(this=exp.Paren(this=where.copy()), expression=inside)


def literal_value(node: exp.Expression) -> str | int | float | bool:
    """The Python value of a typed literal produced by ``analyze`` (ValueError if not one)."""
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.Cast) and isinstance(node.this, exp.Literal):
        text = node.this.this
        target = node.to
        if target.is_type(*exp.DataType.INTEGER_TYPES):
            return int(text)
        if target.is_type(exp.DataType.Type.FLOAT, exp.DataType.Type.DOUBLE):
            return float(text)
        return text
    if isinstance(node, exp.Literal) and node.is_string:
        return node.this
    raise ValueError(f"not a literal: {node.sql()}")
