"""Post-processing of released values: split a query into the DP query and SQL over its answer.

``ORDER BY``, ``LIMIT``/``OFFSET``, arithmetic between aggregates, window functions, ``HAVING`` on
any aggregate, positional ``GROUP BY 1`` / ``GROUP BY ALL``, and BigQuery's outer query over a
``SELECT WITH DIFFERENTIAL_PRIVACY ...`` subquery all read the *released* rows only. ``split``
turns such a query into

* an inner query that the allow-list (``dpsql.sql.analyze``) checks and the engine charges and
  noises as usual: the group expressions and every distinct aggregate, under hidden names
  (``__dp_g0``, ``__dp_a0``, ...), or BigQuery's subquery as written; and
* an outer query in DuckDB SQL over one table, ``released``, holding the noisy answer (plus a row
  number ``__dp_row``), which ``dpsql.engine.derived`` runs in a sandboxed in-memory DuckDB with no
  file access, no other table and no subquery.

Differential privacy is closed under post-processing (Dwork and Roth, *The Algorithmic Foundations
of Differential Privacy*, Proposition 2.1): a function of a released answer that does not read the
data again costs nothing more. The outer query cannot read the data by construction: it is run on a
connection that holds only the released table.

A query that the allow-list accepts as written is left alone (``split`` returns no
post-processing), so existing shapes keep their exact plans and costs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace

import duckdb
from sqlglot import exp

from dpsql.errors import SchemaError, UnsupportedQueryError
from dpsql.sql import moments
from dpsql.sql.parse import ParsedQuery
from dpsql.sql.shape import AggregateKind, ColumnKind, GroupKey, QueryShape

__all__ = [
    "RELEASED",
    "ROW",
    "PostProcess",
    "sandbox",
    "split",
]

RELEASED = "released"
"""The name of the released answer's table in the outer query."""

ROW = "__dp_row"
"""The released row's number, carried through the outer query to attach intervals."""

_DP_AGGREGATES = (exp.Count, exp.Sum, exp.Avg, exp.Median, exp.PercentileCont, exp.WithinGroup)
"""Aggregates the DP query answers as written (quantiles: ``dpsql.sql.quantiles``)."""
_PLAIN_HAVING = (exp.GT, exp.GTE, exp.LT, exp.LTE)
_MONOTONE_FUNCTIONS = (exp.Round, exp.Floor, exp.Ceil)

_ALLOWED_FUNCTIONS: tuple[type[exp.Func], ...] = tuple(
    getattr(exp, name)
    for name in (
        # arithmetic, rounding and comparison of numbers
        "Abs", "Ceil", "Exp", "Floor", "Greatest", "Least", "Ln", "Log", "Pow", "Round",
        "SafeDivide", "Sign", "Sqrt",
        # conditionals, their connectives, and casts
        "And", "Case", "Cast", "Coalesce", "If", "Nullif", "Or", "TryCast",
        # aggregates and window functions over the released rows
        "Avg", "Count", "CumeDist", "DenseRank", "FirstValue", "Lag", "LastValue", "Lead",
        "Max", "Median", "Min", "NthValue", "Ntile", "PercentRank", "PercentileCont",
        "PercentileDisc", "Rank", "RowNumber", "Stddev", "StddevPop", "StddevSamp", "Sum",
        "Variance", "VariancePop",
        # text and dates of bounded size
        "Concat", "Day", "Extract", "Left", "Length", "Lower", "Month", "Quarter", "Right",
        "Substring", "TimestampTrunc", "Trim", "Upper", "Year",
    )
    if hasattr(exp, name)
)
"""Functions post-processing may call: each returns one value per row (or group) of a size
bounded by its inputs and the query's text. Set-returning and list functions (``unnest``,
``range``, ``generate_series``), and those that multiply text (``repeat``, ``lpad``,
``replace``), are refused: post-processing may not produce more rows, or much larger values, than
were released."""


