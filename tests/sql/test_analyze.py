"""The allow-list, driven by ``fixtures/accepted.sql`` and ``fixtures/rejected.sql``.

Accepted queries must produce the expected shape, and their re-emitted WHERE clause must select
exactly the rows the user's own WHERE selects when both run on DuckDB. Rejected queries must raise
the expected class with the expected position in the text as written, and their messages may quote
only the query itself and the names of the table and columns it uses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import duckdb
import pytest
from sqlglot import exp

import dpsql.errors as errors
from dpsql.engine.literals import Binder
from dpsql.engine.policy import Policy
from dpsql.errors import QueryError, SqlSyntaxError
from dpsql.sql.analyze import analyze
from dpsql.sql.parse import parse
from dpsql.sql.shape import Aggregate, AggregateKind, ColumnKind, GroupKey, QueryShape

FIXTURES = Path(__file__).parent / "fixtures"

CATALOG: dict[str, dict[str, str]] = {
    "People": {
        "user_id": "BIGINT",
        "age": "INTEGER",
        "income": "DOUBLE",
        "name": "VARCHAR",
        "joined": "DATE",
        "seen": "TIMESTAMP",
        "active": "BOOLEAN",
        "score": "DECIMAL(10,2)",
        "photo": "BLOB",
    },
    "visits": {"user_id": "BIGINT", "site": "VARCHAR", "secs": "INTEGER"},
    "hidden_salaries": {"ssn_secret": "VARCHAR", "salary_secret": "DOUBLE"},
}
"""Table -> column -> type; ``hidden_salaries`` is in no fixture, so no message may name it."""

_PEOPLE_ROWS = [
    "(1, 17, 0.25, 'ann', '2024-01-31', '2024-01-31 09:59:59', true, 10.25)",
    "(2, 18, 1000.5, 'bob', '2023-01-01', '2024-01-31 10:00:00', false, 10.24)",
    "(3, 65, -10.5, 'cy', '2024-06-30', '2023-12-31 23:59:59', NULL, NULL)",
    "(4, 30, 2000.0, 'O''Brien', '2024-02-29', NULL, true, 99.99)",
    "(5, 41, -0.3, NULL, '2019-12-31', '2024-01-01 00:00:00', false, 0)",
    "(6, NULL, NULL, 'dan', NULL, '2025-05-05 05:05:05', NULL, -1)",
    "(7, 64, 'NaN', 'bea', '2020-01-01', '2024-02-01 00:00:00', true, 5)",
    "(8, 5, -5, 'b', '2024-01-01', '2024-01-01 00:00:01', true, 10.26)",
    "(9, 60, 1500, 'bob', '2021-07-04', '2022-02-02 02:02:02', true, 3)",
    "(10, -6, -0.2, 'cy', '2024-01-30', '2024-01-31 10:00:01', false, 11)",
    "(9223372036854775807, 33, 1.5, 'zed', '2024-02-01', NULL, NULL, 1)",
    "(-9223372036854775808, 34, 2.5, 'ann', '2023-12-31', NULL, true, 2)",
]
_VISITS_ROWS = ["(1, 'a', 0)", "(1, 'a', 3600)", "(2, 'b', 3601)", "(3, 'b', -1)", "(4, NULL, 5)"]


class _Empty:
    """An in-memory DuckDB holding CATALOG's tables, empty: it converts literals, reads no row."""

    def __init__(self) -> None:
        self.connection = duckdb.connect()
        for table, columns in CATALOG.items():
            spec = ", ".join(f'"{c}" {t}' for c, t in columns.items())
            self.connection.execute(f'CREATE TABLE "{table}" ({spec})')

    def run(self, sql: str):
        return self.connection.execute(sql).df()


_BINDER = Binder(_Empty(), CATALOG)
_NO_POLICY = Policy.model_validate({"dataset": {"epsilon": 1.0}})


def bound(query: str) -> QueryShape:
    """The shape as the engine sees it: analysed, then its literals converted by DuckDB."""
    return _BINDER.bind(analyze(parse(query), CATALOG), _NO_POLICY).shape


