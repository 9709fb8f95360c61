"""CLI start: CPU of ``dpsql --help`` and of ``dpsql query`` on a tiny database, against
``python -c pass`` measured in the same run, and what ``dpsql query`` imports
(``-X importtime``: the heaviest top-level packages, and any that the query path should not need).

Targets: ``dpsql --help`` <= 0.15 s CPU, ``dpsql query`` <= 0.5 s CPU.

Every command runs with its bytecode cached (as after ``pip install``, which compiles it): a
private ``PYTHONPYCACHEPREFIX`` and ``PYTHONDONTWRITEBYTECODE`` unset, warmed by one run first.
Without a cache (``PYTHONDONTWRITEBYTECODE=1`` and an editable install, as on the development
machine) each run compiles dpsql's modules again, which alone cost about 0.3 s. CPU is the
children's ``getrusage`` (microseconds; ``os.times`` counts 10 ms ticks).

The ``third-party floor`` imports what a query cannot do without (numpy, randomgen, sqlglot with
its DuckDB dialect, duckdb, pydantic with ``BaseModel``, click, rich) and nothing of dpsql, in a
process set up as ``dpsql.cli.run`` sets up its own (OpenBLAS threads that sleep at once, the
garbage collector's threshold, objects frozen at exit); once more without rich, which only the
table printer needs. ``dpsql query via main()`` is the same query without ``run``'s settings:
what they save.

    python benchmarks/bench_cli_start.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb

UNNEEDED = (
    "fastapi",
    "starlette",
    "uvicorn",
    "dp_accounting",
    "jinja2",
    "matplotlib",
    "scipy",
    "pandas",
    "pyarrow",
)
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
    "import gc; gc.set_threshold(200_000); "
    "import numpy, randomgen, duckdb, click, sqlglot{rich}; from pydantic import BaseModel; "
    "sqlglot.parse_one('SELECT 1', read='duckdb'); gc.freeze()"
)
"""The third-party work a query cannot avoid (the DuckDB dialect loads on first use, pydantic's
models on the first import of ``BaseModel``), in a process set up as ``dpsql.cli.run`` does."""


def environment(cache: str) -> dict[str, str]:
    """This environment with bytecode written to and read from ``cache``."""
    changed = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**changed, "PYTHONPYCACHEPREFIX": cache}


def cpu_seconds(command: list[str], env: dict[str, str]) -> float:
    """User + system CPU of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def imported(command: list[str], env: dict[str, str], runs: int) -> dict[str, float]:
    """Import seconds (its modules' own time, summed; wall time, the median of ``runs``) of each
    package ``command`` imports."""
    measured: list[dict[str, float]] = []
    for _ in range(runs):
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
        measured.append(packages)
    names = set().union(*measured)
    return {n: statistics.median(p.get(n, 0.0) for p in measured) for n in names}


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
        by_main = f"import sys; from dpsql.cli import main; sys.exit(main({query[3:]!r}))"
        env = environment(str(Path(directory) / "pycache"))
        like_run = {**env, "OPENBLAS_THREAD_TIMEOUT": "4"}  # as dpsql.cli.run sets it
        floor = FLOOR.format(rich=", rich.console, rich.table")
        commands = {
            "python -c pass": ([sys.executable, "-c", "pass"], env),
            "third-party floor": ([sys.executable, "-c", floor], like_run),
            "  without rich": ([sys.executable, "-c", FLOOR.format(rich="")], like_run),
            "dpsql --help": ([*dpsql_cli, "--help"], env),
            "dpsql query (tiny db)": (query, env),
            "  via main()": ([sys.executable, "-c", by_main], env),
        }
        for command, command_env in commands.values():  # writes the bytecode cache
            cpu_seconds(command, command_env)
        times = {
            label: statistics.median(cpu_seconds(*run) for _ in range(args.runs))
            for label, run in commands.items()
        }
        packages = imported(query, env, runs=3)
    base = times["python -c pass"]
    print(
        f"median CPU of {args.runs} runs, bytecode cached; load average "
        f"{os.getloadavg()[0]:.2f}"
    )
    for label, seconds in times.items():
        print(f"  {label:24s} {seconds:6.3f} s   ({seconds / base:5.1f}x python -c pass)")
    for label, target in (("dpsql --help", 0.15), ("dpsql query (tiny db)", 0.5)):
        verdict = "met" if times[label] <= target else "NOT met"
        print(f"target {label} <= {target} s: {verdict}")
    print("dpsql query imports (s, each package's own modules, median of 3, top 10):")
    for name, seconds in sorted(packages.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {name:24s} {seconds:6.3f}")
    unneeded = sorted(set(packages) & set(UNNEEDED))
    print(f"imported but not needed by a query: {', '.join(unneeded) or 'none'}")


if __name__ == "__main__":
    main()
