"""The CLI package's shape: every module imports on its own (no import circle), and starting the
command line loads neither the service (FastAPI, uvicorn, the HTTP client) nor dp-accounting."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import dpsql.cli

MODULES = sorted(f"dpsql.cli.{m.name}" for m in pkgutil.iter_modules(dpsql.cli.__path__))


def test_the_package_has_its_command_modules() -> None:
    assert {"dpsql.cli.root", "dpsql.cli.output", "dpsql.cli.query", "dpsql.cli.serve"} <= set(
        MODULES
    )


@pytest.mark.parametrize("module", [m for m in MODULES if not m.endswith("__main__")])
def test_every_module_imports_first_in_a_fresh_interpreter(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}; import dpsql.cli; dpsql.cli.main(['--help'])"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "Usage: dpsql" in done.stdout


def test_help_loads_no_service_and_no_accountant_library() -> None:
    heavy = ["fastapi", "uvicorn", "starlette", "httpx", "dp_accounting", "jinja2"]
    code = (
        "import sys; from dpsql.cli import main; main(['--help']); "
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.splitlines()[-1] == "[]"


def test_python_dash_m_runs_the_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dpsql.cli", "--version"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.startswith("dpsql, version"), done.stderr