# --- fixture files -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One block of a fixture file: its headers and the query text as written."""

    name: str
    headers: dict[str, str] = field(default_factory=dict)
    query: str = ""


def read_cases(path: Path) -> list[Case]:
    """Split a fixture file on ``--! case:`` lines; ``--! key: value`` lines are headers."""
    cases: list[Case] = []
    blocks = re.split(r"^(?=--! case:)", path.read_text(encoding="utf-8"), flags=re.MULTILINE)
    for block in blocks:
        if not block.startswith("--! case:"):
            continue
        lines = block.split("\n")
        headers: dict[str, str] = {}
        while lines and lines[0].startswith("--! "):
            key, _, value = lines.pop(0)[4:].partition(":")
            assert key.strip() not in headers, f"{path.name}: header {key!r} repeated"
            headers[key.strip()] = value.strip()
        while lines and not lines[0].strip():
            lines.pop(0)
        while lines and not lines[-1].strip():
            lines.pop()
        name = headers.pop("case")
        assert lines, f"{path.name}: case {name!r} has no query"
        cases.append(Case(name, headers, "\n".join(lines)))
    names = [c.name for c in cases]
    assert len(set(names)) == len(names), f"{path.name}: duplicate case names"
    return cases


def _params(path: Path) -> list[object]:
    params = []
    for case in read_cases(path):
        reason = case.headers.get("xfail")
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(case, id=case.name, marks=marks))
    return params


ACCEPTED = _params(FIXTURES / "accepted.sql")
REJECTED = _params(FIXTURES / "rejected.sql")
REJECTED_UNMARKED = [pytest.param(c, id=c.name) for c in read_cases(FIXTURES / "rejected.sql")]


def test_fixture_files_are_substantial() -> None:
    assert len(ACCEPTED) >= 35
    assert len(REJECTED) >= 80
    for case in read_cases(FIXTURES / "rejected.sql"):
        assert set(case.headers) <= {"error", "message", "at", "xfail"}, case.name
        assert {"error", "message", "at"} <= set(case.headers), case.name


# --- accepted ----------------------------------------------------------------------------------


def _expected_outputs(spec: str) -> tuple[Aggregate | GroupKey, ...]:
    outputs: list[Aggregate | GroupKey] = []
    for item in filter(None, (part.strip() for part in spec.split(" ; "))):
        match = re.fullmatch(r"(count|sum|avg|key|quantile)\((.*?)\) AS (.+)", item)
        assert match, f"bad outputs item {item!r}"
        function, argument, name = match.groups()
        if function == "quantile":
            column, q = (part.strip() for part in argument.split(","))
            outputs.append(Aggregate(AggregateKind.QUANTILE, column, name, Fraction(q)))
        elif function == "key":
            outputs.append(GroupKey(argument, name))
        else:
            column = None if argument == "*" else argument
            outputs.append(Aggregate(AggregateKind(function), column, name))
    return tuple(outputs)


def _expected_options(spec: str | None) -> dict[str, float]:
    if not spec:
        return {}
    pairs = (item.split("=") for item in spec.split(","))
    return {name.strip(): float(value) for name, value in pairs}


@pytest.mark.parametrize("case", ACCEPTED)
def test_accepted_shape(case: Case) -> None:
    shape = bound(case.query)
    headers = case.headers
    assert shape.table == headers["table"]
    assert shape.outputs == _expected_outputs(headers["outputs"])
    group_by = tuple(c.strip() for c in headers["group_by"].split(",") if c.strip())
    assert shape.group_by == group_by
    where = None if shape.where is None else shape.where.sql(dialect="duckdb")
    assert where == (None if headers["where"] == "none" else headers["where"])
    assert shape.options == _expected_options(headers.get("options"))
    assert shape.columns == {c: ColumnKind.of(t) for c, t in CATALOG[shape.table].items()}
    assert shape.column_names == tuple(o.name for o in shape.outputs)
    assert shape.aggregates == tuple(o for o in shape.outputs if isinstance(o, Aggregate))


