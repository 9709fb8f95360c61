"""What a statement sent over the PostgreSQL port is, and the text dpsql answers it from.

``classify`` sorts a statement by its first keyword and, for queries, by the tables it names:
a query naming a policy table or public table is a differentially private query (the engine
answers it, exactly as ``POST /v1/query``); any other query is a catalogue question
(``dpsql.serving.pgcatalog``). ``SET``, ``SHOW``, ``RESET`` and the transaction statements are
answered by the connection itself. Statements are read with sqlglot's PostgreSQL tokenizer, so a
keyword or a ``$1`` inside a string or comment is never taken for one.

``bind_literals`` writes the extended protocol's parameters into a query as SQL literals (the
engine parses and checks them like any literal the analyst typed); ``unqualified`` drops the
``public.`` (or ``<dataset>.public.``) qualifier BI tools put before table names.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlglot import exp
from sqlglot.dialects.postgres import Postgres
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from dpsql.serving.pgcatalog import parse

__all__ = [
    "PgError",
    "Statement",
    "bind_literals",
    "classify",
    "parameter_count",
    "split",
    "unqualified",
]


class PgError(Exception):
    """A refusal with its SQLSTATE, for errors that are the PostgreSQL port's own."""

    def __init__(self, sqlstate: str, message: str):
        super().__init__(message)
        self.sqlstate = sqlstate


@dataclass(frozen=True)
class Statement:
    """One statement: its ``kind``, text and what its kind needs.

    ``kind`` is one of ``empty``, ``query`` (differentially private), ``catalog``, ``explain``,
    ``set``, ``reset``, ``show``, ``begin``, ``commit``, ``rollback``, ``rollback_to`` (a
    savepoint), ``noop``.
    """

    kind: str
    text: str
    name: str | None = None
    value: str | None = None
    tag: str = ""
    expression: exp.Expression | None = None


_DIALECT = Postgres()
_NAMES = (TokenType.VAR, TokenType.IDENTIFIER)


def _tokens(text: str) -> list[Token] | None:
    try:
        return _DIALECT.tokenize(text)
    except TokenError:
        return None


def split(text: str) -> list[str]:
    """The statements of a simple-protocol query string, split at semicolons outside strings
    and comments (one unparsable string stays whole; empty statements are dropped).

    >>> split("SET x = 1; SELECT ';' ;")
    ['SET x = 1', "SELECT ';'"]
    """
    tokens = _tokens(text)
    if tokens is None:
        return [text.strip()] if text.strip() else []
    pieces, start = [], 0
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            pieces.append(text[start : token.start])
            start = token.end + 1
    pieces.append(text[start:])
    return [piece.strip() for piece in pieces if piece.strip()]


_SET = re.compile(r"SET\s+(?:SESSION\s+|LOCAL\s+)?(?P<rest>.+)", re.I | re.S)
_ASSIGN = re.compile(r"(?P<name>[\w.\"]+)\s*(?:=|\s+TO\s+)\s*(?P<value>.+)", re.I | re.S)
_SHOW_ALIASES = {"transaction isolation level": "transaction_isolation", "time zone": "timezone"}


def _unquoted(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1].replace(value[0] * 2, value[0])
    return value


def _set(text: str) -> Statement:
    match = _SET.fullmatch(text)
    rest = match.group("rest").strip() if match else ""
    upper = rest.upper()
    if upper.startswith(("TRANSACTION", "SESSION CHARACTERISTICS")):
        return Statement("noop", text, tag="SET")
    if upper.startswith("TIME ZONE"):
        return Statement("set", text, name="timezone", value=_unquoted(rest[9:]))
    assigned = _ASSIGN.fullmatch(rest)
    if assigned is None:
        raise PgError("42601", f"cannot read the SET statement {text[:60]!r}")
    name = _unquoted(assigned.group("name")).lower()
    return Statement("set", text, name=name, value=_unquoted(assigned.group("value")))


def _words(text: str) -> str:
    return " ".join(text.split()).lower()


def _tables(expression: exp.Expression) -> list[exp.Table]:
    ctes = {cte.alias_or_name.lower() for cte in expression.find_all(exp.CTE)}
    return [t for t in expression.find_all(exp.Table) if t.name.lower() not in ctes]


def _names_data(table: exp.Table, tables: frozenset[str], dataset: str) -> bool:
    return (
        table.name.lower() in tables
        and table.db.lower() in ("", "public", dataset.lower())
        and table.catalog.lower() in ("", dataset.lower())
    )


