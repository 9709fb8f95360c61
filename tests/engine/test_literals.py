"""The binder's conversion of literals: a few in one row, many in a VALUES list, alike."""

from __future__ import annotations

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import exp

from dpsql.engine import literals
from dpsql.engine.backends import DuckDBBackend
from dpsql.engine.literals import Binder
from dpsql.errors import UnsupportedQueryError

TYPES = ("INTEGER", "BIGINT", "HUGEINT", "DOUBLE", "FLOAT", "DECIMAL(18,3)", "VARCHAR", "DATE",
         "TIMESTAMP", "TIMESTAMPTZ", "BOOLEAN")  # fmt: skip
EDGES = ("0", "-1", "2.5", "1e3", "1e400", "9223372036854775808", "0.1", "16777217",
         "2024-01-01", "2024-02-30", "2024-01-01 12:00:00+01:00", "true", "x", "", "it's", " 5",
         "5 ", "NaN", "inf", "-0.0", "1.5005")  # fmt: skip
TEXTS = st.one_of(st.sampled_from(EDGES), st.text(max_size=8))


@pytest.fixture(scope="module")
def binder(tmp_path_factory: pytest.TempPathFactory) -> Binder:
    path = tmp_path_factory.mktemp("literals") / "empty.duckdb"
    duckdb.connect(str(path)).close()
    backend = DuckDBBackend(path)
    return Binder(backend, backend.catalog())


def _outcomes(binder: Binder, type_name: str, texts: list[str]) -> list[str]:
    """Each text converted alone: its spelling, or the refusal."""
    target = exp.DataType.build(type_name, dialect="duckdb")
    found = []
    for text in texts:
        try:
            cast = binder.convert([exp.Cast(this=exp.Literal.string(text), to=target)], "literal")
            found.append(cast[0].sql(dialect="duckdb"))
        except UnsupportedQueryError as error:
            found.append(str(error))
    return found


@settings(max_examples=60, deadline=None)
@given(type_name=st.sampled_from(TYPES), texts=st.lists(TEXTS, min_size=1, max_size=6))
def test_one_row_and_a_values_list_convert_alike(
    binder: Binder, type_name: str, texts: list[str]
) -> None:
    number = "float" if type_name in ("DOUBLE", "FLOAT") else ""
    in_one_row = binder._converted_texts(texts, type_name, number)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(literals, "_ONE_ROW", 0)
        in_values = binder._converted_texts(texts, type_name, number)
        binder._spelled.clear()
        alone_in_values = _outcomes(binder, type_name, texts)
    binder._spelled.clear()
    assert in_one_row == in_values
    assert _outcomes(binder, type_name, texts) == alone_in_values


def test_the_conversion_reads_the_database_once_per_type(binder: Binder) -> None:
    binder._spelled.clear()
    seen: list[str] = []
    original = binder._rows

    def counted(sql: str) -> list[tuple[object, ...]]:
        seen.append(sql)
        return original(sql)

    binder._rows = counted  # type: ignore[method-assign]
    try:
        integer = exp.DataType.build("INTEGER")
        casts = [exp.Cast(this=exp.Literal.string(t), to=integer.copy()) for t in ("1", "2", "3")]
        text = exp.DataType.build("VARCHAR")
        casts.append(exp.Cast(this=exp.Literal.string("a"), to=text))
        assert [c.this.this for c in binder.convert(casts, "literal")] == ["1", "2", "3", "a"]
        assert len(seen) == 2 and "VALUES" not in seen[0]
        binder.convert(casts, "literal")  # converted before: not sent again
        assert len(seen) == 2
    finally:
        del binder._rows
