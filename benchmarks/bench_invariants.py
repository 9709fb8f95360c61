"""The privacy invariant suites at many more examples: partitions and literals
(tests/privacy/test_invariants.py, per column type and property) and neighbouring databases for
expressions, computed keys and rows without a unit (tests/privacy/test_neighbours.py, per
property).

The test suite runs 25 hypothesis examples each; this run uses ``--examples`` (default 500) and
reports the wall time.

    python benchmarks/bench_invariants.py --examples 500
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--examples", type=int, default=500)
    args = parser.parse_args()
    root = Path(__file__).resolve().parent.parent
    environment = {**os.environ, "DPSQL_INVARIANT_EXAMPLES": str(args.examples)}
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/privacy/test_invariants.py", "tests/privacy/test_neighbours.py"],
        cwd=root,
        env=environment,
        check=False,
    )
    elapsed = time.perf_counter() - started
    print(f"invariants: {args.examples} examples per property (and type), {elapsed:.0f} s, "
          f"exit {result.returncode}")
    return result.returncode


if __name__ == "__main__":
    raise SystemExit(main())
