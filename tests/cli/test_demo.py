"""``dpsql demo`` through ``python -m dpsql.cli``, as a console script runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_console_script_runs_the_demo(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dpsql.cli", "demo", "--dir", str(tmp_path), "--rows", "5000"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Requests per country" in done.stdout and "Privacy budget" in done.stdout
    assert "refused: MAX(bytes) is not released" in done.stdout
    assert "synopsis:requests_url_" in done.stdout
    missing = subprocess.run(
        [
            sys.executable,
            "-m",
            "dpsql.cli",
            "query",
            "--db",
            str(tmp_path / "no.duckdb"),
            "--analyst",
            "a",
            "SELECT 1",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    assert "Traceback" not in missing.stderr
