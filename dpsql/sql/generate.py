"""Generate the SQL the database runs: contribution bounding and aggregation, never the user's text.

The query is built from a ``QueryShape`` and explicit bounds, in DuckDB's dialect, and transpiled
with sqlglot to the backend's dialect. Inside the database it:

1. filters rows with the validated WHERE clause and restricts group columns to their public keys;
2. clamps summed values to their declared bounds and rounds them to the noise grid, as integers;
3. aggregates each (privacy unit, group) into one *cell* (hash aggregation, no sort over rows);
4. bounds contributions on the cells: a cell with more than ``max_rows_per_group`` rows is scaled
   down to that many rows' worth (every measure of the cell multiplied by ``kept / rows``); when
   the key domain is larger than ``max_groups_per_unit``, or ``max_rows_per_unit`` could bind, one
   window over each unit's cells in a salted order of (unit, key) keeps its first
   ``max_groups_per_unit`` groups and hands out ``max_rows_per_unit`` rows' worth in that order
   (counts stay exact integers); scaled sums are truncated toward zero;
5. aggregates per group, so only one row per group leaves the database.

Scaling a cell is the expectation of keeping a uniformly random subset of its rows, and it bounds
a unit's contribution exactly as row selection would: at most ``max_rows_per_group`` rows' worth per
group, ``max_groups_per_unit`` groups and ``max_rows_per_unit`` rows' worth in all, each row's
value within its bounds. Every cell depends on its own unit's rows only, so the L1 sensitivity of
the output is ``min(max_groups_per_unit * max_rows_per_group, max_rows_per_unit)`` rows' worth
(``max_rows_per_unit`` without GROUP BY).
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import sqlglot
from sqlglot import exp

from dpsql.memo import Kept
from dpsql.sql.shape import ColumnKind, QueryShape

__all__ = [
    "PROFILE_EDGES",
    "PROFILE_STATISTICS",
    "Bounds",
    "Histogram",
    "Measure",
    "MeasureKind",
    "SaltedSql",
    "bounded_aggregate",
    "clipping_profile",
    "contribution_profile",
    "identifier",
    "private_rows",
    "public_groups",
    "range_counts",
    "ranges_per_group",
    "ranked_cells",
    "scoped",
    "shape_rows",
    "unit_weight",
    "where_sql",
]


class MeasureKind(Enum):
    ROWS = "rows"
    COUNT = "count"
    SUM = "sum"
    UNITS = "units"
    """Units with a row kept in the group (``COUNT(DISTINCT unit)``): 0 or 1 per cell."""


@dataclass(frozen=True)
class Measure:
    """One aggregated column: COUNT(*), COUNT(col), or SUM/COUNT of clamped, gridded values."""

    name: str
    kind: MeasureKind
    column: str | None = None
    clamp: tuple[float, float, float] | None = None


@dataclass(frozen=True)
class Histogram:
    """A histogram of ``column`` clamped to ``[low, high]`` over ``bins`` equal bins (the last
    also holds ``high``), each row weighing ``weight`` units (``dpsql.mechanisms.quantile``)."""

    column: str
    low: float
    high: float
    bins: int
    weight: int


@dataclass(frozen=True)
class Bounds:
    """Contribution bounds applied inside the database."""

    unit: str
    max_groups_per_unit: int
    max_rows_per_group: int
    max_rows_per_unit: int
    partition: str | None = None
    """A column that is a fixed attribute of each unit: rows whose value differs from the unit's
    smallest value in the whole table are dropped, so each unit lies in one partition."""


_EXACT = 2**53
"""Sums are clamped to +-2**53 in the database (a 1-Lipschitz map: sensitivity is unchanged), so
they fit a BIGINT and every value converts to float exactly."""


def _in_dialect(sql: str, dialect: str) -> str:
    """``sql`` (written in DuckDB's dialect) transpiled by sqlglot to ``dialect``."""
    if dialect == "duckdb":
        return sql
    return sqlglot.transpile(sql, read="duckdb", write=dialect)[0]


def identifier(name: str) -> str:
    """``name`` as a quoted DuckDB identifier (what sqlglot writes: inner quotes doubled).

    >>> identifier('we"ird')
    '"we""ird"'
    """
    return '"' + name.replace('"', '""') + '"'


@functools.lru_cache(maxsize=1024)
def _number(value: float) -> str:
    return exp.Literal.number(repr(float(value))).sql(dialect="duckdb")


_PRIME = 2_147_483_647
"""2**31 - 1: every intermediate of the integer arithmetic stays below 2**63, so no backend
overflows."""

_HEX_DIGITS = 7
"""Hex digits of an MD5 read as an integer code: 16**7 = 2**28 values."""


def _integral(kinds: Sequence[ColumnKind]) -> bool:
    return all(kind in (ColumnKind.INTEGER, ColumnKind.BOOLEAN) for kind in kinds)


def _constants(salt: int, purpose: str, count: int) -> tuple[int, ...]:
    """``count`` integers in [1, 2**31 - 1) derived from the salt, one family per purpose
    (the ``i``-th is the same whatever ``count``)."""
    if isinstance(salt, _SaltSlots):
        return tuple(salt.slot(f"{purpose}.{i}") for i in range(count))  # type: ignore[misc]
    digest = hashlib.sha256(f"{int(salt)}|{purpose}".encode()).digest()
    return tuple(
        1 + int.from_bytes(digest[5 * i : 5 * i + 5], "big") % (_PRIME - 1) for i in range(count)
    )


class _SaltSlots:
    """Stands in for the salt while a query's SQL is written once (``SaltedSql.of``). The salt
    enters the text in two places only, ``_constants`` and ``_md5``, which write a slot there
    (the process's random ``_MARKER`` and the slot's name); anything else done with it raises
    (it is no number), so no value computed from it can be written into the text unnoticed."""

    def slot(self, name: str) -> str:
        return f"{_MARKER}:{name}:"


_MARKER = secrets.token_hex(12)
"""Drawn once per process and never written into SQL that runs, so no analyst's literal can
hold it (``SaltedSql.of`` refuses a text holding it outside a slot all the same)."""

_SLOTS = re.compile(re.escape(_MARKER) + r":(\w+)(?:\.(\d+))?:")


@dataclass(frozen=True)
class SaltedSql:
    """Generated SQL whose salt-derived parts are slots: ``fill(salt)`` is the text that
    generating it with ``salt`` writes, for a fraction of the cost (a query asked again writes
    its SQL once, then fills in each call's fresh salt)."""

    text: str
    counts: Mapping[str, int]
    """The constants of each purpose the text holds (the highest index, plus one)."""

    @classmethod
    def of(cls, render: Callable[[int], str]) -> SaltedSql | None:
        """``render`` (SQL from a salt) as a template; None when it does more with the salt
        than ``_constants`` and ``_md5`` do, or the text holds the marker elsewhere."""
        try:
            text = render(_SaltSlots())  # type: ignore[arg-type]
        except TypeError:
            return None
        written = _SLOTS.findall(text)
        if text.count(_MARKER) != len(written):  # the marker outside a slot
            return None
        counts: dict[str, int] = {}
        for name, index in written:
            if index:
                counts[name] = max(counts.get(name, 0), int(index) + 1)
        return cls(text, counts)

    def fill(self, salt: int) -> str:
        """The text generated with ``salt``."""
        salt = int(salt)
        families: dict[str, tuple[int, ...]] = {}

        def value(slot: re.Match[str]) -> str:
            name, index = slot.group(1), slot.group(2)
            if index is None:
                return str(salt)
            if name not in families:
                families[name] = _constants(salt, name, self.counts[name])
            return str(families[name][int(index)])

        return _SLOTS.sub(value, self.text)


def _integer_code(column: str, kind: ColumnKind) -> str:
    """An integer or boolean value as an integer in [0, 2**31 - 1)."""
    if kind is ColumnKind.BOOLEAN:
        return f"CAST({column} AS BIGINT)"
    return f"((CAST({column} % {_PRIME} AS BIGINT) + {_PRIME}) % {_PRIME})"


def _md5(salt: int, purpose: str, columns: Sequence[str]) -> str:
    """The MD5 of the salt, a purpose and the columns' text: the same on every backend."""
    text = " || '|' || ".join(f"CAST({column} AS VARCHAR)" for column in columns)
    written = salt.slot("salt") if isinstance(salt, _SaltSlots) else int(salt)
    return f"MD5('{written}|{purpose}|' || {text})"


def _hex_code(digest: str) -> str:
    """An integer in [0, 16**7) read from the first hex digits of the MD5 text ``digest``,
    digit by digit (engines parse hex differently, or not at all)."""
    digits = " + ".join(
        f"(INSTR('0123456789abcdef', SUBSTR({digest}, {i + 1}, 1)) - 1) * "
        f"{16 ** (_HEX_DIGITS - 1 - i)}"
        for i in range(_HEX_DIGITS)
    )
    return f"({digits})"


def _rounding_offset(unit: str, kind: ColumnKind, salt: int) -> tuple[str | None, str]:
    """``(digest, offset)``: the unit's rounding offset in [0, 1), an SQL expression over the
    row (``__digest``, when not None, is the MD5 to compute once per row first)."""
    if _integral([kind]):
        multiplier, offset, square = _constants(salt, "dither", 3)
        code = f"(({_integer_code(unit, kind)}) * {multiplier} + {offset}) % {_PRIME}"
        return None, f"((({code}) * ({code}) + {square}) % {_PRIME} / {float(_PRIME)!r})"
    return _md5(salt, "dither", [unit]), f"({_hex_code('__digest')} / {float(16**_HEX_DIGITS)!r})"


def rounding_offset(unit: object, salt: int, *, integral: bool) -> float:
    """The offset ``U`` the generated SQL adds before rounding a value of ``unit`` down to the
    grid, computed in Python (a second implementation, for tests and audits).

    >>> 0.0 <= rounding_offset(42, 7, integral=True) < 1.0
    True
    """
    if integral:
        multiplier, offset, square = _constants(salt, "dither", 3)
        code = (int(unit) % _PRIME * multiplier + offset) % _PRIME
        return ((code * code + square) % _PRIME) / _PRIME
    digest = hashlib.md5(f"{int(salt)}|dither|{unit}".encode()).hexdigest()
    return int(digest[:_HEX_DIGITS], 16) / 16**_HEX_DIGITS


def _value(measure: Measure, offset: str) -> str:
    column = identifier(measure.column or "")
    if measure.clamp is None:
        return column
    low, high, grid = measure.clamp
    as_double = f"CAST({column} AS DOUBLE)"
    if measure.kind is MeasureKind.COUNT:
        # Counted, never cast: a value too large for an integer type must not fail the query.
        return f"CASE WHEN {column} IS NULL OR ISNAN({as_double}) THEN NULL ELSE 1 END"
    clamped = f"LEAST(GREATEST({as_double}, {_number(low)}), {_number(high)})"
    # Randomised rounding to the grid: FLOOR(x/g + U) with U uniform in [0, 1) is x/g on average
    # (ROUND would bias heaped values, e.g. every 2,080 half-way between two grid points). It
    # stays in [FLOOR(low/g), CEIL(high/g)], the range the planner's sensitivity counts
    # (max(CEIL(|low|/g), CEIL(|high|/g)) units per row), and U depends on the salt and the
    # row's own unit only, so a unit's contribution still depends on its own rows only. One U per
    # unit and query: each row is unbiased over the salt. Division by a power of two is exact,
    # so every backend computes the same integer. The planner keeps |bounds| / grid <= 2**52,
    # so the value always fits a BIGINT.
    return (
        f"CASE WHEN {column} IS NULL OR ISNAN({as_double}) THEN NULL "
        f"ELSE CAST(FLOOR({clamped} / {_number(grid)} + {offset}) AS BIGINT) END"
    )


def _key_code(keys: Sequence[str], kinds: Sequence[ColumnKind], salt: int) -> str:
    """One integer code in [0, 2**31 - 1) for integer or boolean keys, from the keys alone."""
    multipliers = _constants(salt, "key", len(keys))
    code = _integer_code(keys[0], kinds[0])
    for key, kind, multiplier in zip(keys[1:], kinds[1:], multipliers[1:], strict=True):
        code = f"(({code}) * {multiplier} + {_integer_code(key, kind)}) % {_PRIME}"
    return code


def _salted_order(unit_code: str, key_code: str, salt: int) -> tuple[tuple[str, ...], str]:
    """A salted pseudo-random order of a unit's cells that every backend computes identically.

    ``unit_code`` and ``key_code`` are integers in [0, 2**31 - 1) that depend on the unit's and
    the key's own values and the salt only (never a rank or a count over the data, which would
    make one unit's choice depend on which other units or keys exist). They are mixed modulo
    ``2**31 - 1`` with multipliers from the salt, squaring after the unit and after the key, then
    once more: for one unit, the order of its keys is a degree-4 polynomial of the key code, so
    different persons keep different groups (with ``max_groups_per_unit = 1`` and persons
    spanning 8 groups, each group keeps about 1/8 of them), while which groups one unit keeps
    depends on its own rows only. Engines' own hash functions differ (DuckDB's ``HASH`` is not
    Spark's murmur3 ``HASH``), hence portable integer arithmetic, and MD5 for the codes of other
    types (see ``bounded_aggregate``). Ties are broken by the keys themselves.

    Returns the steps and the order: each step is the next value of a column ``__mix`` computed
    from the previous one (so no expression repeats a longer one), and the order reads the last.

    >>> steps, order = _salted_order("__unit", "__key0", 7)
    >>> len(steps), order.count("__mix")
    (2, 2)
    """
    unit_multiplier, unit_offset, unit_square, key_multiplier, key_square = _constants(
        salt, "order", 5
    )
    final, offset, second, last = _constants(salt, "spread", 4)
    step = f"(({unit_code}) * {unit_multiplier} + {unit_offset}) % {_PRIME}"
    by_unit = f"(({step}) * ({step}) + {unit_square}) % {_PRIME}"
    step = f"(__mix * {key_multiplier} + ({key_code})) % {_PRIME}"
    by_key = f"(({step}) * ({step}) + {key_square}) % {_PRIME}"
    spread = f"(__mix * {final} + {offset}) % {_PRIME}"
    order = f"((({spread}) * ({spread}) + {second}) % {_PRIME} * {last}) % {_PRIME}"
    return (by_unit, by_key), order


def private_rows(
    table: str, unit: str, partition: str | None = None, *, relation: str | None = None
) -> str:
    """The one source every read of private ``table`` goes through: its rows that have a privacy
    unit (``unit IS NOT NULL``) and, with ``partition``, only each unit's rows whose partition
    column holds the unit's smallest value in the whole table (each unit then lies in one
    partition). A row without a unit belongs to no person the noise protects, so no aggregate,
    filter, subquery, key release or stream may read it.

    With ``relation`` (the SQL of a relation over several tables, ``dpsql.sql.relations``), the
    rows are the relation's, named ``table``.

    >>> private_rows("t", "u")
    '(SELECT * FROM "t" WHERE "u" IS NOT NULL) AS "t"'
    """
    name, unit_name = identifier(table), identifier(unit)
    read = name if relation is None else f"({relation})"
    rows = f"(SELECT * FROM {read} WHERE {unit_name} IS NOT NULL) AS {name}"
    if partition is None:
        return rows
    part = identifier(partition)
    return (
        f"{rows} JOIN (SELECT {unit_name} AS __partition_unit, MIN({part}) AS __partition_value "
        f"FROM {rows} GROUP BY {unit_name}) AS __partitions "
        f"ON {unit_name} = __partition_unit AND {part} = __partition_value"
    )


def shape_rows(shape: QueryShape, unit: str, partition: str | None = None) -> str:
    """``private_rows`` of the table (or relation over several tables) ``shape`` reads."""
    relation = shape.relation.sql if shape.relation is not None else None
    return private_rows(shape.table, unit, partition, relation=relation)


_KEPT: Kept[str] = Kept(128)
"""SQL of the WHERE clause and of public key lists: the same objects each time a bound query is
asked again."""


def scoped(where: exp.Expression, table: str, unit: str) -> str:
    """``where`` (DuckDB SQL) with every read of private ``table`` inside it (the subquery of a
    person-level filter ``unit IN (SELECT unit FROM table WHERE ...)``) reading
    ``private_rows(table, unit)`` instead: a subquery never sees a row without a unit (whose NULL
    would make ``NOT IN`` unknown for every row).

    >>> import sqlglot
    >>> w = sqlglot.parse_one('SELECT 1 FROM t WHERE u NOT IN (SELECT u FROM t)').args["where"]
    >>> scoped(w.this, "t", "u")
    'NOT u IN (SELECT u FROM (SELECT * FROM "t" WHERE NOT "u" IS NULL) AS "t")'
    """
    return _KEPT.get((where, table, unit), lambda: _scoped(where, table, unit))


def where_sql(where: exp.Expression) -> str:
    """``where`` as DuckDB SQL (kept for the same object: the plan's summary and its bounded
    SQL write the same WHERE clause)."""
    return _KEPT.get((where,), lambda: where.sql(dialect="duckdb"))


def _scoped(where: exp.Expression, table: str, unit: str) -> str:
    if where.find(exp.From, exp.Table) is None:  # no subquery reads a table: nothing to scope
        return where_sql(where)
    rows = sqlglot.parse_one(f"SELECT * FROM {private_rows(table, unit)}", read="duckdb")
    source = rows.args.get("from_") or rows.args.get("from")
    assert source is not None

    def replace(node: exp.Expression) -> exp.Expression:
        # A FROM names the table as a Table node, or as a bare identifier when built by hand.
        named = node.this if isinstance(node, exp.From) else None
        if isinstance(named, exp.Identifier) and named.name == table:
            return exp.From(this=source.this.copy())
        if isinstance(node, exp.Table) and node.name == table and not node.args.get("db"):
            replacement = source.this.copy()
            if node.alias:
                replacement.set("alias", exp.TableAlias(this=exp.to_identifier(node.alias)))
            return replacement
        return node

    return where.copy().transform(replace).sql(dialect="duckdb")


def _key_list(keys: Sequence[exp.Expression]) -> str:
    """Public keys as a list of SQL literals (kept for the same key objects)."""
    return _KEPT.get((keys,), lambda: ", ".join(v.sql(dialect="duckdb") for v in keys))


def bounded_aggregate(
    shape: QueryShape,
    *,
    measures: Sequence[Measure],
    bounds: Bounds,
    public_keys: Mapping[str, Sequence[exp.Expression]],
    salt: int,
    dialect: str = "duckdb",
    weights: Sequence[int] | None = None,
    histogram: Histogram | None = None,
    cells_table: str | None = None,
    rank_every_unit: bool = False,
) -> str:
    """SQL returning one row per non-empty group: the group columns, then one column per measure.

    With ``weights`` (``w_1..w_K``, a GROUP BY over a column without public keys), a last column
    ``weight`` sums, per key, the weight ``w_n`` each unit gives each of its first ``n = min(its
    keys, K)`` keys in the salted order (``dpsql.mechanisms.weighted_selection``).

    With ``histogram`` (and no measures) it returns one row per non-empty (group, bin): the group
    columns, ``__bin`` and ``m0``, the bin's bounded weight. Each (unit, group) cell keeps the
    same rows' worth as for COUNT(*) (``kept``); its rows in a bin weigh
    ``FLOOR(rows_in_bin * weight * kept / rows)`` (integer arithmetic), so the unit's weights in
    the group sum to at most ``weight * kept``.

    Group columns in ``public_keys`` are restricted to those keys and returned as the database
    prints them (``CAST(key AS VARCHAR)``), so answers are matched to keys in its own semantics;
    the others are restricted to non-NULL values (their keys are released by a thresholding
    mechanism, not listed in advance).

    With ``cells_table`` (a table holding what :func:`ranked_cells` selects for the same
    arguments and salt), the same aggregation reads the ranked cells from that table instead of
    computing them: the same rows, so the same result.

    Only units over a contribution bound are put in their salted order (``_ranking``);
    ``rank_every_unit`` ranks every unit as the engine once did (the same result, slower: kept
    for the property test and the benchmark that compare the two).
    """
    chain = _chain(shape, measures, bounds, public_keys, salt, weights, histogram, rank_every_unit)
    ctes, previous, kept, keys = chain.ctes, chain.previous, chain.kept, chain.keys
    cells_of = chain.cells_of
    if cells_table is not None:
        assert chain.ranked and histogram is None, "only ranked cells are materialised"
        ctes = []
        previous = f"{identifier(cells_table)} WHERE __group_rank <= {int(chain.cut)}"
    if histogram is not None:
        sql = _histogram(shape, histogram, ctes, previous, kept, keys, public_keys)
        return _in_dialect(sql, dialect)
    aggregates = []
    for i, measure in enumerate(measures):
        # Multiply before dividing: a cell that keeps all its rows is reproduced exactly.
        # COUNT(*) is the rows' worth kept itself.
        scaled = f"{cells_of[i]} * {kept} / __rows" if i in cells_of else kept
        if measure.kind is MeasureKind.UNITS:
            scaled = f"CASE WHEN {kept} > 0 THEN 1.0 ELSE 0.0 END"
        # A cell is clamped to +-2**53 before the cast, so no data overflows a BIGINT; clamping
        # only shrinks what a unit adds, so the sensitivity holds.
        cell = f"LEAST(GREATEST(TRUNC({scaled}), -{_EXACT}.0), {_EXACT}.0)"
        total = f"SUM(CAST({cell} AS BIGINT))"
        aggregates.append(
            f"CAST(LEAST(GREATEST(COALESCE({total}, 0), -{_EXACT}), {_EXACT}) AS BIGINT) "
            f"AS {identifier(measure.name)}"
        )
    if weights:
        assert chain.ranked, "weights need the per-unit ranking"
        share = unit_weight(f"LEAST(__unit_keys, {len(weights)})", weights)
        aggregates.append(
            f"CAST(SUM(CASE WHEN __group_rank <= {len(weights)} THEN {share} ELSE 0 END) "
            f"AS BIGINT) AS {identifier('weight')}"
        )
    outputs = [
        f"{f'CAST({k} AS VARCHAR)' if c in public_keys else k} AS {identifier(c)}"
        for c, k in zip(shape.group_by, keys, strict=True)
    ]
    group = f" GROUP BY {', '.join(keys)}" if keys else ""
    with_ctes = f"WITH {', '.join(ctes)} " if ctes else ""
    sql = f"{with_ctes}SELECT {', '.join(outputs + aggregates)} FROM {previous}{group}"
    return _in_dialect(sql, dialect)


def ranked_cells(
    shape: QueryShape,
    *,
    measures: Sequence[Measure],
    bounds: Bounds,
    public_keys: Mapping[str, Sequence[exp.Expression]],
    salt: int,
    weights: Sequence[int],
    dialect: str = "duckdb",
    rank_every_unit: bool = False,
) -> str:
    """SQL selecting every (unit, group) cell of :func:`bounded_aggregate` (same arguments, same
    salt) before the cut to ``max_groups_per_unit``: ``__unit``, the group columns
    ``__key0..``, ``__rows``, the cells' measures, the cell's place in its unit's salted order
    ``__group_rank`` (1, 2, ...), the unit's number of cells ``__unit_keys`` and, when the
    per-unit row bound can bind, ``__rows_through``. Materialised once, it serves
    ``bounded_aggregate(..., cells_table=...)`` and the adaptive selection's round 2
    (``dpsql.sql.exclusion.second_round_weights``) without reading the rows again."""
    chain = _chain(shape, measures, bounds, public_keys, salt, weights, None, rank_every_unit)
    assert chain.ranked and weights, "only a ranked aggregation with weights has ranked cells"
    return _in_dialect(f"WITH {', '.join(chain.ctes)} SELECT * FROM ranked", dialect)


def unit_weight(count: str, weights: Sequence[int]) -> str:
    """SQL for ``w_n`` (``weights[n - 1]``) where ``count`` is the SQL of ``n`` in 1..K."""
    table = " ".join(f"WHEN {n} THEN {int(w)}" for n, w in enumerate(weights, start=1))
    return f"CASE {count} {table} END"


@dataclass(frozen=True)
class _Chain:
    """The common steps of a bounded aggregation: CTEs, the relation of kept cells
    (``previous``), the rows' worth a cell keeps (``kept``), the group and cell columns."""

    ctes: list[str]
    previous: str
    kept: str
    keys: list[str]
    cells_of: dict[int, str]
    ranked: bool
    cut: int


def _group_value(shape: QueryShape, column: str) -> str:
    """A group column as the aggregation reads it. A float's zero is read as +0: -0.0 and 0.0 are
    one value in the database's equality (one group) but print differently, and a group prints
    as whichever of its rows came first, so one person's -0.0 could move the group away from
    its declared key's spelling."""
    name = identifier(column)
    if shape.columns.get(column) is not ColumnKind.FLOAT or column not in shape.types:
        return name
    return f"(CASE WHEN {name} = 0 THEN CAST(0 AS {shape.types[column]}) ELSE {name} END)"


def _chain(
    shape: QueryShape,
    measures: Sequence[Measure],
    bounds: Bounds,
    public_keys: Mapping[str, Sequence[exp.Expression]],
    salt: int,
    weights: Sequence[int] | None,
    histogram: Histogram | None,
    rank_every_unit: bool = False,
) -> _Chain:
    keys = [f"__key{i}" for i in range(len(shape.group_by))]
    select = [f"{identifier(bounds.unit)} AS __unit"]
    select += [
        f"{_group_value(shape, c)} AS {k}" for c, k in zip(shape.group_by, keys, strict=True)
    ]
    digest, offset = _rounding_offset(
        identifier(bounds.unit), shape.columns[bounds.unit], salt
    )
    select += [
        f"{_value(m, offset)} AS __value{i}"
        for i, m in enumerate(measures)
        if m.kind not in (MeasureKind.ROWS, MeasureKind.UNITS)
    ]
    # A row without a privacy unit cannot be bounded per person: the source leaves it out.
    conditions = []
    if shape.where is not None:
        conditions.append(f"({scoped(shape.where, shape.table, bounds.unit)})")
    for column in shape.group_by:
        if column in public_keys:
            conditions.append(f"{identifier(column)} IN ({_key_list(public_keys[column])})")
        else:
            conditions.append(f"{identifier(column)} IS NOT NULL")
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    source = shape_rows(shape, bounds.unit, bounds.partition)
    if shape.virtual:
        # Expressions inside aggregates, as columns (dpsql.sql.expressions); a person-level
        # subquery in a CASE, FILTER or grouping condition reads private rows too.
        virtual = ", ".join(
            f"{scoped(e, shape.table, bounds.unit)} AS {identifier(n)}"
            for n, e in shape.virtual.items()
        )
        source = f"(SELECT *, {virtual} FROM {source}) AS __virtual"
    if digest is not None and any(m.kind is MeasureKind.SUM for m in measures):
        # The rounding offset's MD5 once per row, read digit by digit by the values.
        source = f"(SELECT *, {digest} AS __digest FROM {source}{where}) AS __rows"
        where = ""
    if histogram is not None:
        select.append(f"{_bin(histogram)} AS __bin")
    ctes = [f"source AS (SELECT {', '.join(select)} FROM {source}{where})"]

    # One cell per (unit, group): what the unit's rows add to the group, before bounding.
    # COUNT(*) is the cell's own row count (__rows): no column of its own.
    cells_of: dict[int, str] = {}
    cell_measures = []
    for i, measure in enumerate(measures):
        if measure.kind in (MeasureKind.ROWS, MeasureKind.UNITS):
            continue
        if measure.kind is MeasureKind.COUNT:
            aggregate = f"COUNT(__value{i})"
        else:
            aggregate = f"COALESCE(SUM(__value{i}), 0)"
        cells_of[i] = f"__cell{i}"
        cell_measures.append(f"CAST({aggregate} AS DOUBLE) AS {cells_of[i]}")
    unit_and_keys = ", ".join(["__unit", *keys])
    cell_columns = ", ".join([unit_and_keys, "CAST(COUNT(*) AS DOUBLE) AS __rows", *cell_measures])
    ctes.append(f"cells AS (SELECT {cell_columns} FROM source GROUP BY {unit_and_keys})")
    previous = "cells"
    # Rows' worth a cell keeps under the per-group bound (per-unit bound without GROUP BY).
    per_group = bounds.max_rows_per_group if keys else bounds.max_rows_per_unit
    kept = f"LEAST(__rows, {int(per_group)}.0)"
    # A column without public keys has an unknown domain: always rank.
    domain = math.prod(len(public_keys.get(c, range(2**62))) for c in shape.group_by) if keys else 1
    rank_groups = bool(keys) and domain > bounds.max_groups_per_unit
    cap_unit = bool(keys) and (
        bounds.max_rows_per_unit < min(domain, bounds.max_groups_per_unit) * per_group
    )
    if rank_groups or cap_unit:
        _ranking(
            shape, bounds, salt, keys, cells_of, ctes, kept,
            weights=bool(weights), cap_unit=cap_unit, every_unit=rank_every_unit,
        )  # fmt: skip
        previous = f"ranked WHERE __group_rank <= {int(bounds.max_groups_per_unit)}"
        if cap_unit:
            before = f"(__rows_through - {kept})"
            kept = f"GREATEST(0.0, LEAST({kept}, {int(bounds.max_rows_per_unit)}.0 - {before}))"
    return _Chain(
        ctes,
        previous,
        kept,
        keys,
        cells_of,
        rank_groups or cap_unit,
        int(bounds.max_groups_per_unit),
    )


def _ranking(
    shape: QueryShape,
    bounds: Bounds,
    salt: int,
    keys: list[str],
    cells_of: dict[int, str],
    ctes: list[str],
    kept: str,
    *,
    weights: bool,
    cap_unit: bool,
    every_unit: bool,
) -> None:
    """Append the CTEs ending in ``ranked``: every cell with its place ``__group_rank`` in its
    unit's salted order of (unit, key), with ``weights`` its unit's number of cells
    ``__unit_keys`` and, when the per-unit row bound can bind, ``__rows_through`` (its unit's
    rows' worth up to and including it, in that order).

    Only units over a bound are ranked: a unit with at most ``max_groups_per_unit`` cells (and,
    when it can bind, at most ``max_rows_per_unit`` rows' worth in them) keeps every cell
    whatever their order, so its cells get place 1 and ``__rows_through`` equal to their own
    rows' worth (nothing before them is cut), which selects exactly what ranking them would:
    the same kept cells, weights and rows' worth (a property test checks it against
    ``every_unit``, which ranks every unit as before). Whether a unit is over a bound depends on
    its own cells only. The salted order (and the MD5 codes of text keys and units) is then
    computed for the cells of units over a bound only, which one aggregation per unit finds
    (joined back to every cell when the weights need each unit's number of cells; else only
    the units over a bound, usually few, are looked up). A window count per unit instead of
    that aggregation was slower than ranking every unit (docs/partition_selection.md).
    """
    key_list = ", ".join(keys)
    unit_kind = shape.columns[bounds.unit]
    key_kinds = [shape.columns[c] for c in shape.group_by]
    # The window carries only what the final aggregation reads (the sort moves every column).
    carried = ["__unit", *keys, "__rows", *cells_of.values()]
    bound = f"COUNT(*) > {int(bounds.max_groups_per_unit)}"
    if cap_unit:
        bound += f" OR SUM({kept}) > {int(bounds.max_rows_per_unit)}.0"
    ordered, within = "cells", ""
    if every_unit:
        pass
    elif weights:
        # Every unit's number of cells (its weights), from one aggregation joined back. The
        # units over a bound (usually few) are joined apart: DuckDB materializes a CTE read
        # twice, and reading ``sized`` (every cell with its unit's size) twice wrote it out
        # whole; read once it streams, and only ``sizes`` (a row per unit) is read twice (the
        # default key release's SQL 17% faster at 10M rows, docs/development.md).
        ctes.append(
            f"sizes AS (SELECT __unit AS __sized, COUNT(*) AS __unit_keys, ({bound}) AS __over "
            "FROM cells GROUP BY __unit)"
        )
        ctes.append("sized AS (SELECT * FROM cells JOIN sizes ON __unit = __sized)")
        ctes.append(
            f"over AS (SELECT {', '.join(carried)}, __unit_keys FROM cells JOIN "
            "(SELECT * FROM sizes WHERE __over) AS __units_over ON __unit = __sized)"
        )
        carried.append("__unit_keys")
        ordered, within = "over", "sized WHERE NOT __over"
    else:
        # Only the units over a bound (usually few): the rest are kept whole.
        ctes.append(f"over_units AS (SELECT __unit FROM cells GROUP BY __unit HAVING {bound})")
        units_over = "__unit IN (SELECT __unit FROM over_units)"
        ctes.append(f"over AS (SELECT {', '.join(carried)} FROM cells WHERE {units_over})")
        ordered, within = "over", f"cells WHERE NOT ({units_over})"
    if _integral(key_kinds):
        key_code = _key_code(keys, key_kinds, salt)
    else:
        # MD5 once per distinct key, read as an integer code (of the key alone), joined on.
        digests = f"SELECT {key_list}, {_md5(salt, 'key', keys)} AS __keydigest FROM "
        ctes.append(
            f"key_codes AS (SELECT {key_list}, {_hex_code('__keydigest')} AS __keycode "
            f"FROM ({digests}(SELECT DISTINCT {key_list} FROM {ordered}) AS __keys) "
            "AS __digests)"
        )
        on = " AND ".join(f"{ordered}.{k} = key_codes.{k}" for k in keys)
        ctes.append(
            f"coded AS (SELECT {ordered}.*, key_codes.__keycode FROM {ordered} "
            f"JOIN key_codes ON {on})"
        )
        carried.append("__keycode")
        key_code, ordered = "__keycode", "coded"
    if _integral([unit_kind]):
        unit_code = _integer_code("__unit", unit_kind)
    else:
        ctes.append(
            f"digested AS (SELECT {', '.join(carried)}, "
            f"{_md5(salt, 'unit', ['__unit'])} AS __unitdigest FROM {ordered})"
        )
        carried.append("__unitdigest")
        unit_code, ordered = _hex_code("__unitdigest"), "digested"
    steps, order = _salted_order(unit_code, key_code, salt)
    for index, step in enumerate(steps):
        ctes.append(
            f"mixed{index} AS (SELECT {', '.join(carried)}, {step} AS __mix FROM {ordered})"
        )
        ordered = f"mixed{index}"
    # The order as a column of its own: sorting on a column, not on an expression inside the
    # window, made DuckDB's ranking 10-15% faster at 10M cells (docs/partition_selection.md).
    ctes.append(f"salted AS (SELECT {', '.join(carried)}, {order} AS __order FROM {ordered})")
    order_by = f"PARTITION BY __unit ORDER BY __order, {key_list}"
    columns = ", ".join(["__unit", *keys, "__rows", *cells_of.values()])
    ranks = [f"ROW_NUMBER() OVER ({order_by}) AS __group_rank"]
    whole = ["1 AS __group_rank"]
    if weights:
        ranks.append(
            "COUNT(*) OVER (PARTITION BY __unit) AS __unit_keys" if every_unit else "__unit_keys"
        )
        whole.append("__unit_keys")
    if cap_unit:
        ranks.append(
            f"SUM({kept}) OVER ({order_by} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) "
            "AS __rows_through"
        )
        whole.append(f"{kept} AS __rows_through")
    ranked = f"SELECT {columns}, {', '.join(ranks)} FROM salted"
    if within:
        ranked += f" UNION ALL SELECT {columns}, {', '.join(whole)} FROM {within}"
    ctes.append(f"ranked AS ({ranked})")


def _bin(histogram: Histogram) -> str:
    """The bin of a row's clamped value (NULL for NULL or NaN)."""
    column = identifier(histogram.column)
    value = f"CAST({column} AS DOUBLE)"
    low, high = _number(histogram.low), _number(histogram.high)
    clamped = f"LEAST(GREATEST({value}, {low}), {high})"
    step = _number((histogram.high - histogram.low) / histogram.bins)
    index = f"CAST(FLOOR(({clamped} - {low}) / {step}) AS BIGINT)"
    return (
        f"CASE WHEN {column} IS NULL OR ISNAN({value}) THEN NULL "
        f"ELSE LEAST(GREATEST({index}, 0), {int(histogram.bins) - 1}) END"
    )


def _histogram(
    shape: QueryShape,
    histogram: Histogram,
    ctes: list[str],
    previous: str,
    kept: str,
    keys: list[str],
    public_keys: Mapping[str, Sequence[exp.Expression]],
) -> str:
    """The end of ``bounded_aggregate`` for a histogram: the kept rows' worth of each cell, the
    rows per (unit, group, bin), and their weights summed per (group, bin)."""
    unit_and_keys = ", ".join(["__unit", *keys])
    ctes.append(
        f"shares AS (SELECT {unit_and_keys}, CAST(__rows AS BIGINT) AS __rows, "
        f"CAST({kept} AS BIGINT) AS __kept FROM {previous})"
    )
    ctes.append(
        f"binned AS (SELECT {unit_and_keys}, __bin, COUNT(*) AS __n FROM source "
        f"WHERE __bin IS NOT NULL GROUP BY {unit_and_keys}, __bin)"
    )
    on = " AND ".join(f"b.{k} = s.{k}" for k in ["__unit", *keys])
    # n is capped at 2**31 and weight * kept <= 2**31 (the planner's check): no BIGINT overflows,
    # and a smaller n only lowers the cell's weights, whose sum stays <= weight * kept.
    weight = f"(LEAST(b.__n, {2**31}) * {int(histogram.weight)} * s.__kept) // s.__rows"
    outputs = [
        f"{f'CAST(b.{k} AS VARCHAR)' if c in public_keys else f'b.{k}'} AS {identifier(c)}"
        for c, k in zip(shape.group_by, keys, strict=True)
    ]
    group = ", ".join([*(f"b.{k}" for k in keys), "b.__bin"])
    return (
        f"WITH {', '.join(ctes)} SELECT {', '.join([*outputs, 'b.__bin AS __bin'])}, "
        f"CAST(SUM({weight}) AS BIGINT) AS {identifier('m0')} "
        f"FROM binned b JOIN shares s ON {on} GROUP BY {group}"
    )


def range_counts(
    shape: QueryShape,
    *,
    unit: str,
    max_rows_per_unit: int,
    dialect: str = "duckdb",
) -> str:
    """SQL returning, per group of the public range table, the rounded-down weight of the rows in
    the group's ranges; each row of a unit with n rows weighs ``min(1, max_rows_per_unit / n)``.

    A unit's rows weigh at most ``max_rows_per_unit`` in all, so every range count moves by at
    most that much between neighbouring datasets (rounding down keeps this, the bound being an
    integer), and only upwards when a unit is added (monotone), as the sparse vector technique
    assumes. Weights are summed per distinct value before the range join, so the join touches
    distinct values, not rows. Duplicate rows of the public table count once (``DISTINCT``); the
    session has checked that each group holds one range (``ranges_per_group``). Groups with no
    rows are absent."""
    join = shape.range_join
    assert join is not None
    keys = [f"__key{i}" for i in range(len(shape.group_by))]
    conditions = [f"{identifier(join.value)} IS NOT NULL"]
    if shape.where is not None:
        conditions.append(f"({scoped(shape.where, shape.table, unit)})")
    source = (
        f"SELECT {identifier(unit)} AS __unit, {identifier(join.value)} AS __value "
        f"FROM {shape_rows(shape, unit)} WHERE {' AND '.join(conditions)}"
    )
    ranges = ", ".join(
        [f"{identifier(join.low)} AS __low", f"{identifier(join.high)} AS __high"]
        + [f"{identifier(c)} AS {k}" for c, k in zip(shape.group_by, keys, strict=True)]
    )
    key_list = ", ".join(f"r.{k}" for k in keys)
    outputs = ", ".join(
        f"{k} AS {identifier(c)}" for c, k in zip(shape.group_by, keys, strict=True)
    )
    sql = (
        f"WITH source AS ({source}), "
        "units AS (SELECT __unit, COUNT(*) AS __rows FROM source GROUP BY __unit), "
        f"weights AS (SELECT s.__value, SUM(LEAST(1.0, {int(max_rows_per_unit)}.0 / u.__rows)) "
        "AS __weight FROM source s JOIN units u ON s.__unit = u.__unit GROUP BY s.__value), "
        f"ranges AS (SELECT DISTINCT {ranges} FROM {identifier(join.table)}), "
        f"per_range AS (SELECT {key_list}, SUM(w.__weight) AS __total FROM weights w "
        f"JOIN ranges r ON w.__value BETWEEN r.__low AND r.__high GROUP BY {key_list}) "
        f"SELECT {outputs}, CAST(FLOOR(__total + 1e-9) AS BIGINT) AS {identifier('m0')} "
        "FROM per_range"
    )
    return _in_dialect(sql, dialect)


def ranges_per_group(shape: QueryShape, dialect: str = "duckdb") -> str:
    """SQL returning the largest number of distinct (low, high) ranges in one GROUP BY group of
    the public range table (it reads only the public table)."""
    join = shape.range_join
    assert join is not None
    columns = ", ".join(identifier(c) for c in shape.group_by)
    pair = f"{identifier(join.low)}, {identifier(join.high)}"
    sql = (
        f"SELECT COALESCE(MAX(__n), 0) FROM (SELECT COUNT(*) AS __n FROM (SELECT DISTINCT "
        f"{columns}, {pair} FROM {identifier(join.table)}) AS __ranges GROUP BY {columns}) "
        "AS __groups"
    )
    return _in_dialect(sql, dialect)


def public_groups(shape: QueryShape, dialect: str = "duckdb") -> str:
    """SQL listing the distinct groups of the public range table, in a fixed order."""
    join = shape.range_join
    assert join is not None
    columns = ", ".join(identifier(c) for c in shape.group_by)
    sql = f"SELECT DISTINCT {columns} FROM {identifier(join.table)} ORDER BY {columns}"
    return _in_dialect(sql, dialect)


def clipping_profile(
    shape: QueryShape,
    *,
    column: str,
    unit: str,
    max_rows_per_unit: int,
    exponents: Sequence[int],
    nonnegative: bool,
    partition: str | None = None,
    dialect: str = "duckdb",
) -> str:
    """SQL returning one row with ``q_b`` for each exponent b: the sum over units of
    ``min(sum over the unit's rows of clamp(x / 2**b - 1, 0, 1), max_rows_per_unit)``, where x is
    the value (``|value|``, or ``max(value, 0)`` when ``nonnegative``). ``q_b`` is about the number
    of rows above 2**b, moves by at most ``max_rows_per_unit`` between neighbours, only upwards
    when a unit is added (monotone), and falls to 0 once 2**b bounds every value. With
    ``partition``, the rows are those the aggregate reads: each unit's rows in its one partition
    (and the WHERE clause restricts to the charged values), so the profile of a query charged to
    some partition values depends only on the people with those values."""
    value = f"CAST({identifier(column)} AS DOUBLE)"
    magnitude = f"GREATEST({value}, 0.0)" if nonnegative else f"ABS({value})"
    conditions = [f"{identifier(column)} IS NOT NULL", f"NOT ISNAN({value})"]
    if shape.where is not None:
        conditions.append(f"({scoped(shape.where, shape.table, unit)})")
    steps = ", ".join(
        f"SUM(LEAST(GREATEST(__x / {_number(2.0**b)} - 1.0, 0.0), 1.0)) AS __q{i}"
        for i, b in enumerate(exponents)
    )
    totals = ", ".join(
        f"COALESCE(SUM(LEAST(__q{i}, {int(max_rows_per_unit)}.0)), 0.0) AS q{i}"
        for i in range(len(exponents))
    )
    sql = (
        f"WITH source AS (SELECT {identifier(unit)} AS __unit, {magnitude} AS __x "
        f"FROM {shape_rows(shape, unit, partition)} "
        f"WHERE {' AND '.join(conditions)}), "
        f"per_unit AS (SELECT __unit, {steps} FROM source GROUP BY __unit) "
        f"SELECT {totals} FROM per_unit"
    )
    return _in_dialect(sql, dialect)


PROFILE_EDGES = tuple(2**b for b in range(31))
"""Bins of a person's contribution profile: ``[1, 1], (1, 2], (2, 4], ..., (2**29, 2**30]`` and
``> 2**30``; each person falls in exactly one bin of each statistic."""

PROFILE_STATISTICS = ("rows_per_unit", "groups_per_unit", "rows_per_group")
"""Per person: rows in all, distinct groups, and rows in their largest group."""


def contribution_profile(
    table: str,
    *,
    bounds: Bounds,
    group_by: Sequence[str],
    dialect: str = "duckdb",
) -> str:
    """SQL returning one row: ``persons``; per statistic, ``over_<statistic>`` (persons above the
    policy's bound) and ``<statistic>_<i>`` (persons in bin i of ``PROFILE_EDGES``). Every column
    counts each person at most once, so each moves by at most 1 between neighbours. The rows are
    those a bounded aggregate reads (each unit in its one partition); GROUP BY keys, NULL
    included, are the groups."""
    unit = identifier(bounds.unit)
    keys = [f"{identifier(c)} AS __key{i}" for i, c in enumerate(group_by)]
    key_list = ", ".join(["__unit", *(f"__key{i}" for i in range(len(group_by)))])
    source = ", ".join([f"{unit} AS __unit", *keys])
    limits = {
        "rows_per_unit": bounds.max_rows_per_unit,
        "groups_per_unit": bounds.max_groups_per_unit,
        "rows_per_group": bounds.max_rows_per_group,
    }
    counted = ["COUNT(*) AS persons"]
    for statistic in PROFILE_STATISTICS:
        counted.append(
            f"SUM(CASE WHEN __{statistic} > {int(limits[statistic])} THEN 1 ELSE 0 END) "
            f"AS over_{statistic}"
        )
        low = 0
        for index, edge in enumerate((*PROFILE_EDGES, None)):
            inside = f"__{statistic} > {low}"
            if edge is not None:
                inside += f" AND __{statistic} <= {edge}"
            counted.append(f"SUM(CASE WHEN {inside} THEN 1 ELSE 0 END) AS {statistic}_{index}")
            low = edge or low
    sql = (
        f"WITH source AS (SELECT {source} "
        f"FROM {private_rows(table, bounds.unit, bounds.partition)}), "
        f"cells AS (SELECT __unit, COUNT(*) AS __rows FROM source GROUP BY {key_list}), "
        "units AS (SELECT __unit, SUM(__rows) AS __rows_per_unit, COUNT(*) AS __groups_per_unit, "
        "MAX(__rows) AS __rows_per_group FROM cells GROUP BY __unit) "
        f"SELECT {', '.join(counted)} FROM units"
    )
    return _in_dialect(sql, dialect)
