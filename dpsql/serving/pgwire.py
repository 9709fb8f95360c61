"""The PostgreSQL frontend/backend protocol, version 3.0: framing, messages and values.

Only what a server needs: reading the client's messages (each refused past a size limit before
its body is read) and writing the backend's. Message layouts follow the PostgreSQL manual,
chapter "Frontend/Backend Protocol", section "Message Formats"; type OIDs are those of
``pg_type.dat``. dpsql writes this module itself rather than using a wire-protocol library:
``docs/serving.md`` ("Why dpsql speaks the protocol itself") says which were weighed and why.

>>> data_row([b"1", None])
b'D\\x00\\x00\\x00\\x0f\\x00\\x02\\x00\\x00\\x00\\x011\\xff\\xff\\xff\\xff'
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = [
    "BINARY",
    "CANCEL_REQUEST",
    "GSSENC_REQUEST",
    "PROTOCOL_3",
    "SSL_REQUEST",
    "TEXT",
    "Field",
    "MessageTooLarge",
    "ProtocolViolation",
    "Reader",
    "command_complete",
    "cstring",
    "data_row",
    "decode_parameter",
    "duckdb_type_oid",
    "encode_value",
    "error_response",
    "fields",
    "message",
    "parameter_status",
    "read_message",
    "read_startup",
    "row_description",
    "value_type_oid",
]

PROTOCOL_3 = 196608
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
TEXT, BINARY = 0, 1

BOOL, BYTEA, INT8, INT2, INT4, TEXT_OID, OID = 16, 17, 20, 21, 23, 25, 26
FLOAT4, FLOAT8, VARCHAR, DATE, TIME, TIMESTAMP, TIMESTAMPTZ = 700, 701, 1043, 1082, 1083, 1114, 1184
INTERVAL, NUMERIC, UUID, JSON_OID = 1186, 1700, 2950, 114
ARRAYS = {BOOL: 1000, INT2: 1005, INT4: 1007, INT8: 1016, TEXT_OID: 1009, FLOAT8: 1022}

_SIZES = {BOOL: 1, INT2: 2, INT4: 4, INT8: 8, OID: 4, FLOAT4: 4, FLOAT8: 8, DATE: 4, TIME: 8}
_SIZES |= {TIMESTAMP: 8, TIMESTAMPTZ: 8, UUID: 16}
_BINARY_OIDS = frozenset({BOOL, INT2, INT4, INT8, OID, FLOAT4, FLOAT8, TEXT_OID, VARCHAR, DATE})
_BINARY_OIDS |= {TIMESTAMP, TIMESTAMPTZ, BYTEA}
_EPOCH = dt.date(2000, 1, 1)
_EPOCH_TIME = dt.datetime(2000, 1, 1)


class ProtocolViolation(Exception):
    """The client broke the protocol; the connection is closed after a FATAL error (08P01)."""


class MessageTooLarge(ProtocolViolation):
    """A message longer than the administrator's limit (54000); its body is never read."""


async def _exactly(reader: asyncio.StreamReader, count: int) -> bytes:
    try:
        return await reader.readexactly(count)
    except asyncio.IncompleteReadError:
        raise ConnectionResetError("the client closed the connection") from None


def _length(raw: bytes, limit: int) -> int:
    length = struct.unpack("!i", raw)[0]
    if length < 4:
        raise ProtocolViolation(f"invalid message length {length}")
    if length > limit:
        raise MessageTooLarge(f"message of {length} bytes is larger than the limit of {limit}")
    return length - 4


async def read_startup(reader: asyncio.StreamReader, limit: int) -> tuple[int, bytes]:
    """The next startup-phase message (no type byte): its request code and the rest."""
    body = await _exactly(reader, _length(await _exactly(reader, 4), limit))
    if len(body) < 4:
        raise ProtocolViolation("startup message without a protocol version")
    return struct.unpack("!i", body[:4])[0], body[4:]


async def read_message(reader: asyncio.StreamReader, limit: int) -> tuple[bytes, bytes]:
    """The next regular message: its type byte and body (at most ``limit`` bytes long)."""
    kind = await _exactly(reader, 1)
    return kind, await _exactly(reader, _length(await _exactly(reader, 4), limit))


