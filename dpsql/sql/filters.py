"""Filters beyond column-vs-literal comparisons: text matching and person-level filters.

* ``LIKE`` / ``ILIKE`` / ``NOT LIKE`` with a string-literal pattern, ``starts_with(col, 'p')``
  and ``prefix(col, 'p')`` on a string column;
* ``lower`` / ``upper`` / ``trim`` of a string column compared with, or matched against, a string
  literal;
* ``unit IN (SELECT unit FROM <the same table> WHERE ...)`` (and ``NOT IN``): a person-level
  filter that keeps every row of the persons who have (or have not) a row passing the inner
  WHERE.

All of them are evaluated by the database in the generated SQL exactly as written, like every
other WHERE condition: the literals are strings (no conversion), the columns must compare bytewise
(the binder's collation probe covers every column the clause mentions), and on a table with a
partition column the probe of ``dpsql.sql.partition`` evaluates these conditions over the declared
values in the database itself.

Why a person-level filter keeps the guarantee: whether a row of person *p* passes
``unit IN (SELECT unit FROM t WHERE q)`` depends only on *p*'s own rows (the subquery returns *p*'s
unit iff one of *p*'s rows satisfies *q*). So on neighbouring tables, which differ in the rows of
one person, the filtered tables differ in at most that person's rows; the contribution bounds and
noise of the aggregate then apply to the filtered table unchanged (the filter is a per-person
map, and a per-person map of neighbours gives neighbours). The inner query reads rows the outer
WHERE may exclude, so on a table with a partition column the inner WHERE could read partitions
the charge does not cover: there the filter is refused (see ``check_unit_filters``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlglot import exp

from dpsql.errors import UnsupportedQueryError
from dpsql.sql.shape import ColumnKind
from dpsql.sql.slots import SlotUse, slot_index

if TYPE_CHECKING:
    from dpsql.sql.analyze import Analyzer
    from dpsql.sql.shape import QueryShape

__all__ = [
    "check_unit_filters",
    "is_text_operand",
    "like",
    "pattern",
    "text_operand",
    "unit_filter",
]

_TEXT_FUNCTIONS = (exp.Lower, exp.Upper, exp.Trim)
_PREFIX_FUNCTIONS = {"prefix", "starts_with"}
_LIKE_ARGS = {"this", "expression", "negate"}
"""What a LIKE node may carry; sqlglot spells ``NOT LIKE`` as ``negate``, and anything else
it might add is refused rather than dropped."""


def is_text_operand(node: exp.Expression) -> bool:
    """``lower``, ``upper`` or ``trim`` (both sides, spaces) of a column, or of one of these."""
    if not isinstance(node, _TEXT_FUNCTIONS):
        return False
    extra = {k for k, v in node.args.items() if v and k != "this"}
    return not extra and (isinstance(node.this, exp.Column) or is_text_operand(node.this))


def text_operand(analyzer: Analyzer, node: exp.Expression, operator: str) -> exp.Expression:
    """A string column, or lower/upper/trim of one, as the generated SQL spells it."""
    functions = []
    inner = node
    while is_text_operand(inner):
        functions.append(type(inner))
        inner = inner.this
    if not isinstance(inner, exp.Column):
        analyzer.reject(
            node,
            f"the left side of {operator} must be a string column, or lower/upper/trim of one",
        )
    name = analyzer.column(inner)
    if analyzer.kind(name) is not ColumnKind.STRING:
        analyzer.reject(
            node, f"{operator} needs a string column; {name!r} is {analyzer.columns[name]}"
        )
    emitted: exp.Expression = exp.column(name, quoted=True)
    for function in reversed(functions):
        emitted = function(this=emitted)
    return emitted


def text_comparison(analyzer: Analyzer, node: exp.Expression, flipped: dict) -> exp.Expression:
    """``lower(col) = 'x'`` and its kin (either side), re-emitted."""
    left, right, operator = node.this, node.expression, type(node)
    if not is_text_operand(left):
        left, right, operator = right, left, flipped[operator]
    return operator(
        this=text_operand(analyzer, left, "the comparison"),
        expression=pattern(analyzer, right, f"comparing {left.sql()}"),
    )


def pattern(analyzer: Analyzer, node: exp.Expression, operator: str) -> exp.Expression:
    """The quoted string ``operator`` takes, re-emitted; in a template, a slot left in place
    and noted (``dpsql.sql.slots``): this function alone decides what its value becomes."""
    index = slot_index(node) if isinstance(node, exp.Placeholder) else None
    if index is not None and analyzer.slots is not None:
        analyzer.slots[index] = SlotUse(operator, pattern=True)
        return node.copy()
    if not (isinstance(node, exp.Literal) and node.is_string):
        analyzer.reject(node, f"{operator} takes a quoted string literal")
    return exp.Literal.string(node.this)


def like(analyzer: Analyzer, node: exp.Expression) -> exp.Expression:
    """``LIKE``/``ILIKE``/``starts_with``/``prefix`` of a string column and a literal."""
    if isinstance(node, exp.Escape):
        analyzer.reject(node, "LIKE ... ESCAPE is not supported; match without an escape")
    if isinstance(node, exp.Anonymous):
        if node.name.lower() not in _PREFIX_FUNCTIONS or len(node.expressions) != 2:
            raise AssertionError
        column, quoted = node.expressions
        operator = node.name.lower()
        return exp.StartsWith(
            this=text_operand(analyzer, column, operator),
            expression=pattern(analyzer, quoted, operator),
        )
    operator = {exp.Like: "LIKE", exp.ILike: "ILIKE", exp.StartsWith: "starts_with"}[type(node)]
    extra = sorted(k for k, v in node.args.items() if v and k not in _LIKE_ARGS)
    if extra:
        analyzer.reject(node, f"{operator} with {', '.join(extra).upper()} is not supported")
    matched = type(node)(
        this=text_operand(analyzer, node.this, operator),
        expression=pattern(analyzer, node.expression, operator),
    )
    return exp.Not(this=matched) if node.args.get("negate") else matched


def is_like(node: exp.Expression) -> bool:
    return isinstance(node, (exp.Like, exp.ILike, exp.StartsWith, exp.Escape)) or (
        isinstance(node, exp.Anonymous) and node.name.lower() in _PREFIX_FUNCTIONS
    )


def unit_filter(analyzer: Analyzer, node: exp.In) -> exp.Expression:
    """``col IN (SELECT col FROM <same table> [WHERE ...])``, checked and re-emitted; the
    binder checks that ``col`` is the privacy unit (``check_unit_filters``)."""
    hint = (
        "IN (SELECT ...) is supported as a person-level filter only: "
        "unit IN (SELECT unit FROM the_same_table WHERE ...)"
    )
    if any(v for k, v in node.args.items() if k not in ("this", "query")):
        analyzer.reject(node, hint)
    subquery = node.args["query"]
    inner = subquery.this if isinstance(subquery, exp.Subquery) else subquery
    if not isinstance(inner, exp.Select) or not isinstance(node.this, exp.Column):
        analyzer.reject(node, hint)
    allowed = {"expressions", "from", "from_", "where"}
    for key, value in inner.args.items():
        if value and key not in allowed:
            analyzer.reject(inner, hint)
    source = inner.args.get("from_") or inner.args.get("from")
    table = source.this if source is not None else None
    if (
        not isinstance(table, exp.Table)
        or table.name.lower() not in analyzer.aliases
        or table.args.get("db")
        or len(inner.expressions) != 1
        or not isinstance(inner.expressions[0], exp.Column)
    ):
        analyzer.reject(inner, hint)
    outer = analyzer.column(node.this)
    saved = analyzer.aliases
    # Inside the subquery only its own table is in scope: no correlation with the outer row.
    analyzer.aliases = {table.name.lower()} | ({table.alias.lower()} if table.alias else set())
    try:
        selected = analyzer.column(inner.expressions[0])
        if selected != outer:
            analyzer.reject(inner.expressions[0], hint)
        where = inner.args.get("where")
        predicate = analyzer.predicate(where.this) if where is not None else None
    finally:
        analyzer.aliases = saved
    body = exp.select(exp.column(outer, quoted=True)).from_(
        exp.Table(this=exp.to_identifier(analyzer.table, quoted=True))
    )
    if predicate is not None:
        body = body.where(predicate, copy=False)
    return exp.In(this=exp.column(outer, quoted=True), query=exp.Subquery(this=body))


def check_unit_filters(shape: QueryShape, unit: str | None, partition: str | None) -> None:
    """Refuse an IN-subquery filter on a column other than the privacy unit ``unit``, or on a
    table with a partition column (its inner WHERE could read partitions the charge does not
    cover)."""
    if shape.where is None or unit is None:
        return  # a table outside the policy is refused by the planner
    for found in shape.where.find_all(exp.In):
        if not found.args.get("query"):
            continue
        if found.this.name != unit:
            raise UnsupportedQueryError(
                f"IN (SELECT ...) filters persons: it must be on the privacy unit {unit!r}, not "
                f"{found.this.name!r}"
            )
        if partition is not None:
            raise UnsupportedQueryError(
                "a person-level filter (unit IN (SELECT ...)) is not supported on a table with "
                f"a partition column ({partition!r}): filter on the rows' own values instead"
            )