@dataclass(frozen=True)
class PostProcess:
    """The outer query over the released answer, and what each of its columns is.

    ``outer`` is DuckDB SQL over table ``released`` whose columns are ``released_columns`` (inner
    name -> what it holds); it returns ``columns`` and, when ``rowwise``, ``__dp_row`` last.
    ``exact[name]`` is an expression of one released aggregate that is monotone in it (other
    inputs constant within a row), so the image of that aggregate's interval is an interval for
    the column with the same confidence; ``dpsql.engine.derived_intervals`` bounds the others
    after the release.
    """

    outer: str
    columns: tuple[str, ...]
    released_columns: dict[str, str]
    aggregates: tuple[str, ...]
    copies: dict[str, str]
    exact: dict[str, tuple[str, str]]
    derived: dict[str, str]
    rowwise: bool
    types: dict[str, str] = field(default_factory=dict)
    """The DuckDB type of each released column."""
    bivariate: tuple[moments.Moment, ...] = ()
    """Every two-column statistic of the query (``dpsql.sql.moments``)."""
    moment_columns: dict[str, moments.Moment] = field(default_factory=dict)
    """Output columns that are exactly a two-column statistic, with the released column of each
    of its components: they get a conservative interval (``dpsql.engine.moments``)."""

    def describe(self) -> dict[str, object]:
        """What EXPLAIN shows: the outer query and which values are derived from which."""
        return {
            "runs_on": "the released (noisy) answer only; costs nothing more",
            "query": self.outer,
            "released_columns": dict(self.released_columns),
            "derived": dict(self.derived),
            "intervals": {
                name: (
                    "the released interval"
                    if name in self.copies
                    else moments.INTERVAL
                    if name in self.moment_columns
                    else f"the image of {self.released_columns[self.exact[name][0]]}'s interval"
                    if name in self.exact
                    else "derived after the release from the noise laws of the released values "
                    "it reads, where they bound it (the answer's details['intervals'] say how: "
                    "exact, conservative or approximate, or why there is none)"
                )
                for name in self.columns
                if name in self.copies or name in self.exact or name in self.derived
            },
        }


