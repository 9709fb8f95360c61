"""CLI start: CPU of ``dpsql --help`` and of ``dpsql query`` on a tiny database, against
``python -c pass`` measured in the same run, and what ``dpsql query`` imports
(``-X importtime``: the heaviest top-level packages, and any that the query path should not need).

Targets: ``dpsql --help`` <= 0.15 s CPU, ``dpsql query`` <= 0.5 s CPU.

Every command runs with its bytecode cached (as after ``pip install``, which compiles it): a
private ``PYTHONPYCACHEPREFIX`` and ``PYTHONDONTWRITEBYTECODE`` unset, warmed by one run first.
Without a cache (``PYTHONDONTWRITEBYTECODE=1`` and an editable install, as on the development
machine) each run compiles dpsql's modules again, which alone cost about 0.3 s. The
``third-party floor`` line imports what a query cannot do without (numpy, randomgen, sqlglot with
its DuckDB dialect, duckdb, pydantic, click, rich) and nothing of dpsql.

    python benchmarks/bench_cli_start.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb

UNNEEDED = ("fastapi", "starlette", "uvicorn", "dp_accounting", "jinja2", "matplotlib", "scipy")
"""Packages the query path has no use for."""

POLICY = """
[dataset]
epsilon = 1000.0
[analysts.a]
epsilon = 1000.0
[tables.t]
privacy_unit = "uid"
max_rows_per_unit = 1
"""


FLOOR = (
    "import numpy, randomgen, duckdb, pydantic, click, rich.console, rich.table, sqlglot; "
    "sqlglot.parse_one('SELECT 1', read='duckdb')"
)
"""The third-party work a query cannot avoid (the DuckDB dialect loads on first use)."""


def environment(cache: str) -> dict[str, str]:
    """This environment with bytecode written to and read from ``cache``."""
    changed = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**changed, "PYTHONPYCACHEPREFIX": cache}


def cpu_seconds(command: list[str], env: dict[str, str]) -> float:
    """User + system CPU of one child process."""
    before = os.times()
    subprocess.run(
        command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    after = os.times()
    return (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )


def imported(command: list[str], env: dict[str, str]) -> dict[str, float]:
    """Import seconds (its modules' own time, summed) of each package ``command`` imports."""
    found = subprocess.run(
        [sys.executable, "-X", "importtime", *command[1:]],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stderr
    packages: dict[str, float] = {}
    for line in found.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+\d+ \| *(\S+)", line)
        if match:
            name = match.group(2).split(".")[0]
            packages[name] = packages.get(name, 0.0) + int(match.group(1)) / 1e6
    return packages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    dpsql_cli = [sys.executable, "-m", "dpsql.cli"]  # the `dpsql` command
    with tempfile.TemporaryDirectory() as directory:
        database = Path(directory) / "tiny.duckdb"
        connection = duckdb.connect(str(database))
        connection.execute("CREATE TABLE t AS SELECT range AS uid FROM range(100)")
        connection.close()
        policy = Path(directory) / "policy.toml"
        policy.write_text(POLICY)
        subprocess.run(
            [*dpsql_cli, "policy", "set", "--db", str(database), "--file", str(policy)],
            check=True,
            capture_output=True,
        )
        query = [
            *dpsql_cli,
            "query",
            "--db",
            str(database),
            "--analyst",
            "a",
            "--epsilon",
            "1",
            "SELECT COUNT(*) FROM t",
        ]
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "third-party floor": [sys.executable, "-c", FLOOR],
            "dpsql --help": [*dpsql_cli, "--help"],
            "dpsql query (tiny db)": query,
        }
        env = environment(str(Path(directory) / "pycache"))
        for command in commands.values():  # writes the bytecode cache
            cpu_seconds(command, env)
        times = {
            label: statistics.median(cpu_seconds(command, env) for _ in range(args.runs))
            for label, command in commands.items()
        }
        packages = imported(query, env)
    base = times["python -c pass"]
    print(
        f"median CPU of {args.runs} runs, bytecode cached; load average "
        f"{os.getloadavg()[0]:.2f}"
    )
    for label, seconds in times.items():
        print(f"  {label:24s} {seconds:6.3f} s   ({seconds / base:5.1f}x python -c pass)")
    print("dpsql query imports (s, each package's own modules, top 10):")
    for name, seconds in sorted(packages.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {name:24s} {seconds:6.3f}")
    unneeded = sorted(set(packages) & set(UNNEEDED))
    print(f"imported but not needed by a query: {', '.join(unneeded) or 'none'}")


if __name__ == "__main__":
    main()
