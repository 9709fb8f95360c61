"""GROUP BY expressions with public domains (``dpsql.sql.expressions``): privacy on neighbours.

The groups a query answers come from the policy (bins of a column's declared bounds; TRUE and
FALSE for a condition), never from the data: on neighbouring tables (with and without one person
whose values lie outside every bound, or are NaN/NULL) the released keys are the same, and the
bounded counts move by at most that person's contribution bound. The broken twin, a domain read
from the data (``SELECT DISTINCT``), releases a key only the added person has.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import make_database, seeded_connect
from tests.engine.panel import POLICY, YEARS, panel_frame, truth

QUERIES = [
    "SELECT FLOOR(hours / 500) * 500 AS band, COUNT(*) AS n FROM males GROUP BY band",
    "SELECT school >= 13 AS college, COUNT(*) AS n FROM males GROUP BY 1",
    "SELECT FLOOR(wage / 10) * 10 AS w, hours > 2000 AS long, COUNT(*) AS n "
    "FROM males GROUP BY ALL",
]
TWIN = "SELECT DISTINCT FLOOR(hours / 500) * 500 FROM males"


def _outlier(person: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "nr": person,
            "year": np.array(YEARS, dtype=np.int32),
            "ethn": "other",
            "union": "yes",
            "hours": np.array([10**6, -5, 10**6, 3999, 10**6, -5, 10**6, 0], dtype=np.int32),
            "wage": [np.nan, 1e300, -1.0, 40.0, np.inf, 0.0, 39.99, np.nan],
            "school": np.array([99, -1, 13, 12, 99, 0, 20, 13], dtype=np.int32),
            "industry": "Trade",
        }
    )


@pytest.fixture(scope="module")
def neighbours(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("neighbours")
    frame = panel_frame(persons=120, seed=5)
    with_person = pd.concat([frame, _outlier(10_000)], ignore_index=True)
    return (
        make_database(directory / "without.duckdb", {"males": frame}, POLICY),
        make_database(directory / "with.duckdb", {"males": with_person}, POLICY),
    )


@pytest.mark.parametrize("sql", QUERIES)
def test_released_groups_come_from_the_policy_and_counts_move_by_one_persons_bound(
    sql: str, neighbours: tuple[Path, Path]
) -> None:
    answers = []
    for database in neighbours:
        with seeded_connect(database, analyst="a", rng=np.random.default_rng(9)) as session:
            answers.append(session.execute(sql, epsilon=1e6))
    keys = [[row[:-1] for row in answer.rows] for answer in answers]
    assert keys[0] == keys[1]
    counts = [np.array([row[-1] for row in answer.rows], dtype=float) for answer in answers]
    moved = np.abs(counts[1] - counts[0]).sum()
    assert 0 < moved <= 8  # max_rows_per_unit of the panel's policy


def test_the_bins_cover_the_whole_declared_range(neighbours: tuple[Path, Path]) -> None:
    with seeded_connect(neighbours[0], analyst="a", rng=np.random.default_rng(1)) as session:
        result = session.execute(QUERIES[0], epsilon=1.0)
    assert [row[0] for row in result.rows] == list(range(0, 4001, 500))


def test_the_broken_twin_domain_read_from_the_data_reveals_the_person(
    neighbours: tuple[Path, Path],
) -> None:
    without, with_person = (sorted(v for (v,) in truth(db, TWIN)) for db in neighbours)
    assert without != with_person
    assert set(with_person) - set(without) == {-500.0, 1_000_000.0}


NEGATIVE_ZERO_POLICY = """
[dataset]
epsilon = 1e9
delta = 1e-6
[analysts.a]
epsilon = 1e9
[tables.z]
privacy_unit = "u"
[tables.z.columns.p]
public_keys = [0.0, 1.5]
"""


@pytest.mark.parametrize("type_name", ["DOUBLE", "FLOAT"])
def test_a_float_group_at_minus_zero_is_released_under_its_declared_key(
    tmp_path: Path, type_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """-0.0 and 0.0 are one group in DuckDB, which prints it as whichever row came first: one
    person's -0.0 must not move the group away from the declared key 0.0 (where it would count
    zero). The broken twin reads the column as stored and loses the group."""
    from dpsql.sql import generate

    frame = pd.DataFrame({"u": np.arange(40), "p": [-0.0] * 30 + [1.5] * 10})
    frame["p"] = frame["p"].astype("float32" if type_name == "FLOAT" else "float64")
    database = make_database(tmp_path / "z.duckdb", {"z": frame}, NEGATIVE_ZERO_POLICY)
    sql = "SELECT p, COUNT(*) AS n FROM z GROUP BY p"

    def counts() -> dict[float, float]:
        with seeded_connect(database, analyst="a", rng=np.random.default_rng(2)) as session:
            return {row[0]: row[1] for row in session.execute(sql, epsilon=1e6).rows}

    assert counts() == pytest.approx({0.0: 30, 1.5: 10}, abs=0.5)
    monkeypatch.setattr(generate, "_group_value", lambda shape, column: f'"{column}"')
    assert counts()[0.0] == pytest.approx(0, abs=0.5)


def test_public_keys_equal_in_the_database_are_refused(tmp_path: Path) -> None:
    from dpsql.errors import PolicyError

    frame = pd.DataFrame({"u": np.arange(4), "p": [0.0, 1.5, 0.0, 1.5]})
    policy = NEGATIVE_ZERO_POLICY.replace("[0.0, 1.5]", "[0.0, -0.0, 1.5]")
    with pytest.raises(PolicyError, match="must be distinct"):
        make_database(tmp_path / "z.duckdb", {"z": frame}, policy)


ENUM_POLICY = """
[dataset]
epsilon = 1e9
[analysts.a]
epsilon = 1e9
[tables.e]
privacy_unit = "u"
"""


@pytest.fixture
def moods(tmp_path: Path) -> Path:
    path = tmp_path / "e.duckdb"
    import duckdb

    connection = duckdb.connect(str(path))
    connection.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy', 'unused')")
    connection.execute(
        "CREATE TABLE e AS SELECT i AS u, CASE WHEN i % 10 = 0 THEN NULL "
        "ELSE (['sad', 'ok', 'happy'])[1 + i % 3] END::mood AS m FROM range(600) AS r(i)"
    )
    connection.close()
    from dpsql.engine.session import set_policy

    set_policy(path, ENUM_POLICY)
    return path


def test_an_enum_column_groups_over_its_values_in_the_enums_order(moods: Path) -> None:
    """The ENUM's values are public schema: they are the key domain (an unused value is a
    released group), in the type's order, without declared public keys or thresholds."""
    with seeded_connect(moods, analyst="a", rng=np.random.default_rng(3)) as session:
        result = session.execute("SELECT m, COUNT(*) AS n FROM e GROUP BY m", epsilon=1e6)
        assert session.plan("SELECT m, COUNT(*) FROM e GROUP BY m", epsilon=1).mechanism == (
            "discrete_laplace"
        )
    assert [row[0] for row in result.rows] == ["sad", "ok", "happy", "unused"]
    assert [row[1] for row in result.rows] == pytest.approx([180, 180, 180, 0], abs=0.5)


