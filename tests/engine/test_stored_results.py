"""The result store: an answer kept under its ledger entry comes back whole, to its analyst only."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dpsql.accountant.ledger import Ledger
from dpsql.engine.results import QueryResult
from dpsql.engine.stored_results import ResultStore
from dpsql.errors import ParameterError


def _result(seq: int, analyst: str = "alice") -> QueryResult:
    return QueryResult(
        columns=["country", "n", "mean"],
        rows=[("fr", 12, float("nan")), ("é ✓", -3, 2.5), (None, 0, float("inf"))],
        intervals={"n": [(1.0, 2.0), (-9.0, 3.0), (0.0, 5.0)], "mean": [(float("-inf"), 1.0)] * 3},
        noise_scale={"n": 1.5, "mean": float("nan")},
        confidence=0.95,
        epsilon=0.1,
        delta=1e-9,
        mechanism="discrete_laplace",
        analyst=analyst,
        ledger_entry=seq,
        details={"warnings": ["w"], "nested": {"x": [1, 2.0, None]}},
        measures={"n": "rows"},
    )


def _same(a: object, b: object) -> bool:
    """Equal, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b and type(a) is type(b)


@pytest.fixture
def store(tmp_path: Path) -> ResultStore:
    path = tmp_path / "data.duckdb.dpsql.sqlite"
    Ledger(path, dataset="data").close()  # the entries table the ownership check reads
    opened = ResultStore(path)
    yield opened
    opened.close()


def test_an_answer_comes_back_whole_nan_and_infinities_included(store: ResultStore) -> None:
    kept = _result(7)
    store.save(kept)
    store.save_report(8, {"first": _result(8), "second": kept})
    assert _same(store.get(7).model_dump(), kept.model_dump())
    assert _same(store.get(8, query="second").model_dump(), kept.model_dump())
    assert store.report_queries(8) == ["first", "second"]


def test_a_missing_answer_is_named(store: ResultStore) -> None:
    with pytest.raises(ParameterError, match="ledger entry 3 has no stored answer"):
        store.get(3)
    with pytest.raises(ParameterError, match="positive integer"):
        store.get(0)