@pytest.fixture(scope="module")
def database() -> duckdb.DuckDBPyConnection:
    connection = duckdb.connect()
    columns = ", ".join(f'"{c}" {t}' for c, t in CATALOG["People"].items())
    connection.execute(f'CREATE TABLE "People" ({columns})')
    connection.execute(
        'INSERT INTO "People" (user_id, age, income, name, joined, seen, active, score) VALUES '
        + ", ".join(_PEOPLE_ROWS)
    )
    connection.execute("CREATE TABLE visits (user_id BIGINT, site VARCHAR, secs INTEGER)")
    connection.execute("INSERT INTO visits VALUES " + ", ".join(_VISITS_ROWS))
    return connection


@pytest.mark.parametrize("case", ACCEPTED)
def test_accepted_where_selects_the_same_rows_as_the_original(
    case: Case, database: duckdb.DuckDBPyConnection
) -> None:
    """The re-emitted, typed WHERE is equivalent to the user's on real data (sqlglot's method)."""
    parsed = parse(case.query)
    shape = bound(case.query)
    if shape.where is None:
        return
    original = parsed.expression.copy()
    original.set("expressions", [exp.Count(this=exp.Star())])
    original.set("group", None)
    expected = database.execute(original.sql(dialect="duckdb")).fetchone()
    rewritten = f'SELECT COUNT(*) FROM "{shape.table}" WHERE {shape.where.sql(dialect="duckdb")}'
    assert database.execute(rewritten).fetchone() == expected


def test_accepted_where_clauses_are_not_trivial(database: duckdb.DuckDBPyConnection) -> None:
    """The equivalence check has teeth: the WHERE clauses select many different row counts."""
    counts = set()
    for param in ACCEPTED:
        case = param.values[0]
        shape = bound(case.query)
        if shape.where is not None:
            where = shape.where.sql(dialect="duckdb")
            sql = f'SELECT COUNT(*) FROM "{shape.table}" WHERE {where}'
            counts.add(database.execute(sql).fetchone()[0])
    assert len(counts) >= 6


def test_where_literals_are_typed() -> None:
    """Every literal compared with a numeric or temporal column is cast to the column's type."""
    shape = analyze(
        parse(
            "SELECT COUNT(*) FROM people WHERE age > 1 AND income < 2 AND joined = '2024-01-01' "
            "AND seen < '2024-01-01 10:00' AND score IN (1, 2.5)"
        ),
        CATALOG,
    )
    assert shape.where is not None
    casts = [c.to.sql(dialect="duckdb") for c in shape.where.find_all(exp.Cast)]
    assert sorted(casts) == [
        "DATE", "DECIMAL(10, 2)", "DECIMAL(10, 2)", "DOUBLE", "INT", "TIMESTAMP"
    ]
    columns = {c.name for c in shape.where.find_all(exp.Column)}
    assert columns == {"age", "income", "joined", "seen", "score"}
    assert all(c.this.quoted for c in shape.where.find_all(exp.Column))


def test_shape_is_independent_of_the_parsed_tree() -> None:
    parsed = parse("SELECT COUNT(*) FROM people p WHERE p.age > 3")
    shape = analyze(parsed, CATALOG)
    assert isinstance(shape, QueryShape)
    parsed.expression.args["where"].this.set("expression", exp.Literal.number(99))
    assert shape.where is not None
    assert shape.where.sql(dialect="duckdb") == '"age" > CAST(\'3\' AS INT)'