def test_an_enum_literal_is_typed_and_a_value_outside_the_enum_is_refused(moods: Path) -> None:
    from dpsql.errors import UnsupportedQueryError

    with seeded_connect(moods, analyst="a", rng=np.random.default_rng(4)) as session:
        (row,) = session.execute(
            "SELECT COUNT(*) AS n FROM e WHERE m > 'ok' OR m IN ('sad')", epsilon=1e6
        ).rows
        # Typed as the ENUM, '>' compares positions in the type: 'happy' and 'unused'.
        assert row[0] == pytest.approx(360, abs=0.5)
        spent = session.budget().for_analyst("a").epsilon_spent
        with pytest.raises(UnsupportedQueryError, match=r"'angry' is not exactly a value of type"):
            session.execute("SELECT COUNT(*) AS n FROM e WHERE m = 'angry'", epsilon=1)
        assert session.budget().for_analyst("a").epsilon_spent == spent


def test_declared_public_keys_of_an_enum_must_be_its_values(moods: Path) -> None:
    from dpsql.engine.session import set_policy
    from dpsql.errors import PolicyError

    with pytest.raises(PolicyError, match="'angry' is not exactly a value of type ENUM"):
        set_policy(moods, ENUM_POLICY + '[tables.e.columns.m]\npublic_keys = ["ok", "angry"]\n')
    set_policy(moods, ENUM_POLICY + '[tables.e.columns.m]\npublic_keys = ["ok", "happy"]\n')
    with seeded_connect(moods, analyst="a", rng=np.random.default_rng(5)) as session:
        result = session.execute("SELECT m, COUNT(*) AS n FROM e GROUP BY m", epsilon=1e6)
    assert [row[0] for row in result.rows] == ["ok", "happy"]
