"""The CLI tests' demo database, with its policy set through the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpsql.cli import main
from dpsql.engine.demo import DEMO_POLICY, build_demo


@pytest.fixture
def db(tmp_path: Path) -> str:
    database = build_demo(tmp_path / "d.duckdb", rows=5_000, users=500)
    (tmp_path / "policy.toml").write_text(DEMO_POLICY)
    assert (
        main(["policy", "set", "--db", str(database), "--file", str(tmp_path / "policy.toml")]) == 0
    )
    return str(database)
