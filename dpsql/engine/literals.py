"""Literals, collations and partition values, decided by the database that runs the query.

What dpsql charges and what the database reads must agree in the database's own semantics, not in
a second model of them in Python. Before a query is priced, ``Binder``:

* converts every literal the analyzer emitted (``CAST('<text>' AS <column type>)``) with the
  backend itself, refuses one the backend cannot convert (out of range, not a value of the type)
  or converts inexactly (``2.5`` for a BIGINT, ``9007199254740993`` for a DOUBLE, more digits
  than a DECIMAL keeps), and replaces it by the backend's own spelling of the converted value;
* refuses string columns whose comparisons are not binary (a ``COLLATE NOCASE`` column, or a view
  applying a collation), probed without reading a row;
* for a table with a partition column, evaluates the WHERE clause over the column's declared
  values in the backend (``dpsql.sql.partition.domain_probe``) and restricts the clause the
  generated SQL runs to exactly the values it will be charged for.

Every step reads metadata or literals only, never a row of a table, so refusals here depend on the
query and the policy alone and charge nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import TYPE_CHECKING, Protocol

import sqlglot
from sqlglot import exp

from dpsql.engine.backends import rows_of
from dpsql.engine.calendars import calendar_bounds, calendar_domain
from dpsql.engine.policy import Policy, PublicKey, TablePolicy
from dpsql.engine.virtual_columns import with_virtual_bounds
from dpsql.errors import PolicyError, UnsupportedQueryError
from dpsql.sql import calendar, expressions
from dpsql.sql.analyze import is_enum, temporal_pattern
from dpsql.sql.filters import check_unit_filters
from dpsql.sql.partition import domain_probe, mentions, restrict
from dpsql.sql.shape import ColumnKind, QueryShape

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Binder", "BoundShape", "Runner"]

_PROBE_STRINGS = ("B", "a", "A", "é", "e", "e\u0301", "ss", "ß", "a ", "")
"""Strings that any non-binary collation (case, accents, normalisation, ICU) groups or orders
differently from bytewise comparison."""

_SPELLED_KEPT = 100_000
"""Converted literals a binder keeps (then it starts afresh): bounds a long session's memory."""

_ONE_ROW = 32
"""Literals of one type converted in one row of one column each; more go in a VALUES list."""

_KEY_SETS_KEPT = 256
"""Converted public key lists a binder keeps (one per policy column, per policy in force)."""


class Runner(Protocol):
    """What the binder needs from a backend (``dialect``: the SQL it runs, default DuckDB;
    ``settings_locked``: True when its settings cannot change, default False)."""

    def run(self, sql: str) -> pd.DataFrame: ...


@dataclass(frozen=True)
class BoundShape:
    """A shape whose literals are the backend's own, and its partition charge (if any):
    (family, the declared values it reads, as the backend spells them)."""

    shape: QueryShape
    partition: tuple[str, tuple[str, ...]] | None


def _bin(name: str, expression: exp.Expression) -> expressions.Bin | None:
    """The bin a virtual key column groups by (None: not a bin)."""
    return expressions.bin_of(expression) if name.startswith(expressions.KEY_PREFIX) else None


def _identifier(name: str) -> str:
    return exp.to_identifier(name, quoted=True).sql(dialect="duckdb")


def _quote(value: str) -> str:
    return exp.Literal.string(value).sql(dialect="duckdb")


def _is_float(target: exp.DataType) -> bool:
    return target.is_type(exp.DataType.Type.FLOAT, exp.DataType.Type.DOUBLE)


def _is_exact_number(target: exp.DataType) -> bool:
    return target.is_type(*exp.DataType.INTEGER_TYPES, exp.DataType.Type.DECIMAL)


