"""Parse SQL with sqlglot, after lifting BigQuery's differential-privacy clause out of the text.

sqlglot does not parse ``SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-6) ...``, so
dpsql finds the clause with sqlglot's own tokenizer (never inside a string or comment), reads its
options, and blanks it out with spaces of the same length before parsing. Blanking keeps every
offset, so errors point at the line and column of the user's original text.

>>> parsed = parse("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=0.5) COUNT(*) FROM t")
>>> parsed.options
{'epsilon': 0.5}
>>> parsed.expression.sql()
'SELECT COUNT(*) FROM t'
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.dialects import Dialect
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from dpsql.errors import ParameterError, SqlSyntaxError, UnsupportedQueryError

__all__ = ["OPTION_TYPES", "ParsedQuery", "parse", "tokenized"]

OPTION_TYPES: Mapping[str, type] = {
    "epsilon": float,
    "delta": float,
    "mechanism": str,
    "max_answers": float,
    "selection_share": float,
    "prefer": str,
    "accuracy": float,
    "confidence": float,
    "quantile_candidates": float,
    "simultaneous": bool,
    "expected_count": float,
}
"""Options accepted in ``WITH DIFFERENTIAL_PRIVACY OPTIONS(...)``, with their types."""

_CLAUSE_TOKENS: Mapping[type[exp.Expression], frozenset[TokenType]] = {
    exp.Order: frozenset({TokenType.ORDER_BY}),
    exp.Having: frozenset({TokenType.HAVING}),
    exp.Limit: frozenset({TokenType.LIMIT}),
    exp.Offset: frozenset({TokenType.OFFSET}),
    exp.Join: frozenset(
        {
            TokenType.JOIN,
            TokenType.LEFT,
            TokenType.RIGHT,
            TokenType.INNER,
            TokenType.OUTER,
            TokenType.CROSS,
            TokenType.FULL,
            TokenType.NATURAL,
        }
    ),
    exp.With: frozenset({TokenType.WITH}),
    exp.Group: frozenset({TokenType.GROUP_BY}),
    exp.TableSample: frozenset({TokenType.TABLE_SAMPLE}),
    exp.Pivot: frozenset({TokenType.PIVOT, TokenType.UNPIVOT}),
    exp.Qualify: frozenset({TokenType.QUALIFY}),
    exp.Distinct: frozenset({TokenType.DISTINCT}),
}


@dataclass(frozen=True)
class ParsedQuery:
    """A single parsed SELECT, its DP options and the text it came from."""

    text: str
    dialect: str
    expression: exp.Expression
    options: dict[str, Any] = field(default_factory=dict)
    tokens: tuple[Token, ...] = ()

    def position(self, node: exp.Expression) -> tuple[int | None, int | None]:
        """1-based line and column where ``node`` starts in the original text, when known."""
        kinds = _CLAUSE_TOKENS.get(type(node))
        starts = [n.meta["start"] for n in node.walk() if "start" in n.meta]
        if isinstance(node, exp.Window) and starts:
            over = [t.start for t in self.tokens if t.token_type == TokenType.OVER]
            later = [start for start in over if start > min(starts)]
            if later:
                return _line_column(self.text, min(later))
        if isinstance(node, exp.Null) and node.parent is not None:
            around = [n.meta["start"] for n in node.parent.walk() if "start" in n.meta]
            nulls = [t.start for t in self.tokens if t.token_type == TokenType.NULL]
            if around and nulls:
                nearest = min(nulls, key=lambda start: abs(start - min(around)))
                return _line_column(self.text, nearest)
        if kinds is not None:
            after = min(starts, default=len(self.text))
            candidates = [t.start for t in self.tokens if t.token_type in kinds and t.start < after]
            if candidates:
                return _line_column(self.text, max(candidates))
        if not starts:
            return self.position(node.parent) if node.parent is not None else (None, None)
        start = min(starts)
        if isinstance(node, (exp.Func, exp.Subquery)) and "start" not in node.meta:
            start = self._opening(start, name_first=not isinstance(node, exp.Subquery))
        return _line_column(self.text, start)

    def _opening(self, start: int, *, name_first: bool) -> int:
        """Offset of the ``name(`` (or ``(``) that opens the call whose first inner token is at
        ``start``, skipping a leading SELECT of a subquery."""
        index = next((i for i, t in enumerate(self.tokens) if t.start == start), None)
        if index is None:
            return start
        index -= 1
        if index >= 0 and self.tokens[index].token_type == TokenType.SELECT:
            index -= 1
        if index < 0 or self.tokens[index].token_type != TokenType.L_PAREN:
            return start
        if name_first and index > 0:
            index -= 1
        return self.tokens[index].start


def _line_column(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _option_value(tokens: list[Token], index: int, text: str) -> tuple[Any, int]:
    sign = 1
    token = tokens[index]
    if token.token_type == TokenType.DASH:
        sign, index = -1, index + 1
        token = tokens[index]
    if token.token_type == TokenType.NUMBER:
        try:
            return sign * float(token.text), index + 1
        except ValueError:
            pass
    elif token.token_type == TokenType.STRING and sign == 1:
        return token.text, index + 1
    elif token.token_type in (TokenType.TRUE, TokenType.FALSE) and sign == 1:
        return token.token_type == TokenType.TRUE, index + 1
    line, column = _line_column(text, token.start)
    raise SqlSyntaxError(
        f"expected a number or string in OPTIONS, got {token.text!r}", line=line, column=column
    )


def _lift_dp_clause(text: str, tokens: list[Token]) -> tuple[str, dict[str, Any]]:
    """Return the text with the DP clause blanked out, and the clause's options."""
    start = None
    for i in range(len(tokens) - 2):
        if (
            tokens[i].token_type == TokenType.SELECT
            and tokens[i + 1].token_type == TokenType.WITH
            and tokens[i + 2].text.upper() == "DIFFERENTIAL_PRIVACY"
        ):
            start = i + 1
            break
    if start is None:
        return text, {}
    end = start + 2
    options: dict[str, Any] = {}
    if end < len(tokens) and tokens[end].text.upper() == "OPTIONS":
        if end + 1 >= len(tokens) or tokens[end + 1].token_type != TokenType.L_PAREN:
            line, column = _line_column(text, tokens[end].start)
            raise SqlSyntaxError("expected '(' after OPTIONS", line=line, column=column)
        i = end + 2
        while i < len(tokens) and tokens[i].token_type != TokenType.R_PAREN:
            name_token = tokens[i]
            line, column = _line_column(text, name_token.start)
            name = name_token.text.lower()
            if name not in OPTION_TYPES:
                raise UnsupportedQueryError(
                    f"unknown differential privacy option {name_token.text!r}; "
                    f"known: {', '.join(sorted(OPTION_TYPES))}",
                    line=line,
                    column=column,
                )
            if name in options:
                raise SqlSyntaxError(f"option {name!r} given twice", line=line, column=column)
            if i + 1 >= len(tokens) or tokens[i + 1].token_type != TokenType.EQ:
                raise SqlSyntaxError(
                    f"expected '=' after option {name!r}", line=line, column=column
                )
            value, i = _option_value(tokens, i + 2, text)
            if (OPTION_TYPES[name] is bool) != isinstance(value, bool):
                kind = "TRUE or FALSE" if OPTION_TYPES[name] is bool else "a number or string"
                raise ParameterError(f"option {name} must be {kind}, got {value!r}")
            try:
                options[name] = OPTION_TYPES[name](value)
            except (TypeError, ValueError):
                raise ParameterError(
                    f"option {name} must be a {OPTION_TYPES[name].__name__}, got {value!r}"
                ) from None
            if i < len(tokens) and tokens[i].token_type == TokenType.COMMA:
                i += 1
        if i >= len(tokens):
            line, column = _line_column(text, tokens[end].start)
            raise SqlSyntaxError("unclosed OPTIONS(", line=line, column=column)
        end = i + 1
    first, last = tokens[start].start, tokens[end - 1].end + 1
    blank = "".join(c if c == "\n" else " " for c in text[first:last])
    return text[:first] + blank + text[last:], options


def tokenized(sql: str, dialect: str = "duckdb") -> tuple[type[Dialect], list[Token]]:
    """The dialect and the tokens of ``sql``, after the checks every query text passes first
    (not empty, not too long, valid Unicode, a known dialect); ``SqlSyntaxError`` with line and
    column when it cannot be tokenized."""
    if not isinstance(sql, str) or not sql.strip():
        raise SqlSyntaxError("the query is empty")
    if len(sql) > MAX_QUERY_LENGTH:
        raise UnsupportedQueryError(
            f"the query is {len(sql):,} characters long; dpsql reads at most "
            f"{MAX_QUERY_LENGTH:,} (a list of more values belongs in a public table or the "
            "policy's public keys)"
        )
    try:
        sql.encode("utf-8")
    except UnicodeEncodeError as error:
        line, column = _line_column(sql, error.start)
        raise SqlSyntaxError(
            "the query is not valid Unicode text (a lone surrogate code point)",
            line=line,
            column=column,
        ) from None
    try:
        dialect_class = Dialect.get_or_raise(dialect)
    except ValueError:
        raise ParameterError(f"unknown SQL dialect {dialect!r}") from None
    try:
        return dialect_class, dialect_class.tokenize(sql)
    except TokenError as error:
        found = re.search(r"Error tokenizing '(.*)'", str(error), re.S)
        line = column = None
        if found and sql.startswith(found.group(1)):
            context = found.group(1)
            opener = max(context.rfind("'"), context.rfind('"'), context.rfind("/*"))
            line, column = _line_column(sql, opener if opener >= 0 else len(context) - 1)
        raise SqlSyntaxError(
            "cannot tokenize the query (an unterminated string, identifier or comment?)",
            line=line,
            column=column,
        ) from None


def parse(
    sql: str, dialect: str = "duckdb", read: tuple[type[Dialect], list[Token]] | None = None
) -> ParsedQuery:
    """Parse one SELECT statement; raise ``SqlSyntaxError`` with line and column when malformed.
    ``read`` is what ``tokenized(sql, dialect)`` returned, when the caller has it already."""
    dialect_class, tokens = tokenized(sql, dialect) if read is None else read
    text, options = _lift_dp_clause(sql, tokens)
    _check_nesting(sql, tokens)
    try:
        with refusing_deep_recursion():
            if text == sql:  # no OPTIONS clause was lifted: parse the tokens already read
                statements = dialect_class.parser().parse(tokens, text)
            else:
                statements = sqlglot.parse(text, read=dialect)
    except ParseError as error:
        detail = error.errors[0] if error.errors else {}
        description = str(detail.get("description", error)).split(". Line")[0]
        description = re.sub(r"<Token [^>]*?text: ([^,]*),[^>]*>", r"'\1'", description)
        description = re.sub(r"<class '[\w.]*?(\w+)'>", r"\1", description)
        highlight = detail.get("highlight")
        near = f" near {highlight!r}" if highlight else ""
        line = detail.get("line")
        column = None
        if line is not None and highlight is not None:
            column = max(1, int(detail.get("col", 1)) - len(str(highlight)) + 1)
        raise SqlSyntaxError(
            f"malformed SQL: {description}{near}", line=line, column=column
        ) from None
    statements = [s for s in statements if s is not None]
    if len(statements) != 1:
        raise UnsupportedQueryError(f"expected exactly one statement, got {len(statements)}")
    if _depth(statements[0]) > MAX_DEPTH:
        raise UnsupportedQueryError(_TOO_DEEP)
    return ParsedQuery(sql, dialect, statements[0], options, tuple(tokens))


MAX_QUERY_LENGTH = 100_000
"""The longest query text dpsql parses, in characters (the service's ``max_sql_length`` may be
lower): parsing, checking and binding are linear in the text, and this keeps them to seconds."""

MAX_NESTING = 24
"""The deepest nesting of parentheses and NOTs dpsql parses: sqlglot's parser spends about twenty
Python frames on each level, so this stays well inside Python's recursion limit."""

MAX_DEPTH = 400
"""The deepest syntax tree dpsql accepts (a chain of n ORs is n deep: use IN for long lists).
Every later stage walks the tree recursively; this keeps them far from the recursion limit."""

_TOO_DEEP = (
    f"the query is nested too deeply (more than {MAX_NESTING} levels of parentheses and NOT, "
    f"or {MAX_DEPTH} AND/OR terms in a chain); use IN (...) for long lists of values"
)


@contextmanager
def refusing_deep_recursion() -> Iterator[None]:
    """Turn running out of recursion (directly, or wrapped by sqlglot in another error) into the
    one precise refusal: a backstop behind the nesting limits, for shapes they do not count."""
    try:
        yield
    except Exception as error:
        cause: BaseException | None = error
        while cause is not None and not isinstance(cause, RecursionError):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        too_deep = True
    else:
        too_deep = False
    if too_deep:
        raise UnsupportedQueryError(_TOO_DEEP)


def _check_nesting(sql: str, tokens: list[Token]) -> None:
    """Refuse parentheses and NOTs nested beyond ``MAX_NESTING`` before the recursive parser.

    A NOT opens a level that lasts until the parenthesis around it closes."""
    levels = [0]
    for token in tokens:
        if token.token_type == TokenType.L_PAREN:
            levels.append(levels[-1] + 1)
        elif token.token_type == TokenType.R_PAREN and len(levels) > 1:
            levels.pop()
        elif token.token_type == TokenType.NOT:
            levels[-1] += 1
        if levels[-1] > MAX_NESTING:
            line, column = _line_column(sql, token.start)
            raise UnsupportedQueryError(_TOO_DEEP, line=line, column=column)


def _depth(root: exp.Expression) -> int:
    """Height of the syntax tree, walked without recursion."""
    deepest, stack = 0, [(root, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in node.iter_expressions())
    return deepest
