"""What a query returns: noisy values, their intervals, and what they cost."""

from __future__ import annotations

import csv
import io
import math
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

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
