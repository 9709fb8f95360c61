"""A generated demo dataset (no download): web requests by users in five countries.

``build_demo`` writes a DuckDB file deterministically from a fixed seed, plus the policy that
governs it. The data is synthetic; the seed only makes the demo reproducible and never touches the
noise, which always comes from the secure generator.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

__all__ = ["DEMO_POLICY", "DEMO_QUERIES", "build_demo"]

DEMO_POLICY = """\
[dataset]
name = "demo"
epsilon = 10.0          # total over all analysts
delta = 1e-6
default_query_epsilon = 0.5

[analysts.alice]
epsilon = 4.0
delta = 1e-7

[analysts.bob]
epsilon = 2.0

[tables.requests]
privacy_unit = "user_id"
max_groups_per_unit = 5     # distinct GROUP BY keys one unit may touch
max_rows_per_group = 1      # rows one unit may add to one group
max_rows_per_unit = 20      # rows one unit may add to an ungrouped aggregate

[tables.requests.columns.bytes]
bounds = [0, 100000]

[tables.requests.columns.latency_ms]
bounds = [0, 2000]

[tables.requests.columns.country]
public_keys = ["DK", "NO", "SE", "FI", "IS"]

[tables.requests.columns.status]
public_keys = [200, 301, 404, 500]
"""

DEMO_QUERIES: tuple[tuple[str, str], ...] = (
    (
        "Requests per country (every public key is answered, including absent IS)",
        "SELECT country, COUNT(*) AS requests FROM requests GROUP BY country",
    ),
    ("A range count", "SELECT COUNT(*) AS adults_30_50 FROM requests WHERE age BETWEEN 30 AND 50"),
    (
        "Traffic and mean latency of mobile clients by country (AVG = noisy SUM / noisy COUNT)",
        "SELECT country, SUM(bytes) AS bytes, AVG(latency_ms) AS mean_latency "
        "FROM requests WHERE device = 'mobile' GROUP BY country",
    ),
    (
        "Two public-key columns: every (country, status) pair is answered",
        "SELECT country, status, COUNT(*) AS requests FROM requests "
        "WHERE day >= '2026-10-15' GROUP BY country, status",
    ),
    (
        "A point count with the budget in BigQuery's syntax",
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=0.25) COUNT(*) AS home_hits "
        "FROM requests WHERE url = '/home'",
    ),
    (
        "URLs nobody listed in advance: threshold + ALP synopsis (keys above the noisy threshold)",
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-8, mechanism='alp') "
        "url, COUNT(*) AS requests FROM requests WHERE device = 'desktop' GROUP BY url",
    ),
    (
        "Any URL's count from the stored synopsis: post-processing, no budget",
        "SELECT COUNT(*) AS page_7 FROM requests WHERE device = 'desktop' AND url = '/page/7'",
    ),
)

_COUNTRIES = np.array(["DK", "NO", "SE", "FI"])
_DEVICES = np.array(["mobile", "desktop", "tablet"])
_STATUS = np.array([200, 301, 404, 500])


def demo_frame(rows: int = 200_000, users: int = 20_000, seed: int = 20261121) -> pd.DataFrame:
    """The synthetic requests table."""
    rng = np.random.default_rng(seed)
    user = rng.integers(0, users, rows)
    home = rng.choice(len(_COUNTRIES), users, p=[0.35, 0.25, 0.3, 0.1])
    pages = np.array([f"/page/{i}" for i in range(1000)] + ["/home"] * 200)
    return pd.DataFrame(
        {
            "user_id": user.astype(np.int64),
            "country": _COUNTRIES[home[user]],
            "device": _DEVICES[rng.choice(3, rows, p=[0.6, 0.35, 0.05])],
            "age": (18 + (user * 7919) % 60).astype(np.int32),
            "url": pages[rng.integers(0, len(pages), rows)],
            "status": _STATUS[rng.choice(4, rows, p=[0.85, 0.05, 0.08, 0.02])].astype(np.int32),
            "bytes": np.round(rng.lognormal(9, 1.2, rows)).astype(np.int64),
            "latency_ms": np.round(rng.gamma(2.0, 60.0, rows), 1),
            "day": pd.Timestamp("2026-10-01")
            + pd.to_timedelta(rng.integers(0, 31, rows), unit="D"),
        }
    )


def build_demo(path: str | Path, *, rows: int = 200_000, users: int = 20_000) -> Path:
    """Write the demo table to a fresh DuckDB file at ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in (path, Path(f"{path}.wal")):
        stale.unlink(missing_ok=True)
    frame = demo_frame(rows, users)
    frame["day"] = frame["day"].dt.date
    connection = duckdb.connect(str(path))
    try:
        connection.execute("SET enable_progress_bar = false")  # the CLI draws its own
        connection.register("frame", frame)
        connection.execute("CREATE TABLE requests AS SELECT * FROM frame")
    finally:
        connection.close()
    return path