def sandbox() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB that can read no file and holds no table: post-processing runs here
    (its configuration locked, so nothing run in it can widen that)."""
    return duckdb.connect(
        ":memory:",
        config={
            "enable_external_access": False,
            "threads": 1,
            "memory_limit": "512MB",
            "lock_configuration": True,
        },
    )


class _Splitter:
    def __init__(self, parsed: ParsedQuery, catalog: Mapping[str, Mapping[str, str]]):
        self.parsed = parsed
        self.catalog = catalog

    def reject(self, node: exp.Expression, message: str, error: type = UnsupportedQueryError):
        line, column = self.parsed.position(node)
        raise error(message, line=line, column=column)

    # the query shapes ---------------------------------------------------------------------------
    def split(self) -> tuple[ParsedQuery, PostProcess | None]:
        select = self.parsed.expression
        if not isinstance(select, exp.Select):
            return self.parsed, None
        source = select.args.get("from_") or select.args.get("from")
        if source is not None and isinstance(source.this, exp.Subquery):
            return self.over_subquery(select, source.this)
        if not _needs_post(select):
            return self.parsed, None
        return self.flattened(select)

    def inner(self, select: exp.Select) -> ParsedQuery:
        return replace(self.parsed, expression=select)

    def over_subquery(
        self, outer: exp.Select, subquery: exp.Subquery
    ) -> tuple[ParsedQuery, PostProcess]:
        """BigQuery's form: ``SELECT ... FROM (SELECT WITH DIFFERENTIAL_PRIVACY ...) [AS t]``."""
        inner = subquery.this
        if not isinstance(inner, exp.Select) or subquery.args.get("joins"):
            self.reject(subquery, "the subquery in FROM must be one SELECT")
        if not self.parsed.options:
            self.reject(
                subquery,
                "a subquery in FROM is supported as BigQuery's form only: the inner query "
                "SELECT WITH DIFFERENTIAL_PRIVACY ... aggregates, the outer one post-processes",
            )
        if outer.args.get("joins"):
            self.reject(outer.args["joins"][0], "the outer query reads the DP subquery alone")
        if _needs_post(inner) or (
            isinstance(inner.args.get("from_") or inner.args.get("from"), exp.From)
            and isinstance((inner.args.get("from_") or inner.args.get("from")).this, exp.Subquery)
        ):
            self.reject(
                inner,
                "inside the DP subquery use group columns and aggregates only; put ORDER BY, "
                "LIMIT, arithmetic and window functions in the outer query",
            )
        names = []
        for node in inner.expressions:
            names.append(node.alias_or_name if isinstance(node, (exp.Alias, exp.Column)) else "")
        kinds = {}
        for node, name in zip(inner.expressions, names, strict=True):
            body = node.this if isinstance(node, exp.Alias) else node
            if not name:
                self.reject(node, "name each aggregate of the DP subquery with AS")
            kinds[name] = body
        alias = subquery.alias
        outer = outer.copy()
        self.expand_stars(outer, names)
        originals = [_item(n, self.parsed.dialect) for n in outer.expressions]
        outer.set(
            "expressions",
            [
                exp.alias_(n.this if isinstance(n, exp.Alias) else n, name, quoted=True)
                for n, (name, _) in zip(outer.expressions, originals, strict=True)
            ],
        )
        outer.set(
            "from_" if "from_" in outer.args else "from", exp.From(this=exp.to_table(RELEASED))
        )
        aggregates = tuple(n for n, body in kinds.items() if isinstance(body, exp.AggFunc))
        keys = tuple(n for n in names if n not in aggregates)

        def resolve(column: exp.Column, clause: str) -> exp.Expression:
            if column.table and column.table.lower() not in {alias.lower(), ""}:
                self.reject(column, f"unknown table or alias {column.table!r}", SchemaError)
            match = next((n for n in names if n.lower() == column.name.lower()), None)
            if match is None:
                if clause == "ORDER BY":
                    return exp.column(column.name, quoted=column.this.quoted)
                self.reject(
                    column,
                    f"unknown column {column.name!r} of the DP subquery (its columns: "
                    f"{', '.join(names)})",
                    SchemaError,
                )
            return exp.column(match, quoted=True)

        self.rewrite_outer(outer, resolve)
        released = {n: kinds[n].sql(dialect=self.parsed.dialect) for n in names}
        return self.inner(inner.copy()), self.finish(
            outer, released, aggregates, keys, [text for _, text in originals]
        )

    def flattened(self, select: exp.Select) -> tuple[ParsedQuery, PostProcess]:
        """One SELECT whose aggregates dpsql releases and whose other parts post-process them."""
        group_exprs = self.group_expressions(select)
        inner = select.copy()
        for clause in ("order", "limit", "offset", "qualify", "windows"):
            inner.set(clause, None)
        having = select.args.get("having")
        keep_having = (
            having is not None and _plain_having(having.this) and bool(select.args.get("joins"))
        )
        if not keep_having:
            inner.set("having", None)
        aggregates: dict[str, exp.Expression] = {}
        items = [_item(node, self.parsed.dialect) for node in select.expressions]
        names = [name for name, _ in items]
        outer_items = [
            (node.this if isinstance(node, exp.Alias) else node).copy()
            for node in select.expressions
        ]
        bivariate = tuple(self.moments_in(select))
        exact = {
            name: replace(
                moment,
                released={
                    role: _text(exp.maybe_parse(sql, dialect="duckdb"))
                    for role, sql in moments.components_of(item).items()
                },
            )
            for item, name in zip(outer_items, names, strict=True)
            if (moment := moments.bivariate(item)) is not None
        }
        outer_items = [moments.rewritten(item, self.reject) for item in outer_items]
        key_names = [f"__dp_g{i}" for i in range(len(group_exprs))]
        group_text = [_text(g) for g in group_exprs]

        def lift(node: exp.Expression) -> exp.Expression:
            """``node`` with its DP aggregates and group expressions replaced by released
            columns."""
            for found in list(_dp_aggregates(node)):
                text = _text(found)
                if text not in aggregates:
                    aggregates[text] = found.copy()
                name = f"__dp_a{list(aggregates).index(text)}"
                column = exp.column(name, quoted=True)
                if found is node:
                    return column
                found.replace(column)
            for found in list(node.walk()):
                if isinstance(found, exp.Expression) and _text(found) in group_text:
                    column = exp.column(key_names[group_text.index(_text(found))], quoted=True)
                    if found is node:
                        return column
                    found.replace(column)
            return node

        outer = exp.Select()
        for item, name in zip(outer_items, names, strict=True):
            outer = outer.select(exp.alias_(lift(item), name, quoted=True), copy=False)
        filtered = exp.select("*").from_(RELEASED)
        if having is not None:
            lifted = lift(moments.rewritten(having.this.copy(), self.reject))
            if not keep_having:
                filtered = filtered.where(lifted, copy=False)
        outer = outer.from_(
            exp.Subquery(this=filtered, alias=exp.TableAlias(this=exp.to_identifier(RELEASED))),
            copy=False,
        )
        for clause in ("order", "limit", "offset", "qualify"):
            value = select.args.get(clause)
            if value is not None:
                value = value.copy()
                if clause in ("order", "qualify"):
                    value = lift(moments.rewritten(value, self.reject))
                outer.set(clause, value)

        output_names = {n.lower(): n for n in names}

        def resolve(column: exp.Column, clause: str) -> exp.Expression:
            if column.name.startswith("__dp_"):
                return column
            if clause == "ORDER BY" and column.name.lower() in output_names:
                return exp.column(output_names[column.name.lower()], quoted=True)
            self.reject(
                column,
                f"column {column.name!r} must appear in GROUP BY or inside an aggregate",
            )
            raise AssertionError

        self.rewrite_outer(outer, resolve)
        inner.set(
            "expressions",
            [
                exp.alias_(g.copy(), k, quoted=True)
                for g, k in zip(group_exprs, key_names, strict=True)
            ]
            + [exp.alias_(a, f"__dp_a{i}", quoted=True) for i, a in enumerate(aggregates.values())],
        )
        if group_exprs:
            inner.set("group", exp.Group(expressions=[g.copy() for g in group_exprs]))
        else:
            inner.set("group", None)
        if keep_having:
            inner.set("having", having.copy())
        released = {
            k: g.sql(dialect=self.parsed.dialect)
            for k, g in zip(key_names, group_exprs, strict=True)
        }
        released.update(
            {
                f"__dp_a{i}": a.sql(dialect=self.parsed.dialect)
                for i, a in enumerate(aggregates.values())
            }
        )
        if not aggregates:
            self.reject(
                select,
                "the select list needs an aggregate: COUNT, SUM or AVG (window functions run "
                "over the released groups, e.g. SUM(COUNT(*)) OVER ())",
            )
        agg_names = tuple(f"__dp_a{i}" for i in range(len(aggregates)))
        texts = list(aggregates)
        for name, moment in exact.items():
            named = {r: f"__dp_a{texts.index(t)}" for r, t in moment.released.items()}
            exact[name] = replace(moment, released=named)
        post = self.finish(
            outer, released, agg_names, tuple(key_names), [text for _, text in items]
        )
        return self.inner(inner), replace(
            post, bivariate=bivariate, moment_columns=exact
        )

    # pieces -------------------------------------------------------------------------------------
    def moments_in(self, select: exp.Select) -> list[moments.Moment]:
        """The two-column statistics of ``select`` outside windows; one over a column of the
        table that is not a number (or BOOLEAN) is refused, naming it."""
        source = select.args.get("from_") or select.args.get("from")
        table = source.this.name.lower() if source is not None else ""
        types = {
            c.lower(): t
            for name, columns in self.catalog.items()
            if name.lower() == table
            for c, t in columns.items()
        }
        found = []
        for candidate in select.find_all(*moments.BIVARIATE):
            moment = moments.bivariate(candidate)
            if moment is None:
                continue
            for argument in (candidate.this, candidate.expression):
                type_name = types.get(argument.name.lower())
                kind = ColumnKind.of(type_name) if type_name is not None else ColumnKind.FLOAT
                if not (kind.numeric or kind is ColumnKind.BOOLEAN):
                    self.reject(
                        argument,
                        f"{moment.text} needs numeric (or BOOLEAN) columns; {argument.name!r} "
                        f"is {type_name}",
                    )
            found.append(moment)
        return found

    def group_expressions(self, select: exp.Select) -> list[exp.Expression]:
        """GROUP BY items with positions and select-list aliases resolved; GROUP BY ALL is every
        selected expression that holds no aggregate."""
        group = select.args.get("group")
        if group is None:
            return []
        bodies = [n.this if isinstance(n, exp.Alias) else n for n in select.expressions]
        if group.args.get("all"):
            return [b for b in bodies if not any(True for _ in _dp_aggregates(b))]
        for name, value in group.args.items():
            if name != "expressions" and value:
                self.reject(group, f"GROUP BY {name.upper()} is not supported")
        aliases = {n.alias.lower(): n.this for n in select.expressions if isinstance(n, exp.Alias)}
        source = select.args.get("from_") or select.args.get("from")
        table = source.this.name.lower() if source is not None else ""
        columns = {
            c.lower() for name, cs in self.catalog.items() if name.lower() == table for c in cs
        }
        resolved = []
        for node in group.expressions:
            if isinstance(node, exp.Literal) and not node.is_string:
                if not node.this.isdigit() or not 1 <= int(node.this) <= len(bodies):
                    self.reject(
                        node, f"GROUP BY {node.this}: the select list has {len(bodies)} items"
                    )
                if any(True for _ in _dp_aggregates(bodies[int(node.this) - 1])):
                    self.reject(node, f"GROUP BY {node.this} refers to an aggregate")
                node = bodies[int(node.this) - 1]
            elif (
                isinstance(node, exp.Column)
                and not node.table
                and node.name.lower() in aliases
                and node.name.lower() not in columns
            ):
                node = aliases[node.name.lower()]
            resolved.append(node)
        return resolved

    def expand_stars(self, outer: exp.Select, names: list[str]) -> None:
        items: list[exp.Expression] = []
        for node in outer.expressions:
            if isinstance(node, exp.Star) or (
                isinstance(node, exp.Column) and isinstance(node.this, exp.Star)
            ):
                items += [exp.column(n, quoted=True) for n in names]
            else:
                items.append(node)
        outer.set("expressions", items)

    def rewrite_outer(self, outer: exp.Select, resolve) -> None:
        """Check the outer query reads the released table only, and resolve its columns."""
        for node in list(outer.walk()):
            if node is outer:
                continue
            if isinstance(node, (exp.Subquery, exp.Select, exp.Union, exp.Table, exp.Join)):
                if isinstance(node, exp.Table) and node.name == RELEASED:
                    continue
                if isinstance(node, exp.Subquery) and node.alias == RELEASED:
                    continue
                if (
                    isinstance(node, exp.Select)
                    and isinstance(node.parent, exp.Subquery)
                    and node.parent.alias == RELEASED
                ):
                    continue
                self.reject(
                    node,
                    "post-processing reads the released answer only: no "
                    "subqueries or other tables outside the DP query",
                )
        for column in list(outer.find_all(exp.Column)):
            if isinstance(column.this, exp.Star):
                self.reject(column, "* is only allowed inside COUNT(*)")
            clause = "ORDER BY" if column.find_ancestor(exp.Order) is not None else ""
            if column.find_ancestor(exp.Window) is not None:
                clause = ""
            resolved = resolve(column, clause)
            if resolved is not column:
                column.replace(resolved)

    def check_functions(self, outer: exp.Select) -> None:
        """Refuse any function outside ``_ALLOWED_FUNCTIONS`` in the outer query."""
        for node in outer.walk():
            if isinstance(node, exp.Func) and not isinstance(node, _ALLOWED_FUNCTIONS):
                name = node.sql(dialect="duckdb").split("(", 1)[0]  # UNNEST, not Explode
                self.reject(
                    node,
                    f"post-processing cannot call {name.upper()}: it may use arithmetic, "
                    "rounding, CASE, casts, aggregates and window functions over the released "
                    "rows, and text and date functions that return one value of bounded size "
                    "(no set-returning, list or text-repeating functions)",
                )

    def finish(
        self,
        outer: exp.Select,
        released: dict[str, str],
        aggregates: tuple[str, ...],
        keys: tuple[str, ...],
        originals: list[str],
    ) -> PostProcess:
        self.check_functions(outer)
        names = [n.alias for n in outer.expressions]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            self.reject(outer, f"output column names must be distinct, repeated: {duplicates}")
        rowwise = not (
            outer.args.get("group")
            or outer.args.get("distinct")
            or any(_outer_aggregates(n) for n in outer.expressions)
        )
        copies: dict[str, str] = {}
        exact: dict[str, tuple[str, str]] = {}
        derived: dict[str, str] = {}
        for node, name, original in zip(outer.expressions, names, originals, strict=True):
            body = node.this
            sources = {c.name for c in body.find_all(exp.Column)}
            if isinstance(body, exp.Column) and body.name in released:
                if body.name in aggregates:
                    copies[name] = body.name
                continue
            derived[name] = original
            used = sources & set(aggregates)
            if rowwise and len(used) == 1:
                (source,) = used
                if _monotone(body, source, set(keys)):
                    exact[name] = (source, body.sql(dialect="duckdb"))
        if rowwise:
            outer = outer.select(exp.column(ROW, quoted=True), copy=False)
        text = outer.sql(dialect="duckdb")
        return PostProcess(
            outer=text,
            columns=tuple(names),
            released_columns=released,
            aggregates=aggregates,
            copies=copies,
            exact=exact,
            derived=derived,
            rowwise=rowwise,
        )