@pytest.mark.parametrize(
    ("type_name", "kind"),
    [
        ("BIGINT", ColumnKind.INTEGER),
        ("integer", ColumnKind.INTEGER),
        ("UHUGEINT", ColumnKind.INTEGER),
        ("DOUBLE", ColumnKind.FLOAT),
        ("real", ColumnKind.FLOAT),
        ("DECIMAL(18,3)", ColumnKind.DECIMAL),
        ("NUMERIC (10, 2)", ColumnKind.DECIMAL),
        ("VARCHAR", ColumnKind.STRING),
        ("BOOLEAN", ColumnKind.BOOLEAN),
        ("DATE", ColumnKind.DATE),
        ("TIMESTAMP WITH TIME ZONE", ColumnKind.TIMESTAMP),
        ("TIMESTAMP_NS", ColumnKind.TIMESTAMP),
        ("BLOB", ColumnKind.OTHER),
        ("INTEGER[]", ColumnKind.OTHER),
        ("STRUCT(a INTEGER)", ColumnKind.OTHER),
    ],
)
def test_column_kind_of(type_name: str, kind: ColumnKind) -> None:
    assert ColumnKind.of(type_name) is kind
    assert kind.numeric == (kind in (ColumnKind.INTEGER, ColumnKind.FLOAT, ColumnKind.DECIMAL))


# --- rejected ----------------------------------------------------------------------------------


def _position(spec: str) -> tuple[int | None, int | None]:
    if spec == "none":
        return None, None
    line, column = spec.split(":")
    return int(line), int(column)


def _analyze(query: str) -> QueryShape:
    return bound(query)


@pytest.mark.parametrize("case", REJECTED)
def test_rejected(case: Case) -> None:
    expected_class = getattr(errors, case.headers["error"])
    assert issubclass(expected_class, QueryError)
    with pytest.raises(QueryError) as caught:
        _analyze(case.query)
    error = caught.value
    assert type(error) is expected_class, str(error)
    assert case.headers["message"] in str(error)
    assert (error.line, error.column) == _position(case.headers["at"]), str(error)
    if error.line is not None:
        assert str(error).endswith(f"(line {error.line}, column {error.column})")
    assert "None" not in str(error)


def _normalized(text: str) -> str:
    return re.sub(r"\s+", "", text).lower()


def _quoted_fragments(message: str) -> list[str]:
    return re.findall(r"'((?:[^']|'')*)'", message)


_EXAMPLES = {"2024-01-31"}
"""Fixed examples that messages may quote (``compare it with an ISO string such as ...``)."""


@pytest.mark.parametrize("case", REJECTED_UNMARKED)
def test_rejection_messages_quote_only_the_query(case: Case) -> None:
    """Quoted fragments come from the query or name its table and columns; nothing else leaks.

    Runs on every fixture, known bugs included: a query the code wrongly accepts raises nothing
    here, and ``test_rejected`` reports it.
    """
    try:
        _analyze(case.query)
    except QueryError as caught:
        error = caught
    else:
        return
    message = str(error)
    for hidden in ["hidden_salaries", *CATALOG["hidden_salaries"]]:
        assert hidden not in message.lower()
    assert "<" not in message.replace("<table>", "").replace(" < ", "")
    fragments = _quoted_fragments(message)
    if isinstance(error, SqlSyntaxError):
        fragments = re.findall(r"near '((?:[^']|'')*)'", message)
    names = {_normalized(n) for n in CATALOG["People"]} | {"people", "visits"}
    for fragment in fragments:
        fragment = _normalized(fragment.replace("''", "'"))
        assert fragment in _normalized(case.query) or fragment in names | _EXAMPLES, (
            f"{fragment!r} is not from the query: {message}"
        )


def test_table_and_column_names_resolve_case_insensitively_to_catalog_spelling() -> None:
    shape = analyze(parse("SELECT SUM(Income) FROM PEOPLE WHERE NAME = 'x'"), CATALOG)
    assert shape.table == "People"
    assert shape.aggregates == (Aggregate(AggregateKind.SUM, "income", "SUM(Income)"),)
    assert shape.where is not None
    assert shape.where.sql(dialect="duckdb") == "\"name\" = 'x'"


def test_rejections_stop_at_the_first_problem_in_reading_order() -> None:
    """FROM is resolved before WHERE, WHERE before the select list."""
    with pytest.raises(errors.SchemaError, match="unknown table"):
        _analyze("SELECT SUM(name) FROM nope WHERE x = NULL")
    with pytest.raises(errors.SchemaError, match="unknown column 'nope'"):
        _analyze("SELECT SUM(name) FROM people WHERE nope = 1")
