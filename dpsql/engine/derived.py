"""Run the post-processing of a released answer and say which values it derived.

The outer query (``dpsql.sql.postprocess``) runs in a sandboxed in-memory DuckDB that holds one
table, the released answer, and can read no file: it never sees a row of the data, so its output
is differentially private with the release's own guarantee and costs nothing more.

Intervals: a column that copies a released aggregate keeps its interval; a column computed from
released aggregates (a monotone function of one, a ratio, a difference, a window over the
released rows) gets one derived from the noise laws of the values it reads
(``dpsql.engine.derived_intervals``), at the answer's confidence, and ``details["intervals"]``
says whether it is exact, conservative or approximate. Its ends are computed in the same sandboxed
query as its values. A column none of that bounds has no interval, and its ``measures`` entry and
``details["intervals"]`` say why. A column that is exactly a two-column moment (CORR, COVAR_*,
REGR_*) gets the conservative interval of ``dpsql.engine.moments`` from its components', named in
``details["post_processing"]["moments"]``.

Post-processing is bounded: it runs within the request's time limit (``dpsql.deadline``
interrupts the sandbox), under the sandbox's memory limit, with the functions
``dpsql.sql.postprocess`` allows, and returns at most as many rows as were released.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import pandas as pd
import sqlglot
from sqlglot import exp

from dpsql import deadline
from dpsql.engine.derived_intervals import (
    IntervalPlan,
    component_ends,
    parse_outer,
    plan_intervals,
)
from dpsql.engine.moments import component_laws, moment_answers
from dpsql.engine.results import QueryResult
from dpsql.sql.postprocess import RELEASED, ROW, PostProcess, create_released, sandbox

if TYPE_CHECKING:
    from dpsql.engine.planner import QueryPlan

__all__ = ["post_processed"]


def _released(result: QueryResult, post: PostProcess) -> pd.DataFrame:
    """The released rows as a frame in ``post``'s column order (with the row number)."""
    frame = pd.DataFrame(result.rows, columns=result.columns, dtype=object)
    frame = frame[list(post.types)]
    frame[ROW] = np.arange(len(frame), dtype=np.int64)
    return frame


def _run(
    post: PostProcess, frame: pd.DataFrame, sql: str, extra: tuple[str, ...] = ()
) -> tuple[list[str], list[tuple]]:
    """``sql`` over the released rows in the sandbox, within the request's time limit; at most
    as many rows as were released (one for an aggregate over none), or ``ValueError``. The
    released table has the columns ``extra`` (DOUBLE) after its own."""
    connection = sandbox()
    most = max(len(frame), 1)
    try:
        with deadline.watching(connection):
            create_released(connection, post)
            for name in extra:
                connection.execute(f"ALTER TABLE {RELEASED} ADD COLUMN {_quoted(name)} DOUBLE")
            connection.register("frame_in", frame)
            connection.execute(f"INSERT INTO {RELEASED} SELECT * FROM frame_in")
            connection.unregister("frame_in")
            cursor = connection.execute(sql)
            names = [d[0] for d in cursor.description]
            rows = [tuple(_json_value(v) for v in row) for row in cursor.fetchmany(most + 1)]
    finally:
        connection.close()
    if len(rows) > most:
        raise ValueError(f"post-processing returned more than the {most} released rows")
    return names, rows


def _quoted(name: str) -> str:
    return exp.to_identifier(name, quoted=True).sql(dialect="duckdb")