class Binder:
    """Binds shapes and public keys to one backend's semantics (see the module docstring)."""

    def __init__(self, backend: Runner, catalog: dict[str, dict[str, str]]):
        self.backend = backend
        self.catalog = catalog
        self._binary: dict[tuple[str, str], bool] = {}
        self._spelled: dict[tuple[str, str], str] = {}
        """(type SQL, literal text) -> the backend's spelling of the converted value: a pure
        function of the two in the database's semantics (no row is read) while the backend's
        settings (e.g. its time zone) cannot change: kept only for a backend that says so."""
        self._keeps = bool(getattr(backend, "settings_locked", False))
        self._keys: dict[tuple[str, str, tuple[PublicKey, ...]], tuple[exp.Cast, ...]] = {}
        """Converted public keys by (table, column, declared keys), for a pure binder."""

    @property
    def pure(self) -> bool:
        """Whether binding is a pure function of the query, the policy and the catalog: the
        backend's settings are locked, so no conversion can change its answer later."""
        return self._keeps

    def with_relation(self, name: str, types: Mapping[str, str]) -> Binder:
        """This binder also knowing relation ``name`` (``dpsql.engine.relations``) and its
        columns' types; converted literals stay shared. Its string columns were checked for
        binary collations where they come from (``bind_relation``)."""
        other = copy.copy(self)
        other.catalog = {**self.catalog, name: dict(types)}
        other._binary = {**self._binary, **{(name, column): True for column in types}}
        return other

    def run(self, sql: str) -> pd.DataFrame:
        """Run ``sql`` (DuckDB's dialect) on the backend, transpiled to its dialect."""
        return self._run(sql)

    def _run(self, sql: str) -> pd.DataFrame:
        return self.backend.run(self._in_dialect(sql))

    def _in_dialect(self, sql: str) -> str:
        """``sql`` (DuckDB's dialect) in the backend's dialect."""
        dialect = getattr(self.backend, "dialect", "duckdb")
        if dialect != "duckdb":
            sql = sqlglot.transpile(sql, read="duckdb", write=dialect)[0]
        return sql

    # literals -----------------------------------------------------------------------------------
    def convert(self, literals: Sequence[exp.Cast], what: str) -> list[exp.Cast]:
        """Each ``CAST('<text>' AS T)`` converted by the backend and re-spelled as it prints the
        value; ``UnsupportedQueryError`` (``PolicyError`` for policy values, ``what`` says which)
        naming the first literal that does not convert exactly. A (type, text) pair converted
        before is not sent again: its spelling depends on nothing else."""
        converted: list[exp.Cast | None] = [None] * len(literals)
        by_type: dict[str, list[int]] = {}
        spellings: dict[object, str] = {}
        for index, literal in enumerate(literals):
            key = _type_key(literal.to)
            if key not in spellings:
                spellings[key] = _type_sql(key, literal.to)
            known = self._spelled.get((spellings[key], literal.this.this))
            if known is not None:
                converted[index] = exp.Cast(this=exp.Literal.string(known), to=literal.to.copy())
            else:
                by_type.setdefault(spellings[key], []).append(index)
        for type_sql, indices in by_type.items():
            target = literals[indices[0]].to
            number = "float" if _is_float(target) else "exact" if _is_exact_number(target) else ""
            texts = [literals[i].this.this for i in indices]
            for i, spelled, widened in zip(
                indices, *self._converted_texts(texts, type_sql, number), strict=True
            ):
                literal = literals[int(i)]
                text = literal.this.this
                if not isinstance(spelled, str) or not _exact(text, spelled, widened, number):
                    self._refuse(literal, text, type_sql, what)
                if self._keeps:
                    if len(self._spelled) >= _SPELLED_KEPT:
                        self._spelled.clear()
                    self._spelled[(type_sql, text)] = spelled
                converted[int(i)] = exp.Cast(this=exp.Literal.string(spelled), to=target.copy())
        return [c for c in converted if c is not None]

    def _converted_texts(
        self, texts: Sequence[str], type_sql: str, number: str
    ) -> tuple[list[object], list[object]]:
        """Each text converted to ``type_sql`` by the backend and spelled back as VARCHAR
        (None: not a value of the type), and, for a float type (``number``), the value widened
        to a DOUBLE and spelled. A few texts are converted in one row (``TRY_CAST`` of each, as
        a VARCHAR); many in a ``VALUES`` list, one row each: the same cast of the same VARCHAR
        values, read as tuples, not a DataFrame."""

        def converted(text: str) -> str:
            return f"TRY_CAST({text} AS {type_sql})"

        def as_double(text: str) -> str:
            if number != "float":
                return "NULL"
            return f"CAST(CAST({converted(text)} AS DOUBLE) AS VARCHAR)"

        if len(texts) <= _ONE_ROW:
            values = [f"CAST({_quote(t)} AS VARCHAR)" for t in texts]
            row = self._rows(
                "SELECT "
                + ", ".join(
                    f"CAST({converted(v)} AS VARCHAR) AS __c{i}, {as_double(v)} AS __x{i}"
                    for i, v in enumerate(values)
                )
            )[0]
            return list(row[0::2]), list(row[1::2])
        rows = ", ".join(f"({i}, {_quote(t)})" for i, t in enumerate(texts))
        found = self._rows(
            f"SELECT __i, CAST({converted('__t')} AS VARCHAR) AS __c, {as_double('__t')} AS __x "
            f"FROM (VALUES {rows}) AS __literals(__i, __t) ORDER BY __i"
        )
        return [r[1] for r in found], [r[2] for r in found]

    def _rows(self, sql: str) -> list[tuple[object, ...]]:
        """The rows of ``sql`` (DuckDB's dialect) on the backend, as tuples."""
        return list(rows_of(self.backend, self._in_dialect(sql)).data)  # type: ignore[arg-type]

    @staticmethod
    def _refuse(literal: exp.Cast, text: str, type_sql: str, what: str) -> None:
        message = (
            f"{what} {text!r} is not exactly a value of type {type_sql}: it is out of range, "
            "not of that type, or would be rounded"
        )
        if what != "literal":
            raise PolicyError(message)
        line, column = literal.meta.get("position", (None, None))
        raise UnsupportedQueryError(message, line=line, column=column)

    # collations ---------------------------------------------------------------------------------
    def _order(self, source: str) -> list[str]:
        rows = ", ".join(f"({_quote(s)})" for s in _PROBE_STRINGS)
        frame = self._run(
            f"SELECT __x FROM ({source} UNION ALL SELECT * FROM (VALUES {rows}) AS __p(__x)) "
            "AS __all GROUP BY __x ORDER BY __x"
        )
        return [str(v) for v in frame.iloc[:, 0]]

    def is_binary(self, table: str, column: str) -> bool:
        """Whether ``table.column`` compares, groups and orders strings bytewise (probed with
        ``WHERE false``: no row is read)."""
        key = (table, column)
        if key not in self._binary:
            name = exp.to_identifier(column, quoted=True).sql(dialect="duckdb")
            source = exp.to_identifier(table, quoted=True).sql(dialect="duckdb")
            plain = self._order("SELECT CAST(NULL AS VARCHAR) AS __x WHERE false")
            found = self._order(f"SELECT {name} AS __x FROM {source} WHERE false")
            self._binary[key] = found == plain
        return self._binary[key]

    def check_binary(self, table: str, columns: Sequence[str]) -> None:
        types = self.catalog.get(table, {})
        for column in columns:
            if ColumnKind.of(types.get(column, "")) is ColumnKind.STRING and not self.is_binary(
                table, column
            ):
                raise UnsupportedQueryError(
                    f"column {column!r} of table {table!r} has a non-binary collation (e.g. "
                    "NOCASE): dpsql cannot filter, group or partition on it; expose it through a "
                    "view that normalises the text (e.g. lower(...)) and has no collation"
                )

    # public keys --------------------------------------------------------------------------------
    def keys(self, table: str, column: str, keys: Sequence[PublicKey]) -> tuple[exp.Cast, ...]:
        """The declared keys of ``table.column`` as the backend's own typed literals; refuses a
        key that is not exactly a value of the column's type and two keys that are one value.
        For a pure binder the same keys give the same tuple again (not converted again), so
        what is derived from it (their SQL, their texts) can be kept by its identity."""
        if not self._keeps:
            return self._converted_keys(table, column, keys)
        asked = (table, column, tuple(keys))
        found = self._keys.get(asked)
        if found is None:
            if len(self._keys) >= _KEY_SETS_KEPT:
                self._keys.clear()
            found = self._keys[asked] = self._converted_keys(table, column, keys)
        return found

    def _converted_keys(
        self, table: str, column: str, keys: Sequence[PublicKey]
    ) -> tuple[exp.Cast, ...]:
        type_name = self.catalog[table][column]
        kind = ColumnKind.of(type_name)
        target = exp.DataType.build(type_name, dialect="duckdb")
        drafts = [
            exp.Cast(this=exp.Literal.string(_key_text(k, kind, type_name, column)), to=target)
            for k in keys
        ]
        converted = self.convert(drafts, f"public key of {table}.{column}")
        seen: dict[str, PublicKey] = {}
        for key, literal in zip(keys, converted, strict=True):
            spelled = literal.this.this
            if spelled in seen:
                raise PolicyError(
                    f"public keys {seen[spelled]!r} and {key!r} of {table}.{column} are the same "
                    f"{type_name} value ({spelled!r}); list each value once"
                )
            seen[spelled] = key
        return tuple(converted)

    # shapes -------------------------------------------------------------------------------------
    def bind(self, shape: QueryShape, policy: Policy) -> BoundShape:
        """``shape`` with backend-converted literals, binary string columns, and its WHERE clause
        restricted to the partition values it is charged for."""
        table = policy.table(shape.table)
        check_unit_filters(
            shape,
            table.privacy_unit if table is not None else None,
            table.partition_column if table is not None else None,
        )
        used = sorted({c.name for c in shape.where.find_all(exp.Column)} if shape.where else set())
        used += [c.name for e in shape.virtual.values() for c in e.find_all(exp.Column)]
        shape = replace(shape, virtual={n: self._converted(e) for n, e in shape.virtual.items()})
        used += list(shape.group_by) if shape.range_join is None else []
        if shape.range_join is not None:
            used.append(shape.range_join.value)
        if table is not None and table.partition_column is not None:
            used.append(table.partition_column)
        self.check_binary(shape.table, sorted(set(used)))
        where = shape.where
        if where is not None:
            where = self._converted(where)
        partition = None
        if (
            table is not None
            and table.partition_column is not None
            and mentions(where, table.partition_column)
        ):
            where, partition = self._partitioned(shape.table, table, where)
        shape = replace(shape, where=where)
        if table is not None and shape.virtual:
            shape = replace(shape, domains=self.bin_domains(shape, table))
            self.check_types(shape, table)
        if table is not None and shape.range_join is None:
            shape = replace(shape, domains={**shape.domains, **self.enum_domains(shape, table)})
        return BoundShape(shape, partition)

    def enum_domains(self, shape: QueryShape, table: TablePolicy) -> dict[str, tuple[str, ...]]:
        """The values of each ENUM group column without declared public keys, read from its
        type by the database: the ENUM's values are public schema (every analyst sees the type),
        so they are the key domain, in the ENUM's order."""
        domains: dict[str, tuple[str, ...]] = {}
        for column in shape.group_by:
            type_name = shape.types.get(column, "")
            if is_enum(type_name) and table.column(column).public_keys is None:
                frame = self._run(
                    f"SELECT CAST(unnest(enum_range(NULL::{type_name})) AS VARCHAR) AS __key"
                )
                domains[column] = tuple(str(v) for v in frame["__key"])
        return domains

    # expressions --------------------------------------------------------------------------------
    def bin_domains(self, shape: QueryShape, table: TablePolicy) -> dict[str, tuple[int, ...]]:
        """The key domain of each GROUP BY bin: the distinct values the database gives the bin
        over the column's declared bounds (``dpsql.sql.expressions.bin_domain_sql``). A bin
        whose domain the database cannot enumerate exactly (no bounds, too many bins, an index
        beyond a BIGINT) is refused here, before the charge."""
        domains: dict[str, tuple[int | str, ...]] = {}
        for name, expression in shape.virtual.items():
            key = calendar.calendar_of(expression)
            if key is not None and name.startswith(expressions.KEY_PREFIX):
                domains[name] = self._calendar_domain(shape, table, key)
                continue
            found = _bin(name, expression)
            if found is None:
                continue
            interval = table.column(found.column).numeric_bounds
            if interval is None:
                raise PolicyError(
                    f"GROUP BY bins of {found.column!r} need its bounds: set "
                    f"[tables.{shape.table}.columns.{found.column}] bounds = [low, high]"
                )
            try:
                ends = self._run(expressions.bin_ends_sql(found, interval))
            except Exception:  # the database cannot index the bounds: no data was read
                ends = None
            if ends is None or ends.isna().to_numpy().any():
                raise PolicyError(
                    f"GROUP BY bins of {found.column!r} of width {found.width:g}: the bounds "
                    f"{list(interval)} have no bin index the database can represent; widen the "
                    "bins or narrow the bounds"
                )
            first, last = (int(v) for v in ends.iloc[0])
            if last - first + 1 > expressions.MAX_BINS:
                raise PolicyError(
                    f"GROUP BY bins of {found.column!r} of width {found.width:g} over its bounds "
                    f"give {last - first + 1} groups (at most {expressions.MAX_BINS}); widen the "
                    "bins"
                )
            try:
                frame = self._run(expressions.bin_domain_sql(found, first, last))
            except Exception:  # e.g. a key beyond a BIGINT; no data was read
                raise PolicyError(
                    f"GROUP BY {expression.sql(dialect='duckdb')}: the database cannot compute "
                    f"every key over the bounds {list(interval)}; use a smaller multiplier"
                ) from None
            domains[name] = tuple(int(v) for v in frame["__value"])
        return domains

    def _calendar_domain(
        self, shape: QueryShape, table: TablePolicy, key: calendar.CalendarKey
    ) -> tuple[int | str, ...]:
        """The keys of a calendar GROUP BY key over its column's declared bounds, converted
        and enumerated by the database (``dpsql.engine.calendars``)."""
        bounds = table.column(key.column).calendar_bounds
        if bounds is None:
            raise PolicyError(
                f"GROUP BY {key.text} needs the bounds of {key.column!r}: set "
                f"[tables.{shape.table}.columns.{key.column}] bounds = "
                '["YYYY-MM-DD", "YYYY-MM-DD"]'
            )
        type_name = shape.types[key.column]
        spelled = calendar_bounds(self, shape.table, key.column, type_name, bounds)
        return calendar_domain(self, key, spelled, type_name)

    def check_types(self, shape: QueryShape, table: TablePolicy) -> None:
        """Have the database bind every expression of ``shape`` as it will run them, over no
        rows (``WHERE false``): a type error is a refusal now, never a failure after the charge.
        """
        runs, _ = with_virtual_bounds(shape, table)  # what the database will run, and nothing else
        columns = [
            f"{run.sql(dialect='duckdb')} AS {_identifier(name)}"
            for name, run in runs.virtual.items()
        ]
        where = f" AND ({shape.where.sql(dialect='duckdb')})" if shape.where is not None else ""
        try:
            source = _identifier(shape.table)
            if shape.relation is not None:
                source = f"({shape.relation.sql}) AS {source}"
            self._run(f"SELECT {', '.join(columns)} FROM {source} WHERE false{where}")
        except Exception:  # binding only: no row was read
            raise UnsupportedQueryError(
                "an expression of the query does not type-check in the database (its operands "
                "have no common type); nothing was charged"
            ) from None

    def _converted(self, where: exp.Expression) -> exp.Expression:
        where = where.copy()
        casts = [c for c in where.find_all(exp.Cast) if isinstance(c.this, exp.Literal)]
        for old, new in zip(casts, self.convert(casts, "literal"), strict=True):
            # Swap the literal inside the cast, not the cast: replacing one item of an IN list
            # re-parents the whole list, which made binding quadratic in the list's length.
            old.set("this", new.this)
        return where

    def _partitioned(
        self, table_name: str, table: TablePolicy, where: exp.Expression
    ) -> tuple[exp.Expression, tuple[str, tuple[str, ...]]]:
        column = table.partition_column
        assert column is not None
        declared = table.column(column).public_keys
        if declared is None:
            raise PolicyError(
                f"partition column {table_name}.{column} needs its values declared: set "
                f"[tables.{table_name}.columns.{column}] public_keys = [...]"
            )
        values = self.keys(table_name, column, declared)
        frame = self._run(domain_probe(where, column, values))
        charged = [values[int(i)] for i in frame.iloc[:, 0]]
        if not charged:
            raise UnsupportedQueryError(
                f"the WHERE clause admits none of the declared values of the partition column "
                f"{column!r}: there is nothing to answer"
            )
        family = f"{table_name}.{column}"
        return restrict(where, column, charged), (family, tuple(v.this.this for v in charged))


