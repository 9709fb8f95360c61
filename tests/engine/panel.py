"""A person-level panel (persons x 8 years) with a policy whose contribution
bounds cut nothing, so DuckDB's plain answer is the quantity dpsql's intervals cover."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from tests.conftest import make_database

YEARS = list(range(1980, 1988))

POLICY = """
[dataset]
epsilon = 1e12
delta = 1e-3
[analysts.a]
epsilon = 1e12
delta = 1e-3
[tables.males]
privacy_unit = "nr"
max_groups_per_unit = 8
max_rows_per_group = 8
max_rows_per_unit = 8
[tables.males.columns.year]
public_keys = [1980, 1981, 1982, 1983, 1984, 1985, 1986, 1987]
[tables.males.columns.ethn]
public_keys = ["black", "hisp", "other"]
[tables.males.columns.union]
public_keys = ["no", "yes"]
[tables.males.columns.hours]
bounds = [0, 4000]
[tables.males.columns.wage]
bounds = [0, 40]
[tables.males.columns.school]
bounds = [0, 20]
"""


def panel_frame(persons: int = 300, seed: int = 7) -> pd.DataFrame:
    """``persons`` x 8 years: ethnicity fixed per person, the rest drawn per year."""
    rng = np.random.default_rng(seed)
    nr = np.repeat(np.arange(persons), len(YEARS))
    ethn = np.repeat(rng.choice(["black", "hisp", "other"], persons, p=[0.2, 0.3, 0.5]), 8)
    size = len(nr)
    return pd.DataFrame(
        {
            "nr": nr,
            "year": np.tile(YEARS, persons).astype(np.int32),
            "ethn": ethn,
            "union": rng.choice(["no", "yes"], size, p=[0.7, 0.3]),
            "hours": rng.integers(0, 4000, size).astype(np.int32),
            "wage": np.round(rng.uniform(0, 40, size), 2),
            "school": rng.integers(3, 17, size).astype(np.int32),
            "industry": rng.choice(["Manufacturing", "Trade", "Finance", "manual"], size),
        }
    )


def build_panel(directory: Path, persons: int = 300) -> Path:
    return make_database(directory / "panel.duckdb", {"males": panel_frame(persons)}, POLICY)


def truth(database: Path, sql: str) -> list[tuple]:
    """DuckDB's own answer to ``sql`` on the raw data (the test's oracle, never dpsql's path)."""
    connection = duckdb.connect(str(database), read_only=True)
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()