def _json_value(value: Any) -> Any:
    """A value DuckDB returned as one the result (and its stored copy, JSON) can hold: DECIMAL
    as a float, dates and times as ISO text (a midnight timestamp as its date, as released keys
    are shown), anything else that is not a JSON scalar as text; so no type a post-processing
    query produces can fail after the charge.

    >>> _json_value(decimal.Decimal("1.50")), _json_value(dt.datetime(2024, 1, 2))
    (1.5, '2024-01-02')
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, dt.datetime) and value.time() == dt.time() and value.tzinfo is None:
        return value.date().isoformat()
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    return str(value)


def _with_ends(outer: exp.Select, plan: IntervalPlan) -> str:
    """The outer query with the two ends of every planned interval as extra items before the
    row number, in one query: the ends' stages (``ColumnInterval.stages``, one ``SELECT *, ...``
    per depth) run over the same rows as the outer query's FROM (the released rows HAVING
    keeps), so a window sees the same rows as the value's."""
    extended = outer.copy()
    stages = sorted({stage for column in plan.columns for stage in column.stages})
    if stages:
        source = extended.args.get("from_") or extended.args.get("from")
        # FROM released, or FROM (SELECT * FROM released WHERE <HAVING>) AS released
        inner = source.this.this if isinstance(source.this, exp.Subquery) else None
        text = f"SELECT * FROM {RELEASED}" if inner is None else inner.sql(dialect="duckdb")
        for depth in sorted({d for d, _, _ in stages}):
            items = ", ".join(f"{sql} AS {_quoted(n)}" for d, n, sql in stages if d == depth)
            text = f"SELECT *, {items} FROM ({text}) AS {RELEASED}"
        source.set("this", sqlglot.parse_one(f"({text}) AS {RELEASED}", dialect="duckdb"))
    items = list(extended.expressions)
    ends = [
        sqlglot.parse_one(text, dialect="duckdb")
        for column in plan.columns
        if column.ends is not None
        for text in column.ends
    ]
    extended.set("expressions", items[:-1] + ends + items[-1:])
    return extended.sql(dialect="duckdb")


def _interval(value: Any, low: Any, high: Any) -> tuple[Any, Any]:
    """``(low, high)`` for ``value`` (no interval for a NULL value; a missing end is
    unbounded); the released value always lies inside, so the interval is widened to it if a
    rounding of its ends left it out."""
    if value is None or not isinstance(value, (int, float)) or isinstance(value, bool):
        return (None, None)
    if low is not None and (not math.isfinite(low) or low > value):
        low = value if math.isfinite(low) else None
    if high is not None and (not math.isfinite(high) or high < value):
        high = value if math.isfinite(high) else None
    return (low, high)


def _around(value: Any, half: float) -> tuple[Any, Any]:
    """``value ± half`` (integers stay integers when ``half`` is whole)."""
    if value is None or not isinstance(value, (int, float)) or isinstance(value, bool):
        return (None, None)
    if isinstance(value, int) and float(half).is_integer():
        return (value - int(half), value + int(half))
    return (value - half, value + half)


def _derived_intervals(
    result: QueryResult, post: PostProcess, outer: exp.Select
) -> tuple[IntervalPlan, pd.DataFrame]:
    """The plan of every derived column's interval and the released rows with the component
    ends it asks for."""
    frame = _released(result, post)
    if not post.rowwise:
        reason = "it aggregates several released rows: no interval"
        return IntervalPlan((), {n: reason for n in post.derived}), frame
    laws = {c: law for c, law in result.noise_laws.items() if c in post.aggregates}
    kinds = {c: _kind(result, c) for c in post.aggregates}
    plan = plan_intervals(
        outer,
        list(post.columns),
        set(post.aggregates),
        laws,
        kinds,
        set(post.exact),
        len(frame),
        result.confidence,
        set(post.derived),
        set(post.types) - set(post.aggregates),
    )
    values = {c: frame[c].to_numpy() for c in post.aggregates}
    ends = component_ends(plan.extra_columns(), values, laws, result.intervals, result.confidence)
    for name, column in ends.items():
        frame[name] = pd.array(column, dtype="Float64")  # after the row number, as _run adds them
    return plan, frame


def _kind(result: QueryResult, column: str) -> str:
    """The kind of a released column's interval: its law's, else as the answer states it."""
    law = result.noise_laws.get(column)
    if law is not None:
        return law.kind
    stated = result.details.get("intervals", {}).get(column, {})
    return stated.get("kind", "as released") if isinstance(stated, dict) else "as released"