def classify(text: str, tables: frozenset[str], dataset: str) -> Statement:
    """What ``text`` (one statement) is; ``tables`` are the lower-case names of the policy's
    tables and public tables, ``dataset`` the dataset's name.

    >>> classify("SELECT COUNT(*) FROM public.t", frozenset({"t"}), "d").kind
    'query'
    >>> classify("SELECT relname FROM pg_class", frozenset({"t"}), "d").kind
    'catalog'
    """
    text = text.strip().rstrip(";").strip()
    if not text:
        return Statement("empty", text)
    tokens = _tokens(text)
    words = [t for t in tokens or [] if t.token_type != TokenType.L_PAREN]
    if not words:  # an unreadable statement (unclosed quote): the engine names the error
        return Statement("query", text)
    start = tokens[0].start if tokens else 0
    query = text  # a query keeps its comments: the engine's positions count them
    first, text = words[0].text.upper(), text[start:]
    if first == "SET":
        return _set(text)
    rest = text[words[0].end + 1 - start :].strip()
    if first == "RESET":
        return Statement("reset", text, name=_unquoted(rest).lower())
    if first == "SHOW":
        name = _words(_unquoted(rest))
        return Statement("show", text, name=_SHOW_ALIASES.get(name, name))
    if first in ("BEGIN", "START"):
        return Statement("begin", text, tag="BEGIN")
    if first in ("COMMIT", "END"):
        return Statement("commit", text, tag="COMMIT")
    if first in ("ROLLBACK", "ABORT"):
        if _words(rest).startswith("to "):
            return Statement("rollback_to", text, tag="ROLLBACK")
        return Statement("rollback", text, tag="ROLLBACK")
    if first in ("SAVEPOINT", "RELEASE"):
        return Statement("noop", text, tag=first)
    if first in ("DISCARD", "DEALLOCATE", "UNLISTEN"):
        return Statement("noop", text, tag=" ".join(text.upper().split()[:2]).rstrip(";"))
    if first == "EXPLAIN":
        if rest.upper().startswith(("ANALYZE", "(")):
            raise PgError("0A000", "EXPLAIN ANALYZE would run the query; send EXPLAIN <query>")
        return Statement("explain", text, value=rest)
    if first not in ("SELECT", "WITH", "VALUES", "TABLE"):
        raise PgError("0A000", f"dpsql answers SELECT queries only; {first} is not supported")
    if any(t.text.upper() == "DIFFERENTIAL_PRIVACY" for t in words):
        return Statement("query", query)
    try:
        expression = parse(query)
    except ParseError:
        return Statement("query", query)  # the engine names the syntax error
    if any(_names_data(t, tables, dataset) for t in _tables(expression)):
        return Statement("query", query)
    if not isinstance(expression, exp.Query):
        raise PgError("0A000", "dpsql answers SELECT queries only")
    return Statement("catalog", query, expression=expression)


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float | Decimal):
        if isinstance(value, float | Decimal) and not math.isfinite(value):
            raise PgError("22023", "a parameter that is not a finite number is not supported")
        # A negative number is written after a space: "n -$1" must not become a comment
        # ("n --2"), and a compared value is a number, not a parenthesized expression.
        text = str(value)
        return f" {text}" if text.startswith("-") else text
    if isinstance(value, dt.datetime):
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
    if isinstance(value, dt.date):
        return f"DATE '{value.isoformat()}'"
    text = str(value)
    if "\\" in text or "\x00" in text:
        # The engine's parser reads a backslash as an escape; refusing is clearer than a
        # different literal.
        raise PgError("22P02", "a text parameter with a backslash is not supported")
    return "'" + text.replace("'", "''") + "'"


def _parameters(tokens: list[Token]) -> list[tuple[int, int, int]]:
    """(start, end, number) of each ``$n`` placeholder."""
    found = []
    for token, following in itertools.pairwise(tokens):
        if (
            token.token_type == TokenType.PARAMETER
            and following.token_type == TokenType.NUMBER
            and following.start == token.end + 1
            and following.text.isdigit()
        ):
            found.append((token.start, following.end + 1, int(following.text)))
    return found


def parameter_count(text: str) -> int:
    """The highest ``$n`` in ``text`` (0 without placeholders).

    >>> parameter_count("SELECT $1, '$3', $2")
    2
    """
    return max((number for _, _, number in _parameters(_tokens(text) or [])), default=0)


def bind_literals(text: str, values: Sequence[Any]) -> str:
    """``text`` with each ``$n`` replaced by ``values[n - 1]`` as a SQL literal.

    >>> bind_literals("SELECT COUNT(*) FROM t WHERE c = $1 AND n > $2", ["it's", -2])
    "SELECT COUNT(*) FROM t WHERE c = 'it''s' AND n >  -2"
    """
    if not values:
        return text
    tokens = _tokens(text)
    if tokens is None:
        raise PgError("42601", "cannot read the statement's parameters")
    pieces, at = [], 0
    for start, end, number in _parameters(tokens):
        if not 1 <= number <= len(values):
            raise PgError("42P02", f"there is no parameter ${number}")
        pieces += [text[at:start], _literal(values[number - 1])]
        at = end
    return "".join([*pieces, text[at:]])


def unqualified(text: str, dataset: str) -> str:
    """``text`` with the ``public.`` and ``<dataset>.public.`` qualifiers blanked out (spaces
    keep every error's line and column).

    >>> unqualified('SELECT COUNT(*) FROM "public"."t"', "d")
    'SELECT COUNT(*) FROM          "t"'
    """
    tokens = _tokens(text)
    if tokens is None:
        return text
    qualifiers = {"public", dataset.lower()}
    blank: list[tuple[int, int]] = []
    index = 0
    while index + 2 < len(tokens):
        token, dot, name = tokens[index : index + 3]
        starts = index == 0 or tokens[index - 1].token_type != TokenType.DOT
        if (
            starts
            and token.token_type in _NAMES
            and token.text.lower() in qualifiers
            and dot.token_type == TokenType.DOT
            and name.token_type in _NAMES
        ):
            end = dot.end
            if (
                token.text.lower() == dataset.lower()
                and name.text.lower() == "public"
                and index + 4 < len(tokens)
                and tokens[index + 3].token_type == TokenType.DOT
            ):
                end = tokens[index + 3].end
            blank.append((token.start, end + 1))
        index += 1
    for start, end in blank:
        text = text[:start] + " " * (end - start) + text[end:]
    return text