def _item(node: exp.Expression, dialect: str) -> tuple[str, str]:
    """A select item's output name (its alias, a column's name, else its text) and its text."""
    body = node.this if isinstance(node, exp.Alias) else node
    text = body.sql(dialect=dialect)
    if isinstance(node, exp.Alias):
        return node.alias, text
    if isinstance(node, exp.Column):
        return node.name, text
    return text, text


def _text(node: exp.Expression) -> str:
    """A spelling of ``node`` that ignores table qualifiers and case of unquoted names."""
    copy = node.copy()
    for column in copy.find_all(exp.Column):
        column.set("table", None)
    return copy.sql(dialect="duckdb", normalize=True).lower()


def _dp_aggregates(node: exp.Expression) -> Iterator[exp.Expression]:
    """The aggregates of ``node`` the DP query computes: every aggregate function that is not
    itself a window function (``LAG(COUNT(*)) OVER (...)``: COUNT(*) is, LAG is not)."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, (exp.Filter, exp.WithinGroup)) and isinstance(
            current.this, exp.AggFunc
        ):
            yield current  # agg(...) FILTER (WHERE ...) is one aggregate
            continue
        if isinstance(current, exp.AggFunc) and not isinstance(current.parent, exp.Window):
            yield current
            continue
        stack.extend(current.iter_expressions())


def _outer_aggregates(node: exp.Expression) -> bool:
    """Whether the outer query aggregates released rows (not as a window function)."""
    return any(
        isinstance(n, exp.AggFunc) and not isinstance(n.parent, exp.Window) for n in node.walk()
    )


def _needs_post(select: exp.Select) -> bool:
    """Whether ``select`` has a part the allow-list does not take as written but that
    post-processing answers."""
    if any(select.args.get(k) for k in ("order", "limit", "offset", "qualify")):
        return True
    group = select.args.get("group")
    if group is not None and (
        group.args.get("all")
        or any(isinstance(g, exp.Literal) and not g.is_string for g in group.expressions)
    ):
        return True
    having = select.args.get("having")
    if having is not None and not _plain_having(having.this) and not select.args.get("joins"):
        return True
    for node in select.expressions:
        body = node.this if isinstance(node, exp.Alias) else node
        if isinstance(body, exp.Column | exp.Star):
            continue
        if isinstance(body, _DP_AGGREGATES) or (
            isinstance(body, exp.Filter) and isinstance(body.this, _DP_AGGREGATES)
        ):
            continue
        if any(True for _ in _dp_aggregates(body)) or body.find(exp.Window) is not None:
            return True
    return False


def _plain_having(node: exp.Expression) -> bool:
    """``COUNT(*) > n`` and its kin: the allow-list's own HAVING (kept in the DP query)."""
    if not isinstance(node, _PLAIN_HAVING):
        return False
    sides = (node.this, node.expression)
    return any(isinstance(s, exp.Count) and isinstance(s.this, exp.Star) for s in sides)


