"""Privacy costs as a tree of frozen events: mechanism leaves, sequential and parallel nodes.

The ledger stores each charge's tree as JSON; totals are recomputed from the tree with exact
integer arithmetic (``Cost``), so an auditor can re-derive every number from the entries alone.

>>> tree = SequentialEvent((MechanismEvent("discrete_laplace", 0.5, label="COUNT(*)"),
...                         MechanismEvent("discrete_laplace", 0.5, label="SUM(x)")))
>>> total(tree).epsilon
1.0
>>> event_from_dict(event_to_dict(tree)) == tree
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpsql.accountant.units import Cost

__all__ = [
    "Event",
    "MechanismEvent",
    "ParallelEvent",
    "PostProcessingEvent",
    "SequentialEvent",
    "event_from_dict",
    "event_to_dict",
    "total",
]

Scalar = str | int | float | bool | None


@dataclass(frozen=True)
class MechanismEvent:
    """One mechanism run at (epsilon, delta); ``params`` (kept sorted by name) is what an auditor
    needs to check it."""

    mechanism: str
    epsilon: float
    delta: float = 0.0
    label: str = ""
    params: tuple[tuple[str, Scalar], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(sorted(self.params)))


@dataclass(frozen=True)
class SequentialEvent:
    """Events on the same people, one after another: costs add up."""

    events: tuple[Event, ...]


@dataclass(frozen=True)
class ParallelEvent:
    """Events on disjoint parts of the data: the cost is the largest part's."""

    events: tuple[Event, ...]


@dataclass(frozen=True)
class PostProcessingEvent:
    """An answer computed from an earlier, already-charged release (``source``): costs nothing."""

    source: str
    label: str = ""


Event = MechanismEvent | SequentialEvent | ParallelEvent | PostProcessingEvent


def total(event: Event) -> Cost:
    """The exact cost of a tree (leaves rounded up to the ledger's resolution)."""
    if isinstance(event, MechanismEvent):
        return Cost.of(event.epsilon, event.delta)
    if isinstance(event, PostProcessingEvent):
        return Cost()
    costs = [total(child) for child in event.events]
    result = Cost()
    for cost in costs:
        result = result + cost if isinstance(event, SequentialEvent) else result.join(cost)
    return result


def event_to_dict(event: Event) -> dict[str, Any]:
    """A JSON-ready description of the tree."""
    if isinstance(event, MechanismEvent):
        return {
            "type": "mechanism",
            "mechanism": event.mechanism,
            "epsilon": event.epsilon,
            "delta": event.delta,
            "label": event.label,
            "params": dict(event.params),
        }
    if isinstance(event, PostProcessingEvent):
        return {"type": "post_processing", "source": event.source, "label": event.label}
    kind = "sequential" if isinstance(event, SequentialEvent) else "parallel"
    return {"type": kind, "events": [event_to_dict(child) for child in event.events]}


def event_from_dict(data: dict[str, Any]) -> Event:
    """Rebuild a tree written by ``event_to_dict``."""
    kind = data.get("type")
    if kind == "mechanism":
        return MechanismEvent(
            data["mechanism"],
            float(data["epsilon"]),
            float(data["delta"]),
            data.get("label", ""),
            tuple(sorted(data.get("params", {}).items())),
        )
    if kind == "post_processing":
        return PostProcessingEvent(data["source"], data.get("label", ""))
    children = tuple(event_from_dict(child) for child in data["events"])
    if kind == "sequential":
        return SequentialEvent(children)
    if kind == "parallel":
        return ParallelEvent(children)
    raise ValueError(f"unknown event type {kind!r}")
