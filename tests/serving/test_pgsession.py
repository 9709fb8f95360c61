"""The PostgreSQL session's parameters: dpsql's query options checked when set."""

from __future__ import annotations

import pytest

from dpsql.serving.pgsession import SessionSettings
from dpsql.serving.pgstatements import PgError


def test_query_options_follow_set_and_reset() -> None:
    settings = SessionSettings({"dpsql.epsilon": "0.25", "application_name": "metabase"})
    assert settings.options() == {
        "epsilon": 0.25, "delta": None, "accuracy": None, "mechanism": None, "max_answers": None,
    }  # fmt: skip
    settings.set("dpsql.mechanism", "threshold")
    settings.set("DPSQL.Intervals", "true")
    settings.set("dpsql.max_answers", "3")
    assert settings.intervals and settings.options()["mechanism"] == "threshold"
    assert settings.options()["max_answers"] == 3
    settings.set("dpsql.epsilon", "default")
    assert settings.options()["epsilon"] is None
    assert settings.show("application_name") == "metabase"
    settings.reset("all")
    assert not settings.intervals and settings.show("application_name") == ""


@pytest.mark.parametrize(
    ("name", "value", "sqlstate"),
    [
        ("dpsql.epsilon", "-1", "22023"),
        ("dpsql.epsilon", "inf", "22023"),
        ("dpsql.delta", "lots", "22023"),
        ("dpsql.max_answers", "2.5", "22023"),
        ("dpsql.mechanism", "gaussian_please", "22023"),
        ("dpsql.intervals", "maybe", "22023"),
        ("dpsql.seed", "1", "42704"),  # no such option: nothing reaches the generator
        ("server_version", "9.6", "55P02"),
        ("client_encoding", "LATIN1", "22023"),
    ],
)
def test_bad_values_are_refused_when_set(name: str, value: str, sqlstate: str) -> None:
    with pytest.raises(PgError) as refused:
        SessionSettings({}).set(name, value)
    assert refused.value.sqlstate == sqlstate


def test_show_names_an_unknown_parameter() -> None:
    with pytest.raises(PgError, match='unrecognized configuration parameter "nope"'):
        SessionSettings({}).show("nope")
