"""Prepared queries: a text bound from its template is bound exactly as if it were parsed.

Hypothesis writes one query skeleton (WHERE predicates over columns of every type: =, <>, <,
BETWEEN, BETWEEN SYMMETRIC, IN, NOT, AND, OR, LIKE, ILIKE, starts_with, lower/upper/trim, typed
literals and minuses around literals; with
GROUP BY, HAVING, ORDER BY, LIMIT and OPTIONS around them), then three texts of it with
literals an adversary would pick (beyond a type's range or precision, text for numbers, quotes,
empty strings, values outside an ENUM or the declared partition values). Through
``BoundQueries`` the first text is bound from scratch, the second makes the template, the third
is filled from it; each outcome must equal the bind of the same text from scratch: the same
shape, ledger text and policy, or the same refusal. A twin that keeps the template's first
values fails this.
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

import dpsql
from dpsql.engine import prepared
from dpsql.engine.backends import DuckDBBackend
from dpsql.engine.literals import Binder
from dpsql.engine.policy import parse_policy
from dpsql.engine.query import BoundQueries, BoundQuery, bind
from dpsql.errors import DpsqlError

EXAMPLES = int(os.environ.get("DPSQL_PREPARED_EXAMPLES", "60"))

SPELLINGS = {
    "i": ("0", "5", "-3", "2147483647", "2147483648", "2.5", "'7'", "1e3"),
    "b": ("5", "7", "-1", "9007199254740993", "9223372036854775808", "1e400", "'x'"),
    "h": ("0", "12", "170141183460469231731687303715884105727",
          "170141183460469231731687303715884105728"),
    "d": ("0.5", "0.25", "0.1", "4611686018427387905", "1e300", "1e400", "-0.0", "'0.1'"),
    "f": ("0.5", "3", "16777217", "3e38", "4e38", "0.1"),
    "m": ("1.5", "2.25", "1.5005", "999999999999999.999", "1e15", "-2"),
    "s": ("'DK'", "'dk'", "''", "'it''s'", "'5'", "5"),
    "e": ("'DK'", "'x'", "'a'", "'zz'", "''"),
    "dt": ("'2024-01-01'", "'2024-03-01'", "'2024-02-30'", "'2024-1-1'", "'2024-01-01 12:00'", "5"),
    "ts": ("'2024-01-01 12:00:00'", "'2024-01-01'", "'2024-01-01T00:00'", "'2024-13-01'"),
    "tz": ("'2024-01-01 00:00:00+01:00'", "'2024-06-01 00:00:00+00:00'",
           "'2024-01-01 00:00:00'", "'2024-01-01 00:00Z'"),
    "p": ("'DK'", "'NO'", "'it''s'", "'SE'", "''"),
}  # fmt: skip
"""Literals compared with each column: values of its type and an adversary's choices (beyond
its range or precision, another type, outside the ENUM or the declared partition values)."""

TYPED = {
    "dt": ("DATE {}", "CAST({} AS DATE)", "{}::DATE", "-{}"),
    "ts": ("TIMESTAMP {}", "CAST({} AS TIMESTAMP)", "{}::TIMESTAMP", "CAST({} AS DATE)"),
    "tz": ("TIMESTAMPTZ {}", "{}::TIMESTAMPTZ"),
    "i": ("-{}", "CAST({} AS INTEGER)"),
    "m": ("-{}",),
    "s": ("{}::VARCHAR",),
}
"""Forms around a literal: typed literals (the analyzer reads through them for DATE and
TIMESTAMP columns, refuses them elsewhere), minuses (for numbers; refused for text)."""

COLUMNS = tuple(SPELLINGS)
"""INTEGER, BIGINT, HUGEINT, DOUBLE, FLOAT, DECIMAL, VARCHAR, ENUM, DATE, TIMESTAMP,
TIMESTAMPTZ, and the partition column p (VARCHAR, declared values)."""

POLICY = """
[dataset]
name = "prepared"
epsilon = 100.0
delta = 1e-6

[analysts.alice]
epsilon = 100.0

[tables.t]
privacy_unit = "u"
max_rows_per_unit = 4
partition_column = "p"

[tables.t.columns.x]
bounds = [0, 10]