class Reader:
    """Reads the fields of one message body in order."""

    def __init__(self, body: bytes):
        self.body = body
        self.at = 0

    def _take(self, count: int) -> bytes:
        if count < 0 or self.at + count > len(self.body):
            raise ProtocolViolation("message shorter than its fields")
        piece = self.body[self.at : self.at + count]
        self.at += count
        return piece

    def int16(self) -> int:
        return struct.unpack("!h", self._take(2))[0]

    def int32(self) -> int:
        return struct.unpack("!i", self._take(4))[0]

    def byte(self) -> bytes:
        return self._take(1)

    def string(self) -> str:
        end = self.body.find(b"\x00", self.at)
        if end < 0:
            raise ProtocolViolation("unterminated string in a message")
        text = self.body[self.at : end]
        self.at = end + 1
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolViolation("a string in a message is not UTF-8") from None

    def value(self) -> bytes | None:
        """A length-prefixed value (-1: NULL)."""
        length = self.int32()
        return None if length == -1 else self._take(length)

    def startup_parameters(self) -> dict[str, str]:
        """The name/value pairs of a StartupMessage."""
        parameters = {}
        while self.at < len(self.body) and self.body[self.at] != 0:
            name = self.string()
            parameters[name] = self.string()
        return parameters


def message(kind: bytes, body: bytes = b"") -> bytes:
    """A backend message: its type byte, length and ``body``."""
    return kind + struct.pack("!i", len(body) + 4) + body


def cstring(text: str) -> bytes:
    """``text`` as a NUL-terminated UTF-8 string (NULs inside dropped)."""
    return text.replace("\x00", "").encode("utf-8") + b"\x00"


def parameter_status(name: str, value: str) -> bytes:
    return message(b"S", cstring(name) + cstring(value))


def command_complete(tag: str) -> bytes:
    return message(b"C", cstring(tag))


def fields(kind: bytes, values: Sequence[tuple[str, str | None]]) -> bytes:
    """An ErrorResponse or NoticeResponse with these one-letter fields."""
    body = b"".join(code.encode() + cstring(text) for code, text in values if text is not None)
    return message(kind, body + b"\x00")


def error_response(
    code: str, text: str, *, severity: str = "ERROR", detail: str | None = None,
    hint: str | None = None, position: int | None = None,
) -> bytes:  # fmt: skip
    """An ErrorResponse: ``severity`` (ERROR or FATAL), SQLSTATE ``code`` and message."""
    return fields(
        b"E",
        [
            ("S", severity), ("V", severity), ("C", code), ("M", text), ("D", detail),
            ("H", hint), ("P", None if position is None else str(position)),
        ],
    )  # fmt: skip


@dataclass(frozen=True)
class Field:
    """A column of a result: its name, type OID and wire format (0 text, 1 binary)."""

    name: str
    oid: int
    format: int = TEXT

    def sent_as(self, wanted: int) -> Field:
        """This column in format ``wanted``; a type without a binary form here is sent as
        binary text (OID 25)."""
        if wanted == BINARY and self.oid not in _BINARY_OIDS:
            return Field(self.name, TEXT_OID, BINARY)
        return Field(self.name, self.oid, wanted)


def row_description(columns: Sequence[Field]) -> bytes:
    body = struct.pack("!h", len(columns))
    for column in columns:
        size = _SIZES.get(column.oid, -1)
        layout = struct.pack("!ihihih", 0, 0, column.oid, size, -1, column.format)
        body += cstring(column.name) + layout
    return message(b"T", body)


def data_row(values: Sequence[bytes | None]) -> bytes:
    body = struct.pack("!h", len(values))
    for value in values:
        body += struct.pack("!i", -1) if value is None else struct.pack("!i", len(value)) + value
    return message(b"D", body)


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") and not isinstance(value, Decimal) else value


def value_type_oid(values: Sequence[Any], default: int = TEXT_OID) -> int:
    """The type OID of a column of Python ``values`` (its first non-null value decides).

    >>> value_type_oid([None, 3]), value_type_oid([2.5]), value_type_oid(["DK"])
    (20, 701, 25)
    """
    value = next((_plain(v) for v in values if v is not None), None)
    if value is None:
        return default
    for kind, oid in (
        (bool, BOOL), (int, INT8), (float, FLOAT8), (Decimal, NUMERIC), (str, TEXT_OID),
        (dt.datetime, TIMESTAMP), (dt.date, DATE), (dt.time, TIME), (bytes, BYTEA),
    ):  # fmt: skip
        if isinstance(value, kind):
            if oid == TIMESTAMP and value.tzinfo is not None:
                return TIMESTAMPTZ
            return oid
    if isinstance(value, list | tuple):
        return ARRAYS.get(value_type_oid(value), TEXT_OID)
    return TEXT_OID


_DUCKDB_OIDS = {
    "BOOLEAN": BOOL, "TINYINT": INT2, "SMALLINT": INT2, "INTEGER": INT4, "BIGINT": INT8,
    "UTINYINT": INT2, "USMALLINT": INT4, "UINTEGER": INT8, "UBIGINT": NUMERIC,
    "HUGEINT": NUMERIC, "UHUGEINT": NUMERIC, "FLOAT": FLOAT4, "DOUBLE": FLOAT8,
    "VARCHAR": TEXT_OID, "DATE": DATE, "TIME": TIME, "TIMESTAMP": TIMESTAMP,
    "TIMESTAMP WITH TIME ZONE": TIMESTAMPTZ, "INTERVAL": INTERVAL, "BLOB": BYTEA, "UUID": UUID,
    "JSON": JSON_OID,
}  # fmt: skip


