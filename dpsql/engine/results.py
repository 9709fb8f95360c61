"""What a query returns: noisy values, their intervals, and what they cost."""

from __future__ import annotations

import csv
import io
import math
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, PrivateAttr

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "LEDGER_COLUMNS",
    "BudgetReport",
    "BudgetStatus",
    "QueryResult",
    "csv_text",
    "json_safe",
]

LEDGER_COLUMNS = [
    "seq",
    "time",
    "kind",
    "analyst",
    "os_user",
    "epsilon",
    "delta",
    "mechanism",
    "query",
]
"""The columns of a ledger listed as a table or CSV."""


def csv_text(columns: list[str], rows: list[list[Any]]) -> str:
    """``columns`` and ``rows`` as CSV text (a header line, then one line per row)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    return buffer.getvalue()


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None, so ``json.dumps`` writes
    valid JSON (``null``), in dicts, lists and tuples at any depth.

    >>> json_safe({"a": [1.0, float("nan")], "b": (float("inf"), "x")})
    {'a': [1.0, None], 'b': [None, 'x']}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


class QueryResult(BaseModel):
    """A released answer.

    ``rows`` hold the noisy values in ``columns`` order; ``intervals`` maps each noisy column to one
    ``(low, high)`` pair per row, covering the true (bounded) value with probability ``confidence``.
    """

    model_config = ConfigDict(frozen=True)

    columns: list[str]
    rows: list[tuple[Any, ...]]
    intervals: dict[str, list[tuple[float | None, float | None]]]
    noise_scale: dict[str, float]
    confidence: float
    epsilon: float
    delta: float
    mechanism: str
    analyst: str
    ledger_entry: int
    details: dict[str, Any] = {}
    """Mechanism-specific facts, e.g. the sparse vector technique's accuracy bound."""
    measures: dict[str, str] = {}
    """What each noisy column measures, e.g. "rows, at most 1 per person per group, in at most 5
    groups per person": the bounded quantity its interval covers (not the plain SQL answer when
    a person exceeds a contribution bound)."""

    _noise_laws: dict[str, Any] = PrivateAttr(default_factory=dict)
    """The noise law of each noisy column (``dpsql.engine.noise_laws``), kept beside the
    answer so post-processing can state intervals at other levels; not part of its JSON."""

    @property
    def noise_laws(self) -> dict[str, Any]:
        """Column -> its noise law, where the release knows it (see ``with_noise_laws``)."""
        return dict(self._noise_laws)

    _value_ranges: dict[str, tuple[float | None, float | None]] = PrivateAttr(
        default_factory=dict
    )
    """Column -> the range its true value cannot leave (a count is never negative), for
    ``clamped``; not part of its JSON."""

    def with_noise_laws(
        self,
        laws: dict[str, Any],
        ranges: dict[str, tuple[float | None, float | None]] | None = None,
    ) -> QueryResult:
        """This answer with ``laws`` (column -> noise law) kept beside it, and ``ranges``
        (column -> (low, high), None for no end) its true values cannot leave."""
        copy = self.model_copy()
        copy._noise_laws = dict(laws)
        copy._value_ranges = dict(ranges if ranges is not None else self._value_ranges)
        return copy

    @property
    def value_ranges(self) -> dict[str, tuple[float | None, float | None]]:
        return dict(self._value_ranges)

    def clamped(self) -> QueryResult:
        """Values and intervals of the columns whose true value cannot leave a range (a count
        is never negative) clamped into it: post-processing, free. The interval still covers
        the truth whenever the unclamped one did, and the value stays inside it;
        ``details["unclamped"]`` keeps the noisy values that changed (unbiased, for sums
        over many cells)."""
        if not self._value_ranges:
            return self
        rows = self.rows
        intervals = dict(self.intervals)
        unclamped: dict[str, list[Any]] = {}
        for name, (low, high) in self._value_ranges.items():
            if name not in self.columns:
                continue
            at = self.columns.index(name)
            raw = [row[at] for row in rows]
            if _outside(raw, low, high):
                unclamped[name] = raw
                rows = [
                    (*row[:at], _clamp(row[at], low, high), *row[at + 1 :]) for row in rows
                ]
            pairs = intervals.get(name)
            # Every interval has low end <= high end: only the low ends can be below ``low``.
            if pairs is not None and (
                _outside([pair[0] for pair in pairs], low, None)
                or _outside([pair[1] for pair in pairs], None, high)
            ):
                intervals[name] = [(_clamp(a, low, high), _clamp(b, low, high)) for a, b in pairs]
        details = {
            **self.details,
            "clamped": "a count (or a sum of values bounded on one side of 0) cannot be "
            "negative (positive): its value is clamped into that range and its interval "
            "intersected with it, after the release (free; the interval covers the truth "
            "whenever the unclamped one did). Columns computed from released values "
            "(post-processing) use the unclamped noisy values, which are unbiased; "
            "details['unclamped'] lists a column's noisy values where one was changed",
        }
        if unclamped:
            details["unclamped"] = unclamped
        return self.model_copy(update={"rows": rows, "intervals": intervals, "details": details})

    def to_pandas(self, *, intervals: bool = False) -> pd.DataFrame:
        """The rows as a DataFrame; with ``intervals=True`` also ``<col>_low``/``<col>_high``."""
        import pandas as pd
        frame = pd.DataFrame(self.rows, columns=self.columns)
        if intervals:
            for name, pairs in self.intervals.items():
                frame[f"{name}_low"] = [p[0] for p in pairs]
                frame[f"{name}_high"] = [p[1] for p in pairs]
        return frame

    def interval_table(self) -> tuple[list[str], list[list[Any]]]:
        """Columns and rows with each noisy column followed by ``<col>_low``, ``<col>_high``."""
        columns: list[str] = []
        for name in self.columns:
            columns.append(name)
            if name in self.intervals:
                columns += [f"{name}_low", f"{name}_high"]
        rows = []
        for index, row in enumerate(self.rows):
            cells: list[Any] = []
            for name, value in zip(self.columns, row, strict=True):
                cells.append(value)
                if name in self.intervals:
                    cells += self.intervals[name][index]
            rows.append(cells)
        return columns, rows

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QueryResult:
        """The inverse of ``to_dict`` (a noise scale sent as ``null`` becomes NaN)."""
        return cls(
            columns=data["columns"],
            rows=[tuple(row) for row in data["rows"]],
            intervals={k: [tuple(p) for p in v] for k, v in data["intervals"].items()},
            noise_scale={k: math.nan if v is None else v for k, v in data["noise_scale"].items()},
            confidence=data["confidence"],
            epsilon=data["epsilon_spent"],
            delta=data["delta_spent"],
            mechanism=data["mechanism"],
            analyst=data["analyst"],
            ledger_entry=data["ledger_entry"],
            details=data.get("details", {}),
            measures=data.get("measures", {}),
        )

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON layout of ``dpsql query --format json``; a value that is not a
        finite number (an AVG's noise scale, an infinite bound) is ``None`` (JSON ``null``)."""
        return json_safe(
            {
                "columns": self.columns,
                "rows": [list(row) for row in self.rows],
                "intervals": {k: [list(p) for p in v] for k, v in self.intervals.items()},
                "confidence": self.confidence,
                "noise_scale": self.noise_scale,
                "epsilon_spent": self.epsilon,
                "delta_spent": self.delta,
                "mechanism": self.mechanism,
                "analyst": self.analyst,
                "ledger_entry": self.ledger_entry,
                "details": self.details,
                "measures": self.measures,
            }
        )


def _outside(values: list[Any], low: float | None, high: float | None) -> bool:
    """Whether a number among ``values`` lies outside ``[low, high]`` (one pass in C where
    every value is a number; None and other values are left alone)."""
    if not values or (low is None and high is None):
        return False
    try:
        return (low is not None and min(values) < low) or (
            high is not None and max(values) > high
        )
    except TypeError:  # a None or a text among them
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return _outside(numbers, low, high)


def _clamp(value: Any, low: float | None, high: float | None) -> Any:
    """``value`` within ``[low, high]`` (a None end or value is left alone; an int stays an
    int)."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if low is not None and value < low:
        return type(value)(low)
    if high is not None and value > high:
        return type(value)(high)
    return value


class BudgetStatus(BaseModel):
    """Cap, spent and remaining of the dataset, one analyst, or the people of one partition value.

    ``rule`` names the composition bound that gave ``spent`` ("basic", "advanced" or "zcdp").
    """

    model_config = ConfigDict(frozen=True)

    scope: str
    name: str
    epsilon_cap: float
    delta_cap: float
    epsilon_spent: float
    delta_spent: float
    epsilon_remaining: float
    delta_remaining: float
    rule: str = "basic"
    period: str | None = None
    """The budget period the line covers (e.g. "2026-11"); None when the caps never renew."""


class BudgetReport(BaseModel):
    """The dataset line first, then one line per analyst, then one per touched partition value."""

    model_config = ConfigDict(frozen=True)

    lines: list[BudgetStatus]

    def for_analyst(self, name: str) -> BudgetStatus | None:
        return next((s for s in self.lines if s.scope == "analyst" and s.name == name), None)

    @property
    def dataset(self) -> BudgetStatus:
        return self.lines[0]