def post_processed(
    result: QueryResult, post: PostProcess, released_plan: QueryPlan | None = None
) -> QueryResult:
    """``result`` after ``post``'s outer query, with an interval for every column whose noise
    the released laws bound (``dpsql.engine.derived_intervals``), and the conservative interval
    of a two-column moment when ``released_plan`` (the plan released: its noise laws) is given
    (``dpsql.engine.moments``)."""
    outer = parse_outer(post.outer)
    plan, frame = _derived_intervals(result, post, outer)
    extra = tuple(plan.extra_columns())
    width = len(post.columns)
    try:
        _, rows = _run(post, frame, _with_ends(outer, plan) if post.rowwise else post.outer, extra)
    except duckdb.InterruptException:
        raise  # the request's time limit: no second attempt
    except duckdb.Error:
        # The bounds only: the outer query itself was checked before the charge.
        reason = "its bounds could not be computed from the released values"
        plan = IntervalPlan((), {**plan.missing, **{c.name: reason for c in plan.columns}})
        frame = frame[[*post.types, ROW]]
        _, rows = _run(post, frame, post.outer)
    row_numbers = [row[-1] for row in rows] if post.rowwise else []
    values = [tuple(row[:width]) for row in rows]
    intervals: dict[str, list[tuple[Any, Any]]] = {}
    scales: dict[str, float] = {}
    measures: dict[str, str] = {}
    stated: dict[str, dict[str, Any]] = {}
    for name in post.columns:
        source = post.copies.get(name)
        if source is not None and source in result.intervals and post.rowwise:
            intervals[name] = [result.intervals[source][i] for i in row_numbers]
            if source in result.noise_scale:
                scales[name] = result.noise_scale[source]
            if source in result.measures:
                measures[name] = result.measures[source]
    position = width
    for column in plan.columns:
        index = post.columns.index(column.name)
        if column.half_width is not None:
            intervals[column.name] = [_around(row[index], column.half_width) for row in rows]
        else:
            intervals[column.name] = [
                _interval(row[index], row[position], row[position + 1]) for row in rows
            ]
            position += 2
        stated[column.name] = column.describe(result.confidence)
        source = result.details.get("intervals", {}).get(column.image_of or "", {})
        if isinstance(source, dict) and "covers" in source:
            shown = post.released_columns.get(column.image_of or "", column.image_of)
            stated[column.name]["covers"] = f"the image of what {shown} covers: {source['covers']}"
        measures[column.name] = (
            f"derived from released values: {post.derived[column.name]}; its interval is "
            f"{column.kind} ({column.method})"
        )
    for name, reason in plan.missing.items():
        stated[name] = {"kind": "none", "reason": reason}
        measures[name] = (
            f"derived from released values: {post.derived[name]}; no interval ({reason})"
        )
    details = dict(result.details)
    details["post_processing"] = {
        "query": post.outer,
        "released_columns": dict(post.released_columns),
        "derived": dict(post.derived),
        "cost": "none: computed from the released answer only",
    }
    if post.moment_columns and post.rowwise:
        half_width, epsilons = (
            component_laws(released_plan) if released_plan is not None else (None, {})
        )
        columns = {c for m in post.moment_columns.values() for c in m.released.values()}
        components = {c: frame[c].to_numpy(dtype=float)[row_numbers] for c in columns}
        found, described, moments = moment_answers(
            post.moment_columns, components, result.confidence, half_width, epsilons
        )
        intervals.update(found)
        measures.update(described)
        details["post_processing"]["moments"] = moments
        for name in found:  # the moment's own interval replaces a generic one
            stated[name] = {
                "kind": "conservative",
                "method": "the moment's components (details.post_processing.moments)",
            }
    if stated:
        details["intervals"] = {
            **{n: v for n, v in details.get("intervals", {}).items() if n in post.columns},
            **stated,
            "unbounded_ends": "a missing end (null) is unbounded: e.g. a ratio whose "
            "denominator's interval contains 0 can be any number",
        }
    copied = {name: source for name, source in post.copies.items() if post.rowwise}
    return result.model_copy(
        update={
            "columns": list(post.columns),
            "rows": values,
            "intervals": intervals,
            "noise_scale": scales,
            "measures": measures,
            "details": details,
        }
    ).with_noise_laws(
        {n: result.noise_laws[s] for n, s in copied.items() if s in result.noise_laws},
        {n: result.value_ranges[s] for n, s in copied.items() if s in result.value_ranges},
    )