def _key_text(key: PublicKey, kind: ColumnKind, type_name: str, column: str) -> str:
    """A declared key as the text to convert; its Python type must fit the column's kind."""
    problem = f"public key {key!r} of column {column!r} does not match its type ({type_name})"
    if isinstance(key, bool):
        if kind is not ColumnKind.BOOLEAN:
            raise PolicyError(problem)
        return "true" if key else "false"
    if isinstance(key, (int, float)):
        if not kind.numeric:
            raise PolicyError(problem)
        if isinstance(key, int):
            return str(key)
        # A float key is its exact binary value for float columns; for exact (DECIMAL) columns
        # it is the shortest decimal that reads back as it, i.e. the number the policy wrote.
        return str(Decimal(key)) if kind is ColumnKind.FLOAT else repr(key)
    if kind is ColumnKind.STRING:
        return key
    if kind in (ColumnKind.DATE, ColumnKind.TIMESTAMP) and temporal_pattern(type_name).fullmatch(
        key
    ):
        return key
    raise PolicyError(problem)


def _type_key(target: exp.DataType) -> object:
    """A key that tells types apart without generating SQL for each literal: the type itself for
    a plain type (``BIGINT``), its SQL for one with parameters (``DECIMAL(18, 3)``)."""
    if any(v for k, v in target.args.items() if k not in ("this", "nested")):
        return target.sql(dialect="duckdb")
    return target.this


_TYPE_SQL: dict[object, str] = {}
"""The SQL of each plain type (a ``DataType.Type``: a handful), written once."""


def _type_sql(key: object, target: exp.DataType) -> str:
    """``target`` as DuckDB SQL; ``key`` is its ``_type_key`` (a type with parameters is its
    SQL already)."""
    if isinstance(key, str):
        return key
    found = _TYPE_SQL.get(key)
    if found is None:
        found = _TYPE_SQL[key] = target.sql(dialect="duckdb")
    return found


def _exact(text: str, spelled: str, widened: object, number: str) -> bool:
    """Whether the backend's value (``spelled``; ``widened`` = as a DOUBLE for float types) is
    exactly the number written as ``text``; ``number`` is "exact" (integers, DECIMAL), "float"
    or "" (not a number: exact once converted, its form was checked by the analyzer with
    ``temporal_pattern``)."""
    if number == "exact":
        return Decimal(text) == Decimal(spelled)
    if number == "float":
        return isinstance(widened, str) and Decimal(text) == Decimal(float(widened))
    return True
