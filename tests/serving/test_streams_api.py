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


def test_post_streams_opens_a_stream_charged_once(tmp_path: Path) -> None:
    """``POST /v1/streams`` opens a stream (a fixed filter, a DATE column binned by weeks) for
    the token's analyst, charged once; refusals are RFC 9457 problems that charge nothing; the
    remote client's ``open_stream`` is the same call."""
    server = serve(tmp_path)
    try:
        body = {
            "table": "requests",
            "columns": [{"name": "day", "width": 7, "bounds": ["2026-09-01", "2026-12-28"]}],
            "epsilon": 0.5,
            "mechanism": "range_tree",
            "filter": "country = 'DK'",
        }
        opened = server.call("POST", "/v1/streams", server.alice, json=body)
        assert opened.status_code == 201, opened.text
        stream = opened.json()
        assert stream["cells"] == 17 and stream["filters"] == ["\"country\" = 'DK'"]
        budget = server.call("GET", "/v1/budget", server.alice).json()
        charges = [e for e in server.entries() if e["mechanism"] == "stream:range_tree"]
        assert len(charges) == 1 and charges[0]["analyst"] == "alice"
        sql = (
            "SELECT COUNT(*) AS n FROM requests WHERE country = 'DK' "
            "AND day BETWEEN '2026-09-08' AND '2026-10-05'"
        )
        answer = server.query(server.alice, {"sql": sql})
        assert answer.status_code == 200, answer.text
        assert answer.json()["mechanism"] == f"stream:{stream['name']}"
        assert answer.json()["epsilon_spent"] == 0
        for bad, status, words in [
            ({**body, "epsilon": 100.0}, 409, "budget exceeded"),
            ({**body, "filter": "day < '2026-10-01'"}, 400, "other columns"),
            ({**body, "columns": [{"name": "day", "width": 7}]}, 400, "needs bounds"),
            ({**body, "mechanism": "mwem"}, 400, "mechanism: Input should be"),
            ({**body, "analyst": "bob"}, 400, "analyst: Extra inputs"),
            ({**body, "epsilon": "1"}, 400, "epsilon: Input should be a valid number"),
        ]:
            refused = server.call("POST", "/v1/streams", server.alice, json=bad)
            assert refused.status_code == status, refused.text
            assert refused.headers["content-type"].startswith("application/problem+json")
            assert words in refused.text
        assert server.call("GET", "/v1/budget", server.alice).json() == budget
        auditor = server.call("POST", "/v1/streams", server.auditor, json=body)
        assert auditor.status_code == 403
        with dpsql.connect(server.url, token=server.bob) as remote:
            described = remote.open_stream(
                "requests", [("bytes", 1000)], epsilon=0.2, mechanism="range_tree"
            )
            assert described["columns"][0]["width"] == 1000
            result = remote.execute("SELECT COUNT(*) FROM requests WHERE bytes < 20000")
            assert result.mechanism == f"stream:{described['name']}" and result.epsilon == 0
            assert described["name"] in str(remote.synopses())
        schema = server.call("GET", "/openapi.json", None).json()
        assert "StreamRequest" in schema["components"]["schemas"]
        assert "/v1/streams" in schema["paths"]
    finally:
        stop(server.process)
