"""Literal slots: a query text with its literals taken out, so that the same text with other
literals is known again without parsing it (``dpsql.engine.prepared`` binds it).

A text's *skeleton* is its tokens as sqlglot's tokenizer reads them, each number and quoted
string of its WHERE clause replaced by a slot: the token types, the text of every other token
(literals elsewhere included: a LIMIT, a HAVING threshold, an option) and the comments, in order.
Two texts with one skeleton differ only in the values of their WHERE clause's literals. The
skeleton is a string that names each token by its type and the ``repr`` of its text: ``repr``
writes every string unambiguously, so two different token lists never share a skeleton. Which
literals are slots is read from the tokens (those after the outermost WHERE, up to the clause
that follows it); it decides only which texts share a template, never what a template binds: a
slot that lands anywhere but a compared value in the WHERE clause keeps the text from having a
template (``dpsql.engine.prepared``).

A template is analysed once with a *slot* where each literal stood: a ``Placeholder`` named with
this process's random nonce (an analyst cannot write one). The analyzer accepts a slot only as
the value a column is compared with (``Analyzer.operand``) and refuses it anywhere else, so the
analysis of a template never reads a literal's value; the value is decided later, per text, by
the analyzer's own ``literal`` (``dpsql.sql.analyze.literal_for``).

>>> from dpsql.sql.parse import tokenized
>>> tokens = tokenized("SELECT COUNT(*) FROM t WHERE x > 5 AND s = 'a'")[1]
>>> found = skeleton_of(tokens)
>>> [token.text for token in found.literals]
['5', 'a']
>>> found.key == skeleton_of(tokenized("SELECT COUNT(*) FROM t WHERE x > 7 AND s = 'b'")[1]).key
True
>>> found.key == skeleton_of(tokenized("SELECT COUNT(*) FROM t WHERE y > 7 AND s = 'b'")[1]).key
False
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlglot import exp
from sqlglot.tokens import Token, TokenType

__all__ = [
    "SLOT_TOKENS",
    "Skeleton",
    "SlotUse",
    "TextTemplate",
    "filled",
    "literal_node",
    "marked_text",
    "marker",
    "mentions_slot",
    "node_at",
    "operand_paths",
    "skeleton_of",
    "slot_index",
    "token_literal",
    "with_slots",
]

SLOT_TOKENS = frozenset({TokenType.NUMBER, TokenType.STRING})
"""The tokens that become slots: numbers and plain quoted strings (not national, hex, bit, raw
or dollar-quoted strings, whose text stays in the skeleton)."""

_NONCE = secrets.token_hex(8)
_PREFIX = f"__dpsql_slot_{_NONCE}_"
_MARKED = re.compile(rf"'{_PREFIX}(\d+)'")


@dataclass(frozen=True)
class Skeleton:
    """A text's skeleton (``key``) and its literal tokens in order (``literals``)."""

    key: str
    literals: tuple[Token, ...]


_AFTER_WHERE = frozenset(
    {
        TokenType.GROUP_BY,
        TokenType.HAVING,
        TokenType.QUALIFY,
        TokenType.WINDOW,
        TokenType.ORDER_BY,
        TokenType.LIMIT,
        TokenType.OFFSET,
        TokenType.FETCH,
        TokenType.UNION,
        TokenType.INTERSECT,
        TokenType.EXCEPT,
        TokenType.SEMICOLON,
    }
)
"""Tokens that end a WHERE clause, outside parentheses."""


@dataclass(frozen=True)
class SlotUse:
    """Where the analysis of a template met a slot: as the value compared with column ``name``,
    or (``pattern``) as the quoted string a LIKE or a text function's comparison takes
    (``name``: the operator, as its refusals name it)."""

    name: str
    pattern: bool = False


def skeleton_of(tokens: Sequence[Token]) -> Skeleton | None:
    """The skeleton of a text's ``tokens``; None when its WHERE clause has no literal (nothing
    to take out)."""
    parts: list[str] = []
    literals: list[Token] = []
    depth = 0
    where = False
    for token in tokens:
        kind = token.token_type
        if kind == TokenType.L_PAREN:
            depth += 1
        elif kind == TokenType.R_PAREN:
            depth -= 1
        elif depth == 0 and kind == TokenType.WHERE:
            where = True
        elif depth == 0 and kind in _AFTER_WHERE:
            where = False
        if where and kind in SLOT_TOKENS:
            parts.append(token.token_type.name)
            literals.append(token)
        else:
            parts.append(f"{token.token_type.name}{token.text!r}")
        if token.comments:
            parts.append(repr(token.comments))
    if not literals:
        return None
    return Skeleton(" ".join(parts), tuple(literals))


def marker(index: int) -> str:
    """The text that stands for literal ``index`` while a template is parsed."""
    return f"{_PREFIX}{index}"


def marked_text(sql: str, literals: Sequence[Token]) -> str:
    """``sql`` with each literal token replaced by its quoted marker."""
    pieces: list[str] = []
    end = 0
    for index, token in enumerate(literals):
        pieces.append(sql[end : token.start])
        pieces.append(f"'{marker(index)}'")
        end = token.end + 1
    pieces.append(sql[end:])
    return "".join(pieces)