def duckdb_type_oid(type_name: str) -> int:
    """The PostgreSQL type OID of a DuckDB type name.

    >>> duckdb_type_oid("BIGINT"), duckdb_type_oid("DECIMAL(18,2)"), duckdb_type_oid("VARCHAR[]")
    (20, 1700, 1009)
    """
    name = type_name.upper()
    if name.endswith("[]"):
        return ARRAYS.get(duckdb_type_oid(name[:-2]), TEXT_OID)
    if name.startswith("DECIMAL"):
        return NUMERIC
    return _DUCKDB_OIDS.get(name, TEXT_OID)


def _array_text(values: Sequence[Any]) -> str:
    items = []
    for value in values:
        if value is None:
            items.append("NULL")
            continue
        text = _text(value)
        if text == "" or any(c in text for c in '{},"\\ ') or text.upper() == "NULL":
            text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
        items.append(text)
    return "{" + ",".join(items) + "}"


def _text(value: Any) -> str:
    value = _plain(value)
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, list | tuple):
        return _array_text(value)
    if isinstance(value, dict):
        return json.dumps(value, default=str)
    return str(value)


def _binary(value: Any, oid: int) -> bytes:
    value = _plain(value)
    if oid == BOOL:
        return b"\x01" if value else b"\x00"
    if oid in (INT2, INT4, INT8, OID):
        return struct.pack({INT2: "!h", INT4: "!i", INT8: "!q", OID: "!I"}[oid], int(value))
    if oid in (FLOAT4, FLOAT8):
        return struct.pack("!f" if oid == FLOAT4 else "!d", float(value))
    if oid == DATE:
        return struct.pack("!i", (value - _EPOCH).days)
    if oid in (TIMESTAMP, TIMESTAMPTZ):
        moment = value
        if value.tzinfo is not None:
            moment = value.astimezone(dt.UTC).replace(tzinfo=None)
        delta = moment - _EPOCH_TIME
        seconds = delta.days * 86400 + delta.seconds
        return struct.pack("!q", seconds * 1_000_000 + delta.microseconds)
    if oid == BYTEA:
        return bytes(value)
    return _text(value).encode("utf-8")


def encode_value(value: Any, column: Field) -> bytes | None:
    """``value`` in ``column``'s type and format (None: SQL NULL)."""
    if value is None:
        return None
    if column.format == BINARY:
        return _binary(value, column.oid)
    return _text(value).encode("utf-8")


_INTEGERS = {INT2: "!h", INT4: "!i", INT8: "!q", OID: "!I"}


def decode_parameter(raw: bytes | None, oid: int, wire_format: int) -> Any:
    """A Bind parameter as a Python value: int, float, Decimal, bool, date, datetime or str
    (text of an unknown or other type); None for NULL. ``ValueError`` names what is wrong.

    >>> decode_parameter(b"42", 20, 0), decode_parameter(b"DK", 0, 0)
    (42, 'DK')
    """
    if raw is None:
        return None
    if wire_format == BINARY:
        if oid in _INTEGERS and len(raw) == struct.calcsize(_INTEGERS[oid]):
            return struct.unpack(_INTEGERS[oid], raw)[0]
        if oid in (FLOAT4, FLOAT8) and len(raw) == (4 if oid == FLOAT4 else 8):
            return struct.unpack("!f" if oid == FLOAT4 else "!d", raw)[0]
        if oid == BOOL and len(raw) == 1:
            return raw != b"\x00"
        if oid == DATE and len(raw) == 4:
            return _EPOCH + dt.timedelta(days=struct.unpack("!i", raw)[0])
        if oid == TIMESTAMP and len(raw) == 8:
            return _EPOCH_TIME + dt.timedelta(microseconds=struct.unpack("!q", raw)[0])
        if oid in (0, TEXT_OID, VARCHAR):
            return raw.decode("utf-8")
        raise ValueError(f"a binary parameter of type OID {oid} is not supported; send it as text")
    text = raw.decode("utf-8")
    try:
        if oid in (INT2, INT4, INT8, OID):
            return int(text)
        if oid in (FLOAT4, FLOAT8):
            return float(text)
        if oid == NUMERIC:
            return Decimal(text)
        if oid == BOOL:
            return text.strip().lower() in ("t", "true", "1", "on", "yes", "y")
        if oid == DATE:
            return dt.date.fromisoformat(text)
        if oid == TIMESTAMP:
            return dt.datetime.fromisoformat(text)
    except (ValueError, InvalidOperation):
        raise ValueError(f"parameter {text!r} is not a valid value of type OID {oid}") from None
    return text
