"""The catalogue a PostgreSQL client sees: the public schema in an empty, sealed DuckDB.

Drivers and BI tools ask ``information_schema`` and ``pg_catalog`` what tables and columns
exist before they query. Those questions are answered by a DuckDB database in memory that holds
only empty tables built from the schema the analyst may see (``Session.schema``, the content of
``GET /v1/schema``): DuckDB's own ``information_schema`` and ``pg_catalog`` views then list
exactly the policy's tables and public tables, with their columns and types, and nothing read
from the data can appear, since no row was ever copied in. The database is sealed before the
first client statement: no file or network access, no extensions, a memory limit, one thread,
configuration locked.

The few functions whose DuckDB answer would mislead a PostgreSQL client (``version()``,
``current_user``, ``current_schema()``) are replaced by dpsql's answers before DuckDB runs the
statement (rewritten by sqlglot, PostgreSQL to DuckDB).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import duckdb
import sqlglot
from sqlglot import exp

from dpsql.serving.pgwire import Field, duckdb_type_oid, value_type_oid

__all__ = ["SERVER_VERSION", "Catalogue", "Rows"]

SERVER_VERSION = "15.0"
"""The PostgreSQL version dpsql reports (drivers pick their dialect features from it)."""
VERSION_TEXT = f"PostgreSQL {SERVER_VERSION} (dpsql {version('dpsql')}, differentially private)"
MAX_ROWS = 10_000
"""Most rows one catalogue statement may return."""


@dataclass(frozen=True)
class Rows:
    """A result set: its columns and rows."""

    columns: tuple[Field, ...]
    rows: tuple[tuple[Any, ...], ...]


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class Catalogue:
    """The analyst's catalogue: ``schema`` (``Session.schema()``'s layout) as empty tables in
    schema ``public`` of a database named after the dataset."""

    def __init__(self, schema: dict[str, Any], *, analyst: str, memory_limit: str = "64MB"):
        self.dataset = str(schema["dataset"]["name"])
        self.analyst = analyst
        self.tables = frozenset(
            t["name"].lower() for t in (*schema["tables"], *schema["public_tables"])
        )
        self._lock = threading.Lock()
        self._connection = duckdb.connect(":memory:", config={"threads": 1})
        run = self._connection.execute
        run(f"ATTACH ':memory:' AS {_quoted(self.dataset)}")
        run(f"USE {_quoted(self.dataset)}")
        run("CREATE SCHEMA public")
        run(f"USE {_quoted(self.dataset)}.public")
        for table in (*schema["tables"], *schema["public_tables"]):
            self._create(table["name"], [(c["name"], c["type"]) for c in table["columns"]])
        for setting in (
            "SET autoinstall_known_extensions = false",
            "SET autoload_known_extensions = false",
            "SET allow_community_extensions = false",
            *_MACROS,
            "SET enable_external_access = false",
            f"SET memory_limit = '{memory_limit}'",
            "SET lock_configuration = true",
        ):
            run(setting)

    def _create(self, table: str, columns: Sequence[tuple[str, str]]) -> None:
        def ddl(typed: bool) -> str:
            parts = [f"{_quoted(n)} {t if typed else 'VARCHAR'}" for n, t in columns]
            return f"CREATE TABLE public.{_quoted(table)} ({', '.join(parts) or 'x INTEGER'})"

        try:
            self._connection.execute(ddl(True))
        except duckdb.Error:  # a type DuckDB cannot spell back: the column is listed as text
            self._connection.execute(ddl(False))

    def close(self) -> None:
        """Close the database once no statement runs on it."""
        with self._lock:
            self._connection.close()

    def interrupt(self) -> None:
        """Stop the statement running on another thread."""
        self._connection.interrupt()

    def _rewritten(self, expression: exp.Expression) -> str:
        literal = {  # sqlglot's node: (PostgreSQL's column name, dpsql's answer)
            exp.CurrentVersion: ("version", VERSION_TEXT),
            exp.CurrentUser: ("current_user", self.analyst),
            exp.SessionUser: ("session_user", self.analyst),
            exp.CurrentSchema: ("current_schema", "public"),
            exp.CurrentDatabase: ("current_database", self.dataset),
        }

        def answer(node: exp.Expression) -> tuple[str, str] | None:
            """(the column name PostgreSQL gives the call, dpsql's answer) or None."""
            for kind, answered in literal.items():
                if isinstance(node, kind):
                    return answered
            called = node.expression if isinstance(node, exp.Dot) else node
            if isinstance(called, exp.Anonymous) and called.name.lower() == "version":
                return "version", VERSION_TEXT
            return None

        def replace(node: exp.Expression) -> exp.Expression:
            if isinstance(node, exp.Cast) and isinstance(node.to, exp.ObjectIdentifier):
                # sqlglot does not revisit a replacement: rewrite what the cast wraps first
                return _object_identifier(node.this.transform(replace), node.to.name.lower())
            if isinstance(node, exp.Table) and node.name.lower() in _COMPLETED:
                # DuckDB's view lacks columns PostgreSQL has: the completed one stands in
                completed = parse(_COMPLETED[node.name.lower()]).subquery(
                    node.alias_or_name, copy=False
                )
                return completed
            if isinstance(node, exp.Column) and node.args.get("db") and node.table:
                # DuckDB binds schema.table.column only outside a subquery's joins;
                # table.column names the same table (SQLAlchemy's column inspection)
                node = node.copy()
                node.set("db", None)
                return node
            called = node.expression if isinstance(node, exp.Dot) else node
            if isinstance(called, exp.Anonymous) and called.name.lower() in _MACRO_NAMES:
                # a temporary macro is found by its bare name only
                arguments = [a.transform(replace) for a in called.expressions]
                name = _MACRO_NAMES[called.name.lower()]
                return exp.Anonymous(this=name, expressions=arguments)
            if isinstance(called, exp.Anonymous) and called.name.lower() in _NULL_FUNCTIONS:
                return exp.Null()  # no sequence or collation options exist here
            found = answer(node)
            if found is None:
                return node
            name, text = found
            if isinstance(node.parent, exp.Select) and node.arg_key == "expressions":
                return exp.alias_(exp.Literal.string(text), name)
            return exp.Literal.string(text)

        return expression.transform(replace).sql(dialect="duckdb")

    def run(self, expression: exp.Expression) -> Rows:
        """``expression`` (a parsed PostgreSQL query) against the catalogue; on the calling
        thread, one statement at a time (``interrupt`` stops it)."""
        sql = self._rewritten(expression)
        with self._lock:
            cursor = self._connection.execute(sql)
            description = cursor.description or []
            rows = cursor.fetchmany(MAX_ROWS + 1)
        if len(rows) > MAX_ROWS:
            raise duckdb.InvalidInputException(
                f"a catalogue query may return at most {MAX_ROWS} rows"
            )
        columns = []
        for index, (name, type_code, *_) in enumerate(description):
            oid = duckdb_type_oid(str(type_code))
            if oid == 25:  # a type without a mapping: let the values say
                oid = value_type_oid([row[index] for row in rows])
            columns.append(Field(name, oid))
        return Rows(tuple(columns), tuple(tuple(row) for row in rows))


_TYPE_NAMES = {
    16: "boolean", 17: "bytea", 20: "bigint", 21: "smallint", 23: "integer", 25: "text",
    700: "real", 701: "double precision", 1043: "character varying", 1082: "date",
    1083: "time without time zone", 1114: "timestamp without time zone",
    1184: "timestamp with time zone", 1186: "interval", 1700: "numeric", 2950: "uuid",
}  # fmt: skip
"""PostgreSQL's ``format_type`` names, which drivers map to their types (DuckDB says ``int8``)."""
_LOOKUPS = {
    "regclass": ("pg_class", "relname"),
    "regtype": ("pg_type", "typname"),
    "regnamespace": ("pg_namespace", "nspname"),
    "regproc": ("pg_proc", "proname"),
}
_MACROS = (
    "CREATE TEMP MACRO to_regclass(name) AS "
    "(SELECT oid FROM pg_catalog.pg_class WHERE relname = name LIMIT 1)",
    "CREATE TEMP MACRO to_regtype(name) AS "
    "(SELECT oid FROM pg_catalog.pg_type WHERE typname = name LIMIT 1)",
    "CREATE TEMP MACRO pg_get_userbyid(id) AS 'dpsql'",
    "CREATE TEMP MACRO postgres_format_type(t, m) AS CASE t "
    + " ".join(f"WHEN {oid} THEN '{name}'" for oid, name in _TYPE_NAMES.items())
    + " ELSE pg_catalog.format_type(t, m) END",
)
"""PostgreSQL's name lookups that DuckDB lacks (psycopg's ``TypeInfo.fetch`` calls
``to_regtype``)."""
_MACRO_NAMES = {
    "to_regclass": "to_regclass",
    "to_regtype": "to_regtype",
    "pg_get_userbyid": "pg_get_userbyid",
    "format_type": "postgres_format_type",
}
"""Functions answered by the macros above, by the name a client calls them."""
_COMPLETED = {
    "pg_collation": "SELECT oid, collname, NULL::BIGINT AS collnamespace "
    "FROM pg_catalog.pg_collation",
}
"""``pg_catalog`` views with the columns DuckDB leaves out (SQLAlchemy's column inspection
joins ``pg_collation.collnamespace``)."""
_NULL_FUNCTIONS = frozenset({"json_build_object", "jsonb_build_object", "pg_get_serial_sequence"})
"""Functions SQLAlchemy calls only to describe identity and collation options, which the
catalogue's tables never have."""


def _object_identifier(value: exp.Expression, kind: str) -> exp.Expression:
    """``value::regclass`` (and the other object identifier types): the object's OID for a
    name, the value itself for a number (DuckDB has no such types)."""
    if isinstance(value, exp.Literal) and value.is_string and kind in _LOOKUPS:
        table, column = _LOOKUPS[kind]
        name = value.name.split(".")[-1].strip('"')
        return exp.Subquery(
            this=sqlglot.select("oid")
            .from_(f"pg_catalog.{table}")
            .where(exp.column(column).eq(exp.Literal.string(name)))
            .limit(1)
        )
    return value


def parse(text: str) -> exp.Expression:
    """``text`` as one PostgreSQL statement (sqlglot's ``ParseError`` if it is not one)."""
    return sqlglot.parse_one(text, read="postgres")
