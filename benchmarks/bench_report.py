"""A 12-query monthly report on the demo database: plan time, run time against the same 12
queries run one by one, and the largest relative error under each allocation rule at the same
total epsilon.

    python benchmarks/bench_report.py [--rows 200000] [--epsilon 1.0] [--repeats 3]

Relative error is the 95% interval half-width the plan promises (known before any data is read)
over the spec's public ``expected`` value of each query; the rules are compared on the same
total. Times are medians over ``--repeats`` runs on a fresh copy of the ledger each time.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from dpsql.engine.accuracy import plan_error
from dpsql.engine.demo import DEMO_POLICY, build_demo
from dpsql.engine.report import plan_report, run_report
from dpsql.engine.report_html import write_report
from dpsql.engine.report_spec import parse_report_spec
from dpsql.engine.session import Session, ledger_path, set_policy

QUERIES = {
    "by_country": ("SELECT country, COUNT(*) AS n FROM requests GROUP BY country", 5_000),
    "by_status": ("SELECT status, COUNT(*) AS n FROM requests GROUP BY status", 5_000),
    "country_status": (
        "SELECT country, status, COUNT(*) AS n FROM requests GROUP BY country, status",
        1_000,
    ),
    "bytes_by_country": (
        "SELECT country, SUM(bytes) AS bytes FROM requests GROUP BY country",
        200_000_000,
    ),
    "all_bytes": ("SELECT SUM(bytes) AS bytes FROM requests", 1_000_000_000),
    "all_requests": ("SELECT COUNT(*) AS n FROM requests", 200_000),
    "age_30_50": ("SELECT COUNT(*) AS n FROM requests WHERE age BETWEEN 30 AND 50", 60_000),
    "mobile_by_country": (
        "SELECT country, COUNT(*) AS n FROM requests WHERE device = 'mobile' GROUP BY country",
        4_000,
    ),
    "desktop_by_country": (
        "SELECT country, COUNT(*) AS n FROM requests WHERE device = 'desktop' GROUP BY country",
        3_000,
    ),
    "errors_by_country": (
        "SELECT country, COUNT(*) AS n FROM requests WHERE status = 500 GROUP BY country",
        500,
    ),
    "mobile_bytes": (
        "SELECT country, SUM(bytes) AS bytes FROM requests WHERE device = 'mobile' "
        "GROUP BY country",
        100_000_000,
    ),
    "home_hits": ("SELECT COUNT(*) AS n FROM requests WHERE url = '/home'", 30_000),
}

POLICY = DEMO_POLICY.replace("epsilon = 10.0", "epsilon = 100000.0").replace(
    "[analysts.bob]\nepsilon = 2.0", "[analysts.bob]\nepsilon = 100000.0"
)


def spec_text(epsilon: float, rule: str, targets: dict[str, float] | None = None) -> str:
    lines = [f'title = "Monthly traffic ({rule})"', f'allocation = "{rule}"']
    if rule != "accuracy":
        lines.append(f"epsilon = {epsilon!r}")
    for name, (sql, expected) in QUERIES.items():
        lines += [f"[queries.{name}]", f'sql = "{sql}"', f"expected = {expected}"]
        if targets is not None:
            lines.append(f"accuracy = {targets[name]!r}")
    return "\n".join(lines) + "\n"


def largest_relative_error(plan) -> float:
    return max(plan_error(q.plan, None) / q.spec.expected for q in plan.queries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-report-"))
    try:
        database = build_demo(work / "demo.duckdb", rows=args.rows, users=args.rows // 10)
        set_policy(database, POLICY)
        pristine = work / "ledger.pristine"
        shutil.copy(ledger_path(database), pristine)

        def fresh_session() -> Session:
            shutil.copy(pristine, ledger_path(database))
            return Session(database, analyst="bob")

        weights = parse_report_spec(spec_text(args.epsilon, "weights"))
        minimax = parse_report_spec(spec_text(args.epsilon, "minimax"))
        plans, plan_times = {}, {}
        with fresh_session() as session:
            for rule, spec in (("weights", weights), ("minimax", minimax), ("accuracy", None)):
                if spec is None:  # targets: minimax's largest relative error x expected
                    best = largest_relative_error(plans["minimax"])
                    targets = {name: best * expected for name, (_, expected) in QUERIES.items()}
                    spec = parse_report_spec(spec_text(args.epsilon, "accuracy", targets))
                samples = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    plans[rule] = plan_report(session, spec)
                    samples.append(time.perf_counter() - start)
                plan_times[rule] = statistics.median(samples)

        run_times, render_times, one_by_one = [], [], []

        def timed_render(*parts) -> None:
            start = time.perf_counter()
            write_report(*parts)
            render_times.append(time.perf_counter() - start)

        for repeat in range(args.repeats):
            with fresh_session() as session:
                start = time.perf_counter()
                run_report(session, weights, work / f"out{repeat}", render=timed_render)
                run_times.append(time.perf_counter() - start)
            with fresh_session() as session:
                start = time.perf_counter()
                for q in plans["weights"].queries:
                    session.execute(q.spec.sql, epsilon=q.cost.epsilon)
                one_by_one.append(time.perf_counter() - start)

        run, render = statistics.median(run_times), statistics.median(render_times)
        single = statistics.median(one_by_one)
        print(f"demo database: {args.rows:,} rows; report of {len(QUERIES)} queries, "
              f"total epsilon {args.epsilon:g}; medians of {args.repeats}")  # fmt: skip
        for rule, seconds in plan_times.items():
            print(f"plan, {rule:9s}(reads no data): {seconds * 1e3:8.1f} ms")
        print(f"report run, all included:        {run * 1e3:8.1f} ms")
        print(f"  of which writing files/charts: {render * 1e3:8.1f} ms")
        print(f"  charge + queries + noise:      {(run - render) * 1e3:8.1f} ms")
        print(f"12 queries one by one (execute): {single * 1e3:8.1f} ms")
        print(f"ratio report (without files) / one by one: {(run - render) / single:.2f}")
        print(f"ratio report (with files) / one by one:    {run / single:.2f}")
        print("largest relative error (95% half-width / expected) at the same total epsilon:")
        for rule, plan in plans.items():
            print(
                f"  {rule:9s} total epsilon {plan.total.epsilon:.9f}: "
                f"{largest_relative_error(plan):.4f}"
            )
        print("  (accuracy: targets = minimax's largest relative error x expected)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
