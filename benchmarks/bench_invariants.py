"""The privacy invariant suite (tests/engine/test_invariants.py) at many more examples per type.

The test suite runs 25 hypothesis examples per column type and property; this run uses
``--examples`` (default 500) and reports how many queries were tried and the wall time.

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
         "tests/engine/test_invariants.py"],
        cwd=root,
        env=environment,
        check=False,
    )
    elapsed = time.perf_counter() - started
    print(f"invariants: {args.examples} examples per type and property, {elapsed:.0f} s, "
          f"exit {result.returncode}")
    return result.returncode


if __name__ == "__main__":
    raise SystemExit(main())
