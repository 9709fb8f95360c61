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
    zcdp_delta: float | None = None
    """δ′ of the zCDP-to-(ε, δ) conversion when the policy enables zCDP (see ``zcdp``)."""
    period: str | None = None
    """"month" or "year" when the caps renew each calendar period (``dpsql.accountant.periods``)."""

    def to_dict(self) -> dict[str, Any]:
        document = {
            "advanced_delta": self.advanced_delta,
            "dataset": [self.dataset.epsilon_units, self.dataset.delta_units],
            "analysts": {
                name: [c.epsilon_units, c.delta_units] for name, c in sorted(self.analysts.items())
            },
        }
        # Older documents stay byte for byte the same: new keys only when set.
        if self.zcdp_delta is not None:
            document["zcdp_delta"] = self.zcdp_delta
        if self.period is not None:
            document["period"] = self.period
        return document

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Limits:
        return cls(
            Cost(*data["dataset"]),
            {name: Cost(*units) for name, units in data["analysts"].items()},
            data.get("advanced_delta"),
            zcdp_delta=data.get("zcdp_delta"),
            period=data.get("period"),
        )
