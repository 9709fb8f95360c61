"""Run the post-processing of a released answer and say which values it derived.

The outer query (``dpsql.sql.postprocess``) runs in a sandboxed in-memory DuckDB that holds one
table, the released answer, and can read no file: it never sees a row of the data, so its output
is differentially private with the release's own guarantee and costs nothing more.

Intervals: a column that copies a released aggregate keeps its interval; a column that is a
monotone function of one released aggregate (other inputs constant within the row, e.g.
``COUNT(*) * 100 / 545``) gets the image of that interval, which covers the function of the true
value whenever the released interval covers the true value, so its confidence is unchanged.
A column that is exactly a two-column moment (CORR, COVAR_*, REGR_*) gets a conservative interval
from its components' (``dpsql.engine.moments``), named in ``details["post_processing"]
["moments"]``. Anything else (a ratio of two released values, a window over rows) gets no
interval: the result names it in ``details["derived"]`` and its ``measures`` entry says so.

Post-processing is bounded: it runs within the request's time limit (``dpsql.deadline``
interrupts the sandbox), under the sandbox's memory limit, with the functions
``dpsql.sql.postprocess`` allows, and returns at most as many rows as were released.
"""

from __future__ import annotations

import datetime as dt
import decimal
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dpsql import deadline
from dpsql.engine.moments import component_laws, moment_answers
from dpsql.engine.results import QueryResult
from dpsql.sql.postprocess import RELEASED, ROW, PostProcess, create_released, sandbox

if TYPE_CHECKING:
    from dpsql.engine.planner import QueryPlan

__all__ = ["post_processed"]


def _released(result: QueryResult, post: PostProcess, ends: int | None) -> pd.DataFrame:
    """The released rows as a frame in ``post``'s column order (with the row number); with
    ``ends`` 0 or 1, every aggregate with an interval replaced by its low or high end."""
    frame = pd.DataFrame(result.rows, columns=result.columns, dtype=object)
    frame = frame[list(post.types)]
    if ends is not None:
        for name in post.aggregates:
            pairs = result.intervals.get(name)
            frame[name] = [p[ends] for p in pairs] if pairs is not None else None
    frame[ROW] = np.arange(len(frame), dtype=np.int64)
    return frame


def _run(post: PostProcess, frame: pd.DataFrame, sql: str) -> tuple[list[str], list[tuple]]:
    """``sql`` over the released rows in the sandbox, within the request's time limit; at most
    as many rows as were released (one for an aggregate over none), or ``ValueError``."""
    connection = sandbox()
    most = max(len(frame), 1)
    try:
        with deadline.watching(connection):
            create_released(connection, post)
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


def _image(post: PostProcess, result: QueryResult, name: str) -> dict[int, tuple[Any, Any]]:
    """Row number -> the image of the source aggregate's interval under column ``name``."""
    _, expression = post.exact[name]
    sql = f'SELECT "{ROW}", {expression} FROM {RELEASED}'
    ends = [dict(_run(post, _released(result, post, end), sql)[1]) for end in (0, 1)]
    image: dict[int, tuple[Any, Any]] = {}
    for row, low in ends[0].items():
        high = ends[1][row]
        if low is None or high is None:
            image[row] = (None, None)
        else:
            image[row] = (min(low, high), max(low, high))
    return image


def post_processed(
    result: QueryResult, post: PostProcess, plan: QueryPlan | None = None
) -> QueryResult:
    """``result`` after ``post``'s outer query, with intervals where they are exact, and
    conservative ones for moments when ``plan`` (the released plan: its noise laws) is given."""
    frame = _released(result, post, None)
    _, rows = _run(post, frame, post.outer)
    width = len(post.columns)
    row_numbers = [row[width] for row in rows] if post.rowwise else []
    values = [tuple(row[:width]) for row in rows]
    intervals: dict[str, list[tuple[Any, Any]]] = {}
    scales: dict[str, float] = {}
    measures: dict[str, str] = {}
    for name in post.columns:
        source = post.copies.get(name)
        if source is not None and source in result.intervals and post.rowwise:
            intervals[name] = [result.intervals[source][i] for i in row_numbers]
            if source in result.noise_scale:
                scales[name] = result.noise_scale[source]
            if source in result.measures:
                measures[name] = result.measures[source]
        elif name in post.exact and post.exact[name][0] in result.intervals:
            image = _image(post, result, name)
            intervals[name] = [image[i] for i in row_numbers]
            source = post.exact[name][0]
            measures[name] = (
                f"derived from released values: {post.derived[name]}; its interval is the image "
                f"of {post.released_columns[source]}'s"
            )
        elif name in post.derived:
            measures[name] = (
                f"derived from released values: {post.derived[name]}; no interval (it combines "
                "several released values or rows)"
            )
    details = dict(result.details)
    details["post_processing"] = {
        "query": post.outer,
        "released_columns": dict(post.released_columns),
        "derived": dict(post.derived),
        "cost": "none: computed from the released answer only",
    }
    if post.moment_columns and post.rowwise:
        half_width, epsilons = component_laws(plan) if plan is not None else (None, {})
        columns = {c for m in post.moment_columns.values() for c in m.released.values()}
        components = {c: frame[c].to_numpy(dtype=float)[row_numbers] for c in columns}
        found, described, moments = moment_answers(
            post.moment_columns, components, result.confidence, half_width, epsilons
        )
        intervals.update(found)
        measures.update(described)
        details["post_processing"]["moments"] = moments
    return result.model_copy(
        update={
            "columns": list(post.columns),
            "rows": values,
            "intervals": intervals,
            "noise_scale": scales,
            "measures": measures,
            "details": details,
        }
    )
