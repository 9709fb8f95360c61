"""How dpsql is installed: the demo needs only the runtime dependencies."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _dry_run(target: str, venv: Path) -> str:
    """What ``make <target>`` would run for a fresh virtual environment at ``venv``."""
    return subprocess.run(
        ["make", "-n", "-C", str(ROOT), target, f"VENV={venv}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_demo_installs_no_test_extras_and_make_test_does(tmp_path: Path) -> None:
    demo = _dry_run("demo", tmp_path / "venv")
    assert "pip install --quiet -e ." in demo, demo
    assert "[test]" not in demo and "dpsql demo" in demo, demo
    test = _dry_run("test", tmp_path / "venv")
    assert "pip install --quiet -e '.[test]'" in test and "pytest" in test, test


def test_the_console_script_is_the_cli_packages_run() -> None:
    from importlib.metadata import entry_points

    import dpsql.cli

    (script,) = entry_points(group="console_scripts", name="dpsql")
    assert script.value == "dpsql.cli:run"
    assert script.load() is dpsql.cli.run
