"""Prepared queries: a text bound again with other literals, without parsing it.

An analyst (or a dashboard) asks one query many times with other values in its WHERE clause.
Parsing and checking such a text again costs most of its Python work, yet only the literals
changed. A *template* is the query's bind with a slot where each literal stood
(``dpsql.sql.slots``); a text with the same skeleton (the same tokens but its literals) is bound
by filling the slots, and everything after the bind runs as for any text.

Why this is the bind of the text itself, not an approximation of it:

* **Same tokens, same tree.** The skeleton fixes every token but the literals' values: their
  types, the other tokens' text and the comments. The template's tree is parsed from the text
  with each literal replaced by a string marker; a template is made only when that tree holds no
  join, subquery, CTE or set operation (so nothing lifts it into a relation) and every marker is
  found once, as a literal. The parser makes the same nodes around any literal's text in the
  places a slot may stand (a minus, a typed literal such as ``DATE '...'``); where it reads a
  literal's text (an INTERVAL's unit, adjacent strings) it wraps the literal in a node no
  deciding function reads through, so no template is made.
* **The analysis never reads a value.** The template is analysed with slots, opaque
  placeholders named with a random nonce. The analyzer takes a slot only as the value compared
  with a column (comparison, BETWEEN, IN: ``Analyzer.operand``) or as the quoted string of a
  LIKE or of a comparison of lower/upper/trim of a column (``filters.pattern``), and leaves it in
  the WHERE clause; anywhere else a slot is refused like any node that is not a literal, and the
  template is not made. A template is also refused if a slot was left anywhere but the WHERE
  clause.
* **Each value is decided as in a parsed text.** Filling a slot calls the function that decides
  it in a parsed text (the analyzer's ``literal``, or ``filters.pattern``) on the node the parser
  makes of the literal's token, with its position; then the binder runs in full
  (``Binder.bind``: conversion in the database, collations, partitions, domains), exactly as for
  a parsed text.
* **Checked when made.** A template is kept only if filling it with the literals of the text it
  was made from gives the very bind of that text: the same shape (``repr``) and the same text
  for the ledger. It is kept for one policy entry and one catalog (``dpsql.memo.Kept``, by
  their identity), so a new policy or table makes templates afresh.
* **Any refusal comes from the parsed text.** If filling a template fails, the text is parsed
  and bound afresh, so the refusal, its message and its position are those of a parsed text.

A template is made on a skeleton's second sighting: a text asked once pays for no template.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.generator import Generator

from dpsql import deadline
from dpsql.engine.literals import Binder, BoundShape
from dpsql.engine.policy import Policy
from dpsql.sql.analyze import analyze, literal_for, pattern_for
from dpsql.sql.parse import ParsedQuery, parse
from dpsql.sql.shape import QueryShape
from dpsql.sql.slots import (
    Path,
    Skeleton,
    SlotUse,
    TextTemplate,
    filled,
    literal_node,
    marked_text,
    mentions_slot,
    node_at,
    operand_paths,
    token_literal,
    with_slots,
)

if TYPE_CHECKING:
    from dpsql.engine.query import BoundQuery

__all__ = ["Filled", "Template", "fill", "template_for"]

_NO_TEMPLATE = (exp.Join, exp.Subquery, exp.With, exp.SetOperation, exp.Placeholder, exp.Parameter)
"""Nodes that keep a text from having a template: what could lift it into a relation
(``dpsql.engine.relations``), and placeholders the analyst wrote."""

_EMPTY = exp.Select()


class Filled(NamedTuple):
    """A text bound from its template: its bound shape and its text for the ledger."""

    bound: BoundShape
    normalized: str


@dataclass(frozen=True)
class Template:
    """A query's bind with slots for its literals (module doc).

    ``shape`` is the analysed shape, before the binder, with slot operands in its WHERE clause;
    ``uses`` where the analysis met each slot (a compared value, or a LIKE's quoted string);
    ``paths`` where each slot's operand (the slot, inside any minus or typed literal) stands in
    that WHERE clause; ``normalized`` the ledger's text of the query, split at its literals;
    ``dialect`` the dialect the ledger's text is written in."""

    shape: QueryShape
    uses: dict[int, SlotUse]
    paths: dict[int, tuple[Path, ...]]
    normalized: TextTemplate
    dialect: str


def fill(
    template: Template,
    sql: str,
    skeleton: Skeleton,
    *,
    dialect: str,
    policy: Policy,
    binder: Binder,
) -> Filled:
    """The bind of ``sql`` (whose skeleton is the template's) from ``template``: its bound
    shape and its text for the ledger (``dpsql.engine.query.BoundQuery`` holds them).

    Args:
        template: the template of ``sql``'s skeleton.
        sql: the analyst's text.
        skeleton: its skeleton, with its literal tokens.
        dialect: the dialect ``sql`` is written in.
        policy: the policy in force (the template's).
        binder: the session's binder.
    """
    parsed = ParsedQuery(sql, dialect, _EMPTY, {}, ())  # positions of the literals, in sql
    columns = template.shape.types
    where = template.shape.where
    assert where is not None  # a template has a slot, hence a WHERE clause
    values: dict[int, exp.Expression] = {}
    for index, use in template.uses.items():
        operand = node_at(where, template.paths[index][0])
        node = literal_node(skeleton.literals[index], operand)
        if use.pattern:
            values[index] = pattern_for(parsed, node, use.name)
        else:
            values[index] = literal_for(parsed, columns, node, use.name)
    shape = replace(template.shape, where=filled(where, template.paths, values))
    deadline.check()
    writer = _writer(template.dialect)
    spelled = [writer.sql(token_literal(token)) for token in skeleton.literals]
    return Filled(binder.bind(shape, policy), template.normalized.fill(spelled))


@functools.cache
def _writer(dialect: str) -> Generator:
    """sqlglot's writer for ``dialect``, kept to write literals: writing a literal reads only
    the dialect's settings (its quotes and escapes), never the writer's state."""
    return Dialect.get_or_raise(dialect).generator()


def template_for(
    sql: str,
    skeleton: Skeleton,
    bound: BoundQuery,
    *,
    dialect: str,
    catalog: dict[str, dict[str, str]],
    binder: Binder,
    ledger_dialect: str,
) -> Template | None:
    """The template of ``sql``'s skeleton, or None when it cannot have one (module doc).

    Args:
        sql: a text that was bound.
        skeleton: its skeleton.
        bound: its bind (``dpsql.engine.query.bind``), which the template must reproduce.
        dialect: the dialect ``sql`` is written in.
        catalog: the tables the analyst may name.
        binder: the binder that bound it.
        ledger_dialect: the dialect of the ledger's text (the backend's).
    """
    count = len(skeleton.literals)
    if bound.bound.shape.relation is not None:
        return None
    try:
        marked = parse(marked_text(sql, skeleton.literals), dialect)
    except Exception:
        return None
    if any(marked.expression.find_all(*_NO_TEMPLATE)):
        return None
    slotted = with_slots(marked.expression, count)
    normalized = TextTemplate.of(marked.expression.sql(dialect=ledger_dialect), count)
    if slotted is None or normalized is None:
        return None
    uses: dict[int, SlotUse] = {}
    try:
        shape = analyze(replace(marked, expression=slotted), catalog, uses)
    except Exception:
        return None
    if sorted(uses) != list(range(count)) or shape.where is None:
        return None
    if mentions_slot(repr(replace(shape, where=None))):
        return None  # a slot outside the WHERE clause: its value would not be decided
    paths = operand_paths(shape.where)
    if sorted(paths) != list(range(count)) or any(() in places for places in paths.values()):
        return None  # every slot stands in the WHERE clause, below its root
    template = Template(shape, uses, paths, normalized, ledger_dialect)
    try:
        again = fill(template, sql, skeleton, dialect=dialect, policy=bound.policy, binder=binder)
    except Exception:
        return None
    same = again.normalized == bound.normalized and repr(again.bound) == repr(bound.bound)
    return template if same else None
