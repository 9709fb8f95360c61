"""The service's budget view: an analyst sees only their own partition spending."""

from __future__ import annotations

from pathlib import Path

from dpsql.engine.demo import DEMO_POLICY
from tests.serving.conftest import serve, stop

PARTITIONED = DEMO_POLICY.replace(
    '[tables.requests]\nprivacy_unit = "user_id"\n',
    '[tables.requests]\nprivacy_unit = "user_id"\npartition_column = "country"\n',
)


def test_an_analyst_budget_lists_only_their_own_partitions(tmp_path: Path) -> None:
    assert PARTITIONED != DEMO_POLICY
    server = serve(tmp_path, policy=PARTITIONED)
    try:
        for token, country, epsilon in [(server.alice, "DK", 0.5), (server.bob, "NO", 0.25)]:
            sql = f"SELECT COUNT(*) FROM requests WHERE country = '{country}'"
            answered = server.query(token, {"sql": sql, "epsilon": epsilon})
            assert answered.status_code == 200, answered.text

        def partitions(token: str) -> dict[str, tuple[float, float]]:
            lines = server.call("GET", "/v1/budget", token).json()["lines"]
            return {
                line["name"]: (line["epsilon_spent"], line["epsilon_cap"])
                for line in lines
                if line["scope"] == "partition"
            }

        assert partitions(server.alice) == {"requests.country = 'DK'": (0.5, 4.0)}
        assert partitions(server.bob) == {"requests.country = 'NO'": (0.25, 2.0)}
        assert partitions(server.auditor) == {
            "requests.country = 'DK'": (0.5, 10.0),
            "requests.country = 'NO'": (0.25, 10.0),
        }
    finally:
        stop(server.process)