[tables.t.columns.p]
public_keys = ["DK", "NO", "it's"]
"""


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prepared") / "t.duckdb"
    with duckdb.connect(str(path)) as connection:
        connection.execute("CREATE TYPE mood AS ENUM ('DK', 'x', 'a')")
        connection.execute(
            "CREATE TABLE t (u BIGINT, x INTEGER, i INTEGER, b BIGINT, h HUGEINT, d DOUBLE, "
            "f FLOAT, m DECIMAL(18,3), s VARCHAR, e mood, dt DATE, ts TIMESTAMP, "
            "tz TIMESTAMPTZ, p VARCHAR)"
        )
        connection.execute(
            "INSERT INTO t VALUES (1, 3, 5, 5, 5, 0.1, 0.5, 1.5, 'DK', 'DK', DATE '2024-01-01', "
            "TIMESTAMP '2024-01-01 12:00:00', TIMESTAMPTZ '2024-01-01 00:00:00+00', 'DK')"
        )
    dpsql.set_policy(path, POLICY)
    return path


@st.composite
def skeletons(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A query with ``{}`` where each literal goes, and the column each is compared with."""
    kinds: list[str] = []
    column = ""

    def literal() -> str:
        kinds.append(column)
        typed = TYPED.get(column)
        return draw(st.sampled_from(["{}", "{}", "{}", *typed])) if typed else "{}"

    def atom() -> str:
        nonlocal column
        column = draw(st.sampled_from(COLUMNS))
        form = draw(st.sampled_from(["cmp", "between", "symmetric", "in", "not", "text"]))
        if form == "text":  # a LIKE or a text function: the string column s, or p
            column = draw(st.sampled_from(["s", "p"]))
            operand = draw(st.sampled_from(["{}", "lower({})", "upper(trim({}))"])).format(column)
            shape = draw(
                st.sampled_from(["{} LIKE {}", "{} ILIKE {}", "{} NOT LIKE {}", "{} = {}",
                                 "{1} <> {0}", "starts_with({}, {})"])
            )  # fmt: skip
            return shape.format(operand, literal())
        if form == "between":
            return f"{column} BETWEEN {literal()} AND {literal()}"
        if form == "symmetric":
            return f"{column} BETWEEN SYMMETRIC {literal()} AND {literal()}"
        if form == "in":
            return f"{column} IN ({', '.join(literal() for _ in range(draw(st.integers(1, 3))))})"
        operator = draw(st.sampled_from(["=", "<>", "<", ">=", "<="]))
        if form == "not":
            return f"NOT ({column} {operator} {literal()})"
        if draw(st.booleans()):
            return f"{literal()} {operator} {column}"
        return f"{column} {operator} {literal()}"

    where = atom()
    for _ in range(draw(st.integers(0, 2))):
        where = f"({where}) {draw(st.sampled_from(['AND', 'OR']))} {atom()}"
    select = draw(st.sampled_from(["COUNT(*)", "SUM(x)", "COUNT(*) AS n", "SUM(x) * 2 AS y"]))
    tail = draw(
        st.sampled_from(
            ["", " GROUP BY p", " -- note", " GROUP BY p HAVING COUNT(*) > 1",
             " GROUP BY p ORDER BY 2 DESC LIMIT 2"]
        )
    )  # fmt: skip
    if tail.startswith(" GROUP BY p"):
        select = f"p, {select}"
    dp = draw(st.sampled_from(["", "WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=0.5) "]))
    return f"SELECT {dp}{select} FROM t WHERE {where}{tail}", kinds


def values(columns: list[str], valid: bool) -> st.SearchStrategy[list[str]]:
    """A literal for each column: its first spelling's kind (``valid``), or any of them."""
    return st.tuples(
        *(st.sampled_from(SPELLINGS[c][:2] if valid else SPELLINGS[c]) for c in columns)
    ).map(list)


def outcome(run) -> tuple[str, ...]:  # type: ignore[no-untyped-def]
    """A bind's result as comparable text: its shape, ledger text and policy, or its refusal."""
    try:
        found: BoundQuery = run()
    except DpsqlError as error:
        return ("refused", type(error).__name__, str(error))
    where = found.bound.shape.where
    return (
        repr(found.bound),
        found.normalized,
        str(id(found.policy)),
        where.sql(dialect="duckdb") if isinstance(where, exp.Expression) else "",
    )


