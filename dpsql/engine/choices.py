"""The names and defaults an analyst chooses from, importable without the engine (the command
line's option choices and help text use them before any query runs)."""

from __future__ import annotations

__all__ = [
    "CONTRIBUTIONS_EPSILON",
    "DEFAULT_EXPECTED_QUERIES",
    "MECHANISMS",
    "MECHANISM_NAMES",
    "STREAM_MECHANISMS",
]

MECHANISMS = {
    "laplace": None,
    "threshold": "threshold",
    "threshold_laplace": "threshold",
    "threshold_gaussian": "threshold_gaussian",
    "weighted": "weighted",
    "mad2r": "mad2r",
    "joint": "joint",
    "alp": "combined",
    "combined": "combined",
}
"""What ``mechanism=`` may name for a query the planner answers, and the key release each names
(None: public keys only)."""

MECHANISM_NAMES: tuple[str, ...] = tuple(MECHANISMS)
"""What ``mechanism=`` may name for a query the planner answers (query streams add theirs)."""

STREAM_MECHANISMS = ("pmw", "range_tree")
"""The mechanisms of query streams."""

DEFAULT_EXPECTED_QUERIES = 1000
"""Queries a stream is sized for when its opening states none."""

CONTRIBUTIONS_EPSILON = 0.1
"""ε of a contribution report or suggestion that states none (small, and always shown)."""
