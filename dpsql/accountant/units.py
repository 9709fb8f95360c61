"""Exact budget arithmetic: ε and δ as integers of fixed resolution.

Floats never accumulate in the ledger. ε is counted in units of 10⁻⁹ and δ in units of 10⁻¹⁸ (both
fit a 64-bit SQLite integer for any cap dpsql accepts). Charges round up and caps round down, so any
rounding goes against the analyst. A value is read as the shortest decimal that round-trips its
float (``0.1`` is one tenth), the number the user wrote. A positive value smaller than one unit
cannot be represented and is refused.

>>> Cost.of(0.1, 1e-6)
Cost(epsilon_units=100000000, delta_units=1000000000000)
>>> Cost.of(0.1, 1e-6).epsilon
0.1
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

from dpsql.errors import ParameterError

__all__ = ["DELTA_RESOLUTION", "EPSILON_RESOLUTION", "Cost", "check_budget_value"]

EPSILON_RESOLUTION = Fraction(1, 10**9)
DELTA_RESOLUTION = Fraction(1, 10**18)
_MAX_EPSILON = 1e9


def check_budget_value(name: str, value: float, *, allow_zero: bool) -> float:
    """Validate an ε or δ given by a user; raise ``ParameterError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ParameterError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        raise ParameterError(f"{name} must be finite, got {value}")
    resolution = EPSILON_RESOLUTION if name == "epsilon" else DELTA_RESOLUTION
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ParameterError(f"{name} must be {bound}, got {value}")
    if 0 < value < resolution:
        raise ParameterError(f"{name} {value} is below the ledger's resolution {float(resolution)}")
    if name == "delta" and value >= 1:
        raise ParameterError(f"delta must be < 1, got {value}")
    if name == "epsilon" and value > _MAX_EPSILON:
        raise ParameterError(f"epsilon must be <= {_MAX_EPSILON:g}, got {value}")
    return value


@functools.lru_cache(maxsize=4096, typed=True)
def _units(value: float, name: str, *, up: bool) -> int:
    """``value`` of ``name`` ("epsilon" or "delta") in units of its resolution, rounded up or
    down (a pure function of its arguments, kept per (value, type): ``True`` is refused, not
    taken for ``1``; keyed by the name, whose hash Python keeps, not by the resolution, a
    Fraction whose hash is computed again at every call)."""
    resolution = EPSILON_RESOLUTION if name == "epsilon" else DELTA_RESOLUTION
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ParameterError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ParameterError(f"{name} must be finite and >= 0, got {value}")
    exact = Fraction(repr(float(value))) / resolution
    return math.ceil(exact) if up else math.floor(exact)


@dataclass(frozen=True, order=True)
class Cost:
    """A privacy cost (or a budget) in exact integer units."""

    epsilon_units: int = 0
    delta_units: int = 0

    @classmethod
    def of(cls, epsilon: float, delta: float = 0.0) -> Cost:
        """A charge: rounded up."""
        return cls(_units(epsilon, "epsilon", up=True), _units(delta, "delta", up=True))

    @classmethod
    def cap(cls, epsilon: float, delta: float = 0.0) -> Cost:
        """A cap or allocation: rounded down."""
        return cls(_units(epsilon, "epsilon", up=False), _units(delta, "delta", up=False))

    @property
    def epsilon(self) -> float:
        # An int divided by an int is correctly rounded: float(units * EPSILON_RESOLUTION).
        return self.epsilon_units / EPSILON_RESOLUTION.denominator

    @property
    def delta(self) -> float:
        return self.delta_units / DELTA_RESOLUTION.denominator

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.epsilon_units + other.epsilon_units, self.delta_units + other.delta_units)

    def __sub__(self, other: Cost) -> Cost:
        return Cost(self.epsilon_units - other.epsilon_units, self.delta_units - other.delta_units)

    def join(self, other: Cost) -> Cost:
        """Componentwise maximum: the cost of parallel composition."""
        return Cost(
            max(self.epsilon_units, other.epsilon_units), max(self.delta_units, other.delta_units)
        )

    def fits_within(self, budget: Cost) -> bool:
        return self.epsilon_units <= budget.epsilon_units and self.delta_units <= budget.delta_units