def _compare(database: Path, skeleton: str, vectors: list[list[str]], filled: list[int]) -> bool:
    """Whether every text, bound through one ``BoundQueries``, equals its bind from scratch."""
    backend = DuckDBBackend(database)
    try:
        policy = parse_policy(POLICY)
        binder = Binder(backend, backend.catalog())
        kept = BoundQueries()
        arguments = {"dialect": "duckdb", "policy": policy, "backend": backend, "binder": binder}
        same = True
        for vector in vectors:
            sql = skeleton.format(*vector)
            before = len(filled)
            kept_outcome = outcome(lambda sql=sql: kept.bound(sql, **arguments))
            if len(filled) > before and kept_outcome[0] == "refused":
                filled.pop()  # filled, refused, and bound afresh: not a filled answer
            scratch = outcome(lambda sql=sql: bind(sql, **arguments))
            same = same and kept_outcome == scratch
        return same
    finally:
        backend.close()


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the texts bound from a template."""
    filled: list[int] = []
    original = prepared.fill

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = original(*args, **kwargs)
        filled.append(1)
        return result

    monkeypatch.setattr("dpsql.engine.query.fill", counted)
    return filled


def test_a_text_filled_from_its_template_is_bound_as_if_parsed(
    database: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    filled = _counting(monkeypatch)

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,  # a fixed seed: the count of filled texts below is reproducible
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        skeleton, columns = data.draw(skeletons())
        # two valid texts make the template; the third is valid too, or any
        third = data.draw(st.booleans())
        vectors = [data.draw(values(columns, valid)) for valid in (True, True, third)]
        assert _compare(database, skeleton, vectors, filled)

    check()
    # the property is about filled texts: enough of them were filled, not refused
    assert len(filled) >= EXAMPLES // 8


FIXED = [
    ("SELECT COUNT(*) FROM t WHERE i BETWEEN {} AND {} AND s = {}",
     [["1", "5", "'DK'"], ["2", "6", "'x'"], ["0", "9", "'it''s'"]]),
    ("SELECT p, SUM(x) FROM t WHERE p IN ({}, {}) AND b > -{} GROUP BY p",
     [["'DK'", "'NO'", "5"], ["'NO'", "'it''s'", "1"], ["'DK'", "'it''s'", "7"]]),
    ("SELECT COUNT(*) FROM t WHERE dt >= {} AND e = {}",
     [["'2024-01-01'", "'DK'"], ["'2024-01-02'", "'x'"], ["'2023-12-31'", "'a'"]]),
    ("SELECT COUNT(*) FROM t WHERE dt BETWEEN DATE {} AND {}::DATE AND ts < TIMESTAMP {}",
     [["'2024-01-01'", "'2024-02-01'", "'2024-03-01 00:00:00'"],
      ["'2024-01-02'", "'2024-02-02'", "'2024-03-02 12:00:00'"],
      ["'2023-12-31'", "'2024-12-31'", "'2024-01-01'"]]),
]  # fmt: skip


def test_the_fixed_queries_are_filled(database: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    filled = _counting(monkeypatch)
    for skeleton, vectors in FIXED:
        assert _compare(database, skeleton, vectors, filled)
    assert len(filled) == len(FIXED)  # the third text of each


def test_a_twin_that_keeps_the_first_values_fails(
    database: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = prepared.literal_for
    first: dict[tuple[str, int], exp.Expression] = {}

    def stale(parsed, columns, node, name):  # type: ignore[no-untyped-def]
        made = original(parsed, columns, node, name)
        return first.setdefault((name, len(first) % 3), made)

    monkeypatch.setattr(prepared, "literal_for", stale)
    filled = _counting(monkeypatch)
    assert not all(_compare(database, s, v, filled) for s, v in FIXED)


def test_literals_outside_where_are_part_of_the_skeleton(
    database: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    filled = _counting(monkeypatch)
    vary = [["1", "2"], ["3", "4"], ["5", "6"]]
    keep = [["1", "2"], ["3", "2"], ["5", "2"]]
    for skeleton in (
        "SELECT p, COUNT(*) FROM t WHERE i > {} GROUP BY p HAVING COUNT(*) > {}",
        "SELECT p, COUNT(*) FROM t WHERE i > {} GROUP BY p ORDER BY 2 LIMIT {}",
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon={1}) COUNT(*) FROM t WHERE i > {0}",
    ):
        assert _compare(database, skeleton, vary, filled)
        assert filled == []  # another HAVING, LIMIT or option: another skeleton
        assert _compare(database, skeleton, keep, filled)
        assert filled == [1]  # the same one, other values in WHERE: filled
        filled.clear()


HOSTILE = [
    # adjacent strings are one literal to the parser: no slot may stand for either
    ("SELECT COUNT(*) FROM t WHERE s = {} {}", [["'D'", "'K'"], ["'N'", "'O'"], ["'d'", "'k'"]]),
    # text the parser reads inside a literal (an interval's unit)
    ("SELECT COUNT(*) FROM t WHERE dt > DATE '2024-01-01' - INTERVAL {}",
     [["'1 day'"], ["'2 days'"], ["'1'"]]),
    # a value that looks like the template's own marker
    ("SELECT COUNT(*) FROM t WHERE s = {}",
     [["'__dpsql_slot_0'"], ["'x'"], ["'__dpsql_slot_1'"]]),
    # a comment holding quotes and markers: kept in the skeleton and the ledger's text
    ("SELECT COUNT(*) FROM t WHERE i > {} /* '__dpsql_slot_0' 'it''s' */",
     [["1"], ["2"], ["3"]]),
    # placeholders the analyst wrote are not slots
    ("SELECT COUNT(*) FROM t WHERE i > {} AND b = ?", [["1"], ["2"], ["3"]]),
    # a number and a string for one column
    ("SELECT COUNT(*) FROM t WHERE i = {} OR i = {}", [["5", "'5'"], ["6", "'6'"], ["7", "'x'"]]),
    # LIKE patterns and text functions take their own paths, not a compared value's
    ("SELECT COUNT(*) FROM t WHERE s LIKE {}", [["'D%'"], ["'N%'"], ["'%'"]]),
    ("SELECT COUNT(*) FROM t WHERE lower(s) = {}", [["'dk'"], ["'no'"], ["'x'"]]),
    # a literal in the select list or a function's argument
    ("SELECT SUM(x) + {} FROM t WHERE i > {}", [["1", "1"], ["2", "2"], ["3", "3"]]),
    ("SELECT COUNT(*) FROM t WHERE i > abs({})", [["1"], ["-2"], ["3"]]),
    # a subquery holding the literal
    ("SELECT COUNT(*) FROM t WHERE u IN (SELECT u FROM t WHERE i > {})", [["1"], ["2"], ["3"]]),
    # the partition column with values the policy does not declare
    ("SELECT COUNT(*) FROM t WHERE p = {}", [["'DK'"], ["'NO'"], ["'SE'"]]),
    # a value beyond the column's type once the template exists
    ("SELECT COUNT(*) FROM t WHERE i BETWEEN {} AND {}",
     [["1", "2"], ["3", "4"], ["1", "2147483648"]]),
]  # fmt: skip


FILLED = {2, 3, 6, 7}
"""The hostile texts whose third text is answered from the template (the marker-like value, the
comment, LIKE, a text function); the others have no template, or their third text is refused by
it and bound afresh."""


@pytest.mark.parametrize("case", range(len(HOSTILE)))
def test_hostile_texts_bind_as_if_parsed(
    database: Path, monkeypatch: pytest.MonkeyPatch, case: int
) -> None:
    filled = _counting(monkeypatch)
    skeleton, vectors = HOSTILE[case]
    assert _compare(database, skeleton, vectors, filled)
    assert len(filled) == (case in FILLED)


def test_texts_asked_once_do_not_push_templates_out(
    database: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    filled = _counting(monkeypatch)
    backend = DuckDBBackend(database)
    try:
        kept = BoundQueries(size=8)
        arguments = {
            "dialect": "duckdb",
            "policy": parse_policy(POLICY),
            "backend": backend,
            "binder": Binder(backend, backend.catalog()),
        }
        for low in (1, 2):
            kept.bound(f"SELECT COUNT(*) FROM t WHERE i > {low}", **arguments)
        for n in range(20):  # one-off texts: more than the templates kept
            kept.bound(f"SELECT COUNT(*) FROM t WHERE i > 1 -- {n}", **arguments)
        kept.bound("SELECT COUNT(*) FROM t WHERE i > 3", **arguments)
        assert filled == [1]
    finally:
        backend.close()