def with_slots(tree: exp.Expression, count: int) -> exp.Expression | None:
    """``tree`` (parsed from ``marked_text``) with each marked literal replaced by its slot; None
    unless each of the ``count`` markers is found once, as a string literal."""
    found: list[int] = []

    def slot(node: exp.Expression) -> exp.Expression:
        index = _marked(node.this) if isinstance(node, exp.Literal) and node.is_string else None
        if index is None:
            return node
        found.append(index)
        return exp.Placeholder(this=marker(index))

    slotted = tree.transform(slot)
    return slotted if sorted(found) == list(range(count)) else None


_WRAPPERS = (exp.Neg, exp.Cast)
"""What may stand around a slot in a slot operand: a minus (``-5``) and a typed literal
(``DATE '2024-01-31'``, ``CAST('...' AS T)``, ``'...'::T``). sqlglot's DuckDB parser makes the
same node around any literal's text (the type is the one written, never read from the text);
the function that decides the value then reads through it or refuses it as for a parsed text."""


def _marked(name: object) -> int | None:
    """The literal a marker or a slot's name stands for; None for any other name."""
    text = str(name)
    return int(text[len(_PREFIX) :]) if text.startswith(_PREFIX) else None


def slot_index(node: exp.Expression) -> int | None:
    """The literal a slot operand stands for: a slot, or a slot inside minuses and typed
    literals; None for any other node."""
    while isinstance(node, _WRAPPERS):
        node = node.this
    return _marked(node.this) if isinstance(node, exp.Placeholder) else None


def mentions_slot(text: str) -> bool:
    """Whether ``text`` (e.g. a shape's ``repr``) holds a slot or a marker."""
    return _PREFIX in text


def token_literal(token: Token) -> exp.Literal:
    """The literal sqlglot's parser makes of a number or string ``token``."""
    return exp.Literal(this=token.text, is_string=token.token_type == TokenType.STRING)


def literal_node(token: Token, operand: exp.Expression) -> exp.Expression:
    """The node sqlglot's parser makes of literal ``token`` in the place of ``operand`` (a slot
    operand): the literal, with its position in the text, inside a copy of the operand's minuses
    and typed literals."""
    literal = token_literal(token)
    literal.update_positions(token)
    if not isinstance(operand, _WRAPPERS):
        return literal
    wrapped = operand.copy()
    inner = wrapped
    while isinstance(inner.this, _WRAPPERS):
        inner = inner.this
    inner.set("this", literal)
    return wrapped


Path = tuple[tuple[str, int | None], ...]
"""Where a node is in a tree: the argument name (and list index) taken at each step down."""


def operand_paths(tree: exp.Expression) -> dict[int, tuple[Path, ...]]:
    """Where each slot operand (a slot, inside any minuses and typed literals) of ``tree`` is:
    one place each, or several when the analysis copied it (a BETWEEN SYMMETRIC's two
    orders)."""
    paths: dict[int, list[Path]] = {}

    def down(node: exp.Expression, path: Path) -> None:
        index = slot_index(node)
        if index is not None:
            paths.setdefault(index, []).append(path)
            return
        for key, value in node.args.items():
            if isinstance(value, exp.Expression):
                down(value, (*path, (key, None)))
            elif isinstance(value, list):
                for position, item in enumerate(value):
                    if isinstance(item, exp.Expression):
                        down(item, (*path, (key, position)))

    down(tree, ())
    return {index: tuple(found) for index, found in paths.items()}


def node_at(tree: exp.Expression, path: Path) -> exp.Expression:
    """The node of ``tree`` at ``path``."""
    node = tree
    for key, position in path:
        node = node.args[key] if position is None else node.args[key][position]
    return node


def filled(
    tree: exp.Expression,
    paths: Mapping[int, tuple[Path, ...]],
    values: Mapping[int, exp.Expression],
) -> exp.Expression:
    """A copy of ``tree`` with the slot operand at each of ``paths[index]`` (from
    ``operand_paths``; never the root) replaced by ``values[index]`` (a copy of it after its
    first place)."""
    copied = tree.copy()
    for index, places in paths.items():
        for n, path in enumerate(places):
            key, position = path[-1]
            value = values[index] if n == 0 else values[index].copy()
            node_at(copied, path[:-1]).set(key, value, index=position)
    return copied


@dataclass(frozen=True)
class TextTemplate:
    """A text written by sqlglot from a marked tree, split at its markers: ``parts`` around
    the literals numbered ``order``."""

    parts: tuple[str, ...]
    order: tuple[int, ...]

    @classmethod
    def of(cls, text: str, count: int) -> TextTemplate | None:
        """``text`` split at its markers; None unless each of ``count`` markers is in it (more
        than once when sqlglot writes a literal twice, e.g. BETWEEN SYMMETRIC as two BETWEENs)."""
        pieces = _MARKED.split(text)
        order = tuple(int(i) for i in pieces[1::2])
        if set(order) != set(range(count)):
            return None
        return cls(tuple(pieces[0::2]), order)

    def fill(self, spelled: Sequence[str]) -> str:
        """The text with literal ``i`` written as ``spelled[i]``."""
        out = [self.parts[0]]
        for index, part in zip(self.order, self.parts[1:], strict=True):
            out.append(spelled[index])
            out.append(part)
        return "".join(out)
