"""The caps a ledger enforces: the dataset's total and each analyst's allocation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dpsql.accountant.units import Cost

__all__ = ["Limits"]


@dataclass(frozen=True)
class Limits:
    """Dataset cap and per-analyst allocations, in exact units (rounded down)."""

    dataset: Cost
    analysts: dict[str, Cost] = field(default_factory=dict)
    advanced_delta: float | None = None
    """δ′ of advanced composition when the policy enables it (see ``composition``)."""
    period: str | None = None
    """"month" or "year" when the caps renew each calendar period (``dpsql.accountant.periods``)."""

    def to_dict(self) -> dict[str, Any]:
        renewal = {} if self.period is None else {"period": self.period}
        return {
            **renewal,
            "advanced_delta": self.advanced_delta,
            "dataset": [self.dataset.epsilon_units, self.dataset.delta_units],
            "analysts": {
                name: [c.epsilon_units, c.delta_units] for name, c in sorted(self.analysts.items())
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Limits:
        return cls(
            Cost(*data["dataset"]),
            {name: Cost(*units) for name, units in data["analysts"].items()},
            data.get("advanced_delta"),
            data.get("period"),
        )