def _constant(node: exp.Expression, keys: set[str]) -> bool:
    """Literals and group keys combined by arithmetic: constant within one released row."""
    if isinstance(node, exp.Literal):
        return not node.is_string
    if isinstance(node, exp.Column):
        return node.name in keys
    if isinstance(node, (exp.Paren, exp.Neg)):
        return _constant(node.this, keys)
    if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Div)):
        return _constant(node.this, keys) and _constant(node.expression, keys)
    return False


def _monotone(node: exp.Expression, source: str, keys: set[str]) -> bool:
    """Whether ``node`` is a monotone (non-decreasing or non-increasing) function of column
    ``source`` when every other input is constant: then it maps the ends of ``source``'s
    interval to the ends of an interval for itself, with the same coverage."""
    if isinstance(node, exp.Column):
        return node.name == source
    if isinstance(node, (exp.Paren, exp.Neg)):
        return _monotone(node.this, source, keys)
    if isinstance(node, (exp.Add, exp.Sub)):
        left, right = node.this, node.expression
        return (_monotone(left, source, keys) and _constant(right, keys)) or (
            _constant(left, keys) and _monotone(right, source, keys)
        )
    if isinstance(node, exp.Mul):
        left, right = node.this, node.expression
        return (_monotone(left, source, keys) and _constant(right, keys)) or (
            _constant(left, keys) and _monotone(right, source, keys)
        )
    if isinstance(node, exp.Div):
        return _monotone(node.this, source, keys) and _constant(node.expression, keys)
    if isinstance(node, _MONOTONE_FUNCTIONS):
        others = [v for k, v in node.args.items() if k != "this" and isinstance(v, exp.Expression)]
        return _monotone(node.this, source, keys) and all(_constant(o, keys) for o in others)
    if isinstance(node, exp.Cast):
        return node.to.is_type(*exp.DataType.NUMERIC_TYPES) and _monotone(node.this, source, keys)
    return False


