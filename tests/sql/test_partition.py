from __future__ import annotations

import pytest

from dpsql.sql.analyze import analyze
from dpsql.sql.parse import parse
from dpsql.sql.partition import partition_region

CATALOG = {"t": {"u": "BIGINT", "c": "VARCHAR", "n": "INTEGER", "d": "DATE"}}


def region(where: str, column: str = "c") -> str | None:
    shape = analyze(parse(f"SELECT COUNT(*) FROM t WHERE {where}"), CATALOG)
    found = partition_region(shape.where, column)
    return None if found is None else found.describe(column)


@pytest.mark.parametrize(
    ("where", "column", "expected"),
    [
        ("c = 'DK'", "c", "c = 'DK'"),
        ("'DK' = c", "c", "c = 'DK'"),
        ("c IN ('DK', 'NO') AND n > 3", "c", "c = 'DK' OR c = 'NO'"),
        ("(c = 'DK' OR c = 'NO') AND n > 3", "c", "c = 'DK' OR c = 'NO'"),
        ("n BETWEEN 10 AND 20 AND n < 15", "n", "n >= 10 AND n < 15"),
        ("n >= -5", "n", "n >= -5"),
        ("d < '2026-01-01'", "d", "d < '2026-01-01'"),
        ("c = 'DK' OR n > 3", "c", None),  # OR with another column: unknown
        ("NOT c = 'DK'", "c", None),
        ("c <> 'DK'", "c", None),
        ("c IS NULL", "c", None),
        ("n > 3", "c", None),  # does not restrict the partition column
        ("c = 'DK' AND c = 'NO'", "c", None),  # empty: charged sequentially, to be safe
    ],
)
def test_partition_regions(where: str, column: str, expected: str | None) -> None:
    assert region(where, column) == expected
