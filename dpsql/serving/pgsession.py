"""The run-time parameters of a PostgreSQL session: ``SET``, ``SHOW``, ``RESET``.

Clients set parameters they expect every server to know (``DateStyle``, ``extra_float_digits``,
``application_name``); those are kept and shown back. ``dpsql.*`` parameters are the session's
query options, checked when they are set: ``dpsql.intervals`` (``on``: ``<col>_low``/
``<col>_high`` columns), ``dpsql.epsilon``, ``dpsql.delta``, ``dpsql.accuracy``,
``dpsql.mechanism`` and ``dpsql.max_answers`` (``default`` clears one).
"""

from __future__ import annotations

from typing import Any

from dpsql.engine.choices import MECHANISM_NAMES, STREAM_MECHANISMS
from dpsql.serving.pgcatalog import SERVER_VERSION
from dpsql.serving.pgstatements import PgError

__all__ = ["REPORTED", "SessionSettings"]

REPORTED = {
    "server_version": SERVER_VERSION,
    "server_encoding": "UTF8",
    "client_encoding": "UTF8",
    "DateStyle": "ISO, MDY",
    "TimeZone": "UTC",
    "IntervalStyle": "postgres",
    "integer_datetimes": "on",
    "standard_conforming_strings": "on",
    "is_superuser": "off",
    "application_name": "",
}
"""Parameters sent at start-up (ParameterStatus), with PostgreSQL's spelling."""
_DEFAULTS = {name.lower(): value for name, value in REPORTED.items()} | {
    "transaction_isolation": "read committed",
    "search_path": '"$user", public',
    "extra_float_digits": "1",
    "default_transaction_read_only": "on",
    "transaction_read_only": "on",
    "max_identifier_length": "63",
    "lc_collate": "C",
    "lc_ctype": "C",
    "dpsql.intervals": "off",
    "dpsql.epsilon": "",
    "dpsql.delta": "",
    "dpsql.mechanism": "",
    "dpsql.accuracy": "",
    "dpsql.max_answers": "",
}
_FIXED = {"server_version", "server_encoding", "is_superuser", "integer_datetimes"}
_ON = {"on", "true", "yes", "1", "t"}
_OFF = {"off", "false", "no", "0", "f"}


def _number(name: str, value: str, *, integer: bool = False) -> None:
    try:
        number = int(value) if integer else float(value)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise PgError("22023", f"{name} must be {kind}, got {value!r}") from None
    if not number >= 0 or number == float("inf"):
        raise PgError("22023", f"{name} must be a finite number >= 0, got {value!r}")


class SessionSettings:
    """The session's run-time parameters (``SET``/``SHOW``/``RESET``)."""

    def __init__(self, startup: dict[str, str]):
        self.values = dict(_DEFAULTS)
        for name, value in startup.items():
            if name.lower() in self.values and name.lower() not in _FIXED:
                self.set(name, value)

    def set(self, name: str, value: str) -> None:
        name = name.lower()
        value = value.strip()
        if name in _FIXED:
            raise PgError("55P02", f'parameter "{name}" cannot be changed')
        if name == "client_encoding" and value.upper().replace("-", "") not in ("UTF8", "UNICODE"):
            raise PgError("22023", "dpsql speaks UTF8 only")
        if name.startswith("dpsql."):
            if name not in _DEFAULTS:
                raise PgError("42704", f'unrecognized configuration parameter "{name}"')
            if name == "dpsql.intervals":
                if value.lower() not in _ON | _OFF:
                    raise PgError("22023", f"dpsql.intervals must be on or off, got {value!r}")
                value = "on" if value.lower() in _ON else "off"
            elif value.lower() == "default":
                value = ""
            elif name == "dpsql.mechanism":
                if value not in (*MECHANISM_NAMES, *STREAM_MECHANISMS):
                    names = ", ".join((*MECHANISM_NAMES, *STREAM_MECHANISMS))
                    raise PgError("22023", f"dpsql.mechanism must be one of {names}")
            else:
                _number(name, value, integer=name == "dpsql.max_answers")
        self.values[name] = value

    def reset(self, name: str) -> None:
        if name == "all":
            kept = {n: v for n, v in self.values.items() if n in _FIXED}
            self.values = {**_DEFAULTS, **kept}
        else:
            self.values[name] = _DEFAULTS.get(name, "")

    def show(self, name: str) -> str:
        if name not in self.values:
            raise PgError("42704", f'unrecognized configuration parameter "{name}"')
        return self.values[name]

    @property
    def intervals(self) -> bool:
        return self.values["dpsql.intervals"] == "on"

    def options(self) -> dict[str, Any]:
        """The query options of ``Session.execute`` the session has set."""
        values = self.values
        floats = {
            key: float(values[f"dpsql.{key}"]) if values[f"dpsql.{key}"] else None
            for key in ("epsilon", "delta", "accuracy")
        }
        answers = values["dpsql.max_answers"]
        return {
            **floats,
            "mechanism": values["dpsql.mechanism"] or None,
            "max_answers": int(answers) if answers else None,
        }
