"""The application's own helpers, in process (the endpoints: ``test_api.py``, end to end)."""

from __future__ import annotations

import enum
from datetime import UTC, date, datetime

import numpy as np
import pytest

from dpsql.serving.app import StrictJSONResponse, _RequestRoute


class Level(enum.IntEnum):
    LOW = 1


class Text(str):
    pass


def test_strict_json_renders_every_value_the_engine_gives() -> None:
    """Exact types and their subclasses alike: non-finite floats are null, dates ISO text,
    NumPy scalars plain numbers and text, keys their ``str``, tuples arrays."""
    content = {
        "rows": [(1, 2.5, float("nan"), None, True, "DK"), [float("inf"), -float("inf")]],
        "numpy": [np.int64(7), np.float64(0.5), np.float32("nan"), np.str_("SE"), np.bool_(True)],
        "when": [date(2024, 1, 31), datetime(2024, 1, 31, 12, 30, tzinfo=UTC)],
        "keys": {1: "int", 2.5: "float", None: "none", "level": Level.LOW, Text("t"): Text("u")},
    }
    assert StrictJSONResponse(content).body == (
        b'{"rows":[[1,2.5,null,null,true,"DK"],[null,null]],'
        b'"numpy":[7,0.5,null,"SE",true],'
        b'"when":["2024-01-31","2024-01-31T12:30:00+00:00"],'
        b'"keys":{"1":"int","2.5":"float","None":"none","level":1,"t":"u"}}'
    )


def test_an_endpoint_must_read_the_request_itself() -> None:
    """Endpoints are called with the request alone (FastAPI's handler, which would fill other
    parameters, is skipped): one declaring more is refused when its route is made."""

    async def with_parameter(request, seq: int):  # what FastAPI would have filled in
        raise AssertionError("never called")

    with pytest.raises(TypeError, match="with_parameter must take the request alone"):
        _RequestRoute("/v1/x/{seq}", with_parameter, methods=["GET"])
