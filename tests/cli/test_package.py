"""The CLI package's shape: every module imports on its own (no import circle), starting the
command line loads neither the service (FastAPI, uvicorn, the HTTP client) nor dp-accounting,
rich or NumPy, and the console script's process settings (``run``)."""

from __future__ import annotations

import os
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


def test_help_loads_no_service_no_accountant_library_and_no_rich() -> None:
    heavy = ["fastapi", "uvicorn", "starlette", "httpx", "dp_accounting", "jinja2", "rich"]
    code = (
        "import sys; from dpsql.cli import main; main(['--help']); "
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.splitlines()[-1] == "[]"


def test_the_command_line_loads_numpy_only_inside_a_command() -> None:
    """``run`` sets ``OPENBLAS_THREAD_TIMEOUT`` before it calls ``main``: that works only while
    NumPy (and so OpenBLAS) is not loaded yet."""
    code = "import sys, dpsql.cli; print([m for m in ('numpy', 'duckdb') if m in sys.modules])"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.splitlines()[-1] == "[]"


def _after_run(environment: dict[str, str]) -> list[str]:
    """What ``run`` left in its process: exit code, ``OPENBLAS_THREAD_TIMEOUT``, the collector's
    first threshold and whether objects are frozen."""
    code = (
        "import gc, os, sys\n"
        "from dpsql.cli import run\n"
        "sys.argv = ['dpsql', '--version']\n"
        "try:\n"
        "    run()\n"
        "except SystemExit as done:\n"
        "    print(done.code, os.environ.get('OPENBLAS_THREAD_TIMEOUT'), gc.get_threshold()[0],"
        " gc.get_freeze_count() > 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=environment,
    )
    return done.stdout.split()[-4:]


def test_run_sets_its_process_for_one_short_command() -> None:
    environment = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    assert _after_run(environment) == ["0", "4", "200000", "True"]
    # A value the user chose stays.
    assert _after_run({**environment, "OPENBLAS_THREAD_TIMEOUT": "12"})[1] == "12"


def test_python_dash_m_runs_the_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dpsql.cli", "--version"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.startswith("dpsql, version"), done.stderr
