"""The service answers from query streams like the local API: zero cost, naming the stream."""

from __future__ import annotations

from pathlib import Path

import dpsql
from tests.serving.conftest import serve, stop


def test_the_service_answers_from_a_stream(tmp_path: Path) -> None:
    server = serve(tmp_path)
    try:
        with dpsql.connect(server.database, analyst="alice") as session:
            opened = session.open_stream(
                "requests", [("bytes", 1000)], epsilon=0.2, mechanism="range_tree"
            )
        sql = "SELECT COUNT(*) AS n FROM requests WHERE bytes BETWEEN 10000 AND 49999"
        response = server.query(server.alice, {"sql": sql})
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["mechanism"] == f"stream:{opened['name']}"
        assert answer["epsilon_spent"] == 0 and answer["details"]["stream"] == opened["name"]
        listed = server.call("GET", "/v1/synopses", server.alice).json()
        assert opened["name"] in str(listed)
        # bob did not pay for it and the demo policy does not share synopses: fresh noise.
        other = server.query(server.bob, {"sql": sql, "epsilon": 0.1})
        assert other.status_code == 200 and other.json()["mechanism"] == "discrete_laplace"
    finally:
        stop(server.process)
