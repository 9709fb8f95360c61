"""What a stream will state about a query before answering it, so the best one answers.

Every stated error here is a function of a stream's public parameters, the cells a query selects
and the number of queries it has seen, never of the data or of a released value, so comparing
streams by it (routing) and choosing between two valid intervals by it (the PMW rule) keep each
interval's confidence:

* a ``range_tree`` stream states its tree's half-width for the selected cells (an exact Chernoff
  bound on its discrete Laplace noise, ``HierarchicalHistogram.cells_half_width``);
* a ``pmw`` stream states, for its ``k``-th query, the smaller of its sparse-vector bound
  ``α(k)`` (``dpsql.mechanisms.pmw.stated_alpha``; it grows with ``k``) and, when it was warm
  started, the warm-start tree's half-width for the selected cells. The tree's interval covers
  the count with the stated confidence for every query, whatever the updates (the tree was
  released once, before them); the answer itself (synthetic, or a fresh noisy count) need not
  be its centre, so the interval stated is the tree's interval widened to hold the answer.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpsql.engine.streams import Stream
from dpsql.mechanisms.hierarchical import HierarchicalHistogram, release_hierarchical
from dpsql.mechanisms.pmw import PMWState, stated_alpha

__all__ = ["StatedError", "opening_errors", "pmw_interval", "stated_error", "warm_tree"]


@dataclass(frozen=True)
class StatedError:
    """The half-width a stream will state for a query, and where it comes from."""

    half_width: float
    source: str
    """``"range tree"``, ``"pmw alpha"`` or ``"warm-start tree"``."""


def warm_tree(stream: Stream) -> HierarchicalHistogram | None:
    """A PMW stream's warm-start tree (None: not warm started, or a range tree)."""
    if stream.mechanism != "pmw":
        return None
    tree = PMWState.from_parts(stream.state, stream.data).tree
    return HierarchicalHistogram.from_bytes(tree) if tree else None


def _alpha(stream: Stream, queries: int, confidence: float) -> float:
    params = stream.params
    return stated_alpha(
        epsilon=stream.epsilon,
        delta=stream.delta,
        updates=int(params["updates"]),
        threshold=float(params["threshold"]),
        sensitivity=int(params["sensitivity"]),
        count_share=float(params["count_share"]),
        value_share=float(params["value_share"]),
        warm_share=float(params.get("warm_share", 0.0)),
        queries=max(queries, 1),
        beta=1.0 - confidence,
    )


def stated_error(
    stream: Stream,
    selected: np.ndarray,
    confidence: float,
    tree: HierarchicalHistogram | None,
) -> StatedError:
    """What ``stream`` will state for its next query over the ``selected`` cells; ``tree`` is
    its released tree (the range tree, or a PMW's warm start, or None)."""
    if stream.mechanism == "range_tree":
        assert tree is not None
        return StatedError(tree.cells_half_width(selected, confidence), "range tree")
    seen = int(json.loads(stream.state)["sparse"][2])
    alpha = StatedError(_alpha(stream, seen + 1, confidence), "pmw alpha")
    if tree is None:
        return alpha
    warm = StatedError(tree.cells_half_width(selected, confidence), "warm-start tree")
    return warm if warm.half_width < alpha.half_width else alpha


def pmw_interval(
    value: float,
    selected: np.ndarray,
    confidence: float,
    alpha: float,
    tree: HierarchicalHistogram | None,
) -> tuple[tuple[float, float], str]:
    """A PMW answer's interval: the warm-start tree's for the selected cells, widened to hold
    ``value``, when its half-width is below ``alpha`` (both public), else ``value ± alpha``."""
    if tree is not None and tree.cells_half_width(selected, confidence) < alpha:
        found = tree.answer_cells(selected, confidence)
        return (
            (min(value, found.lower), max(value, found.upper)),
            "the warm-start tree's interval for these cells (exact Chernoff bound on its "
            "discrete Laplace noise; it holds whatever the updates), widened to hold the answer",
        )
    return (
        (value - alpha, value + alpha),
        "with the stated confidence, every answer of the stream so far is within alpha of the "
        "bounded count (sparse vector accuracy, notes Thm 4; online PMW, notes Thm 5)",
    )


def opening_errors(
    mechanism: str,
    cells: int,
    epsilon: float,
    delta: float,
    params: dict[str, Any],
    expected_queries: int,
    confidence: float,
) -> dict[str, Any]:
    """What a stream about to be opened will state, from its public parameters alone: the
    half-width of the whole domain and of an inner range (both ends inside), and for a PMW its
    sparse-vector bound after ``expected_queries`` queries (the smaller is stated)."""
    sensitivity = int(params["sensitivity"])
    tree_epsilon = epsilon if mechanism == "range_tree" else epsilon * params.get("warm_share", 0)
    shown: dict[str, Any] = {"confidence": confidence}
    if tree_epsilon > 0:
        shape = release_hierarchical(
            np.zeros(cells, dtype=np.int64),
            epsilon=tree_epsilon,
            sensitivity=sensitivity,
            branching=params.get("branching"),
            rng=np.random.Generator(np.random.PCG64(0)),  # the tree's shape only: no data
        )
        inner = np.zeros(cells, dtype=bool)
        inner[max(1, cells // 3) : max(2, 2 * cells // 3)] = True
        shown["tree_whole_domain"] = shape.cells_half_width(np.ones(cells, bool), confidence)
        shown["tree_inner_range"] = shape.cells_half_width(inner, confidence)
    if mechanism == "pmw":
        stream = Stream("", "", "", (), mechanism, epsilon, delta, 0, params, b"", "{}", 0)
        alpha = _alpha(stream, expected_queries, confidence)
        shown["expected_queries"] = expected_queries
        shown["alpha_after_expected_queries"] = alpha
    candidates = [
        v
        for k, v in shown.items()
        if k in ("tree_inner_range", "alpha_after_expected_queries")
    ]
    shown["stated"] = min(candidates) if candidates else math.inf
    return shown
