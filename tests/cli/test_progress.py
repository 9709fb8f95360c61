"""The CLI's progress bar: stdout unchanged, nothing on a non-terminal stderr, one-line errors."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from rich.console import Console

import dpsql.engine.session
from dpsql.cli import cli, main
from dpsql.cli.progress import ProgressDisplay
from dpsql.engine.demo import DEMO_POLICY, build_demo
from dpsql.engine.session import connect, set_policy
from dpsql.mechanisms.random import _seeded_for_tests

SQL = "SELECT country, COUNT(*) AS n, AVG(latency_ms) AS l FROM requests GROUP BY country"


def _database(directory: Path) -> str:
    database = build_demo(directory / "d.duckdb", rows=5_000, users=500)
    set_policy(database, DEMO_POLICY)
    return str(database)


@pytest.fixture
def seeded(monkeypatch) -> None:
    """Every CLI session draws its noise from the same seed, so two runs print the same."""

    def seeded_connect(*args: Any, **kwargs: Any):
        with _seeded_for_tests(np.random.default_rng(7)):
            return connect(*args, **kwargs)

    monkeypatch.setattr(dpsql.engine.session, "connect", seeded_connect)  # the CLI's, at run time


@pytest.mark.parametrize("output_format", ["table", "csv", "json"])
def test_progress_leaves_stdout_unchanged(tmp_path: Path, seeded, output_format: str) -> None:
    runner = CliRunner()
    outputs = {}
    for flag in ("--progress", "--no-progress", None):
        database = _database(tmp_path / str(flag))
        args = ["query", "--db", database, "--analyst", "alice", "--epsilon", "0.5"]
        args += [flag] if flag is not None else []
        args += ["--format", output_format, SQL]
        result = runner.invoke(cli, args)
        assert result.exit_code == 0, result.output
        outputs[flag] = result.stdout
        assert result.stderr == ""  # not a terminal: no bar, even when asked for
    assert outputs["--progress"] == outputs["--no-progress"] == outputs[None]
    assert "DK" in outputs[None]


def test_errors_still_print_one_line(tmp_path: Path, capsys) -> None:
    database = _database(tmp_path)
    bad = "SELECT country, MAX(bytes) FROM requests GROUP BY country"
    assert main(["query", "--db", database, "--analyst", "alice", "--progress", bad]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.splitlines()) == 1 and captured.err.startswith("dpsql: error:")


def _terminal() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=True, width=100), buffer


def test_the_bar_appears_only_after_the_delay() -> None:
    console, buffer = _terminal()
    with ProgressDisplay(delay=0.5, console=console) as display:
        display("reading data", None)
        display("reading data", 0.5)
        display("done", 1.0)
    assert buffer.getvalue() == ""  # a fast query prints nothing

    console, buffer = _terminal()
    with ProgressDisplay(delay=0.0, console=console) as display:
        display("reading data", None)
        display("reading data", 0.25)
        waited = 0.0
        while "25%" not in buffer.getvalue() and waited < 2.0:  # the display thread draws it
            time.sleep(0.02)
            waited += 0.02
    shown = buffer.getvalue()
    assert "reading data" in shown and "25%" in shown
    assert shown.rstrip().endswith("\x1b[2K")  # transient: the last thing drawn erases the bar