def source_only(parsed: ParsedQuery) -> ParsedQuery | None:
    """``parsed`` reduced to ``SELECT COUNT(*) FROM ... WHERE ...``, to report problems in FROM
    and WHERE before those of the select list, as the allow-list reads them (None for a query
    that is not a SELECT from a table)."""
    select = parsed.expression
    source = select.args.get("from_") or select.args.get("from")
    if not isinstance(select, exp.Select) or source is None:
        return None
    if not isinstance(source.this, exp.Table):
        return None
    reduced = select.copy()
    for clause in ("group", "having", "order", "limit", "offset", "qualify", "windows"):
        reduced.set(clause, None)
    reduced.set("expressions", [exp.Count(this=exp.Star())])
    return replace(parsed, expression=reduced)


def split(
    parsed: ParsedQuery, catalog: Mapping[str, Mapping[str, str]]
) -> tuple[ParsedQuery, PostProcess | None]:
    """The DP query to charge and answer, and the post-processing of its answer (None when the
    query is a plain DP query); ``catalog`` (table -> column -> type) tells a GROUP BY alias from
    a column of the table."""
    return _Splitter(parsed, catalog).split()


def released_types(shape: QueryShape, catalog: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """The DuckDB type of each column of the released answer of ``shape``: a group key keeps its
    column's type, a count is a BIGINT, a sum or mean a DOUBLE."""
    types: dict[str, str] = {}
    public = shape.range_join.table if shape.range_join is not None else None
    for output in shape.outputs:
        if isinstance(output, GroupKey):
            source = catalog[public] if public is not None else shape.types
            types[output.name] = source[output.column]
        elif output.kind in (AggregateKind.COUNT, AggregateKind.PERSONS):
            types[output.name] = "BIGINT"
        else:
            types[output.name] = "DOUBLE"
    return types


def create_released(connection: duckdb.DuckDBPyConnection, post: PostProcess) -> None:
    """Create the empty ``released`` table (the released columns in their types, and the row
    number) on ``connection``."""
    spec = ", ".join(
        f"{exp.to_identifier(n, quoted=True).sql(dialect='duckdb')} {t}"
        for n, t in post.types.items()
    )
    connection.execute(f'CREATE TABLE {RELEASED} ({spec}, "{ROW}" BIGINT)')


def check(post: PostProcess) -> None:
    """Bind the outer query against an empty released table before anything is charged: a
    post-processing query DuckDB cannot run is refused, not paid for (within the request's
    time limit, ``dpsql.deadline``)."""
    from dpsql import deadline

    connection = sandbox()
    try:
        with deadline.watching(connection):
            create_released(connection, post)
            connection.execute(post.outer).fetchmany(2)
    except duckdb.Error as error:
        first = str(error).split("\n")[0]
        raise UnsupportedQueryError(
            f"the post-processing of the released answer cannot run: {first}"
        ) from None
    finally:
        connection.close()
