"""``COUNT(DISTINCT unit)``: persons, each counted in at most ``max_groups_per_unit`` groups.

On neighbouring tables (with and without one person who has a row in every year), the exact
person counts dpsql releases (at a very high epsilon, where the discrete noise is zero) move by
at most ``max_groups_per_unit`` in all, the sensitivity the planner charges for. The broken twin,
DuckDB's plain ``COUNT(DISTINCT nr)`` per group, moves by the number of years the person spans.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import make_database, seeded_connect
from tests.engine.panel import POLICY, panel_frame, truth

CAPPED = POLICY.replace("max_groups_per_unit = 8", "max_groups_per_unit = 2")
SQL = "SELECT year, COUNT(DISTINCT nr) AS persons FROM males GROUP BY year ORDER BY year"


@pytest.fixture(scope="module")
def neighbours(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("persons")
    frame = panel_frame(persons=80, seed=2)
    extra = frame[frame["nr"] == 0].assign(nr=10_000)
    with_person = pd.concat([frame, extra], ignore_index=True)
    return (
        make_database(directory / "without.duckdb", {"males": frame}, CAPPED),
        make_database(directory / "with.duckdb", {"males": with_person}, CAPPED),
    )


def _released(database: Path) -> np.ndarray:
    with seeded_connect(database, analyst="a", rng=np.random.default_rng(4)) as session:
        result = session.execute(SQL, epsilon=1e6)
        plan = session.explain(SQL, epsilon=1.0)["plan"]
    (measurement,) = plan["measurements"]
    assert measurement["l1_sensitivity"] == 2
    return np.array([row[1] for row in result.rows], dtype=float)


def test_persons_move_by_at_most_the_group_bound(neighbours: tuple[Path, Path]) -> None:
    without, with_person = (_released(db) for db in neighbours)
    moved = np.abs(with_person - without).sum()
    assert 1 <= moved <= 2


def test_the_broken_twin_moves_by_every_year_the_person_spans(
    neighbours: tuple[Path, Path],
) -> None:
    without, with_person = (
        np.array([n for _, n in truth(db, SQL)], dtype=float) for db in neighbours
    )
    assert np.abs(with_person - without).sum() == 8 > 2
