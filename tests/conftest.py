"""Shared fixtures: small generated databases with policies, and seeded generators."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

import dpsql
from dpsql.engine.demo import DEMO_POLICY, build_demo
from dpsql.engine.results import QueryResult
from dpsql.engine.session import set_policy


@pytest.fixture(scope="session", autouse=True)
def every_dpsql_module_imported() -> None:
    """Import every dpsql module before any test patches one of its functions.

    Broken twins (and other tests) replace a function by its module attribute. A module first
    imported while a replacement is in place (dpsql imports heavy modules lazily) would bind the
    replacement by name and keep it after the test: a twin hidden from its test, or later tests
    run against a broken function, depending on the order the suite runs in.
    """
    for module in pkgutil.walk_packages(dpsql.__path__, "dpsql."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261121)


@pytest.fixture
def demo_db(tmp_path: Path) -> Path:
    """The demo database (20k rows) with the demo policy set."""
    database = build_demo(tmp_path / "demo.duckdb", rows=20_000, users=2_000)
    set_policy(database, DEMO_POLICY)
    return database


def make_database(path: Path, tables: dict[str, pd.DataFrame], policy: str) -> Path:
    """A DuckDB file holding ``tables``, with ``policy`` set."""
    connection = duckdb.connect(str(path))
    try:
        for name, frame in tables.items():
            connection.register("frame", frame)
            connection.execute(f'CREATE TABLE "{name}" AS SELECT * FROM frame')
            connection.unregister("frame")
    finally:
        connection.close()
    set_policy(path, policy)
    return path


def seeded(function, *args, rng: np.random.Generator, **kwargs):
    """Call ``function`` (``dpsql.connect``, ``dpsql.Session``, ``publish_rr``...) with sessions
    drawing from ``rng``, through the internal test hook (analysts cannot choose the generator)."""
    from dpsql.mechanisms.random import _seeded_for_tests

    with _seeded_for_tests(rng):
        return function(*args, **kwargs)


def seeded_connect(*args, rng: np.random.Generator, **kwargs) -> dpsql.Session:
    return seeded(dpsql.connect, *args, rng=rng, **kwargs)


def released_answer(
    columns: list[str], rows: list[tuple], intervals: dict[str, list[tuple]], **fields
) -> QueryResult:
    """A released answer as a mechanism would return it, for tests of what follows (the other
    fields: a 95% answer of ledger entry 1, unless ``fields`` say otherwise)."""
    defaults = {
        "noise_scale": {},
        "confidence": 0.95,
        "epsilon": 1.0,
        "delta": 0.0,
        "mechanism": "discrete_laplace",
        "analyst": "a",
        "ledger_entry": 1,
    }
    return QueryResult(
        columns=columns, rows=rows, intervals=intervals, **{**defaults, **fields}
    )
