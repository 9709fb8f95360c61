"""Exact budget arithmetic: rounding always against the analyst, and validation at the boundary."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np
import pytest

from dpsql.accountant.units import (
    DELTA_RESOLUTION,
    EPSILON_RESOLUTION,
    Cost,
    check_budget_value,
)
from dpsql.errors import ParameterError

EPSILON_UNITS_PER_ONE = 10**9
DELTA_UNITS_PER_ONE = 10**18


def test_resolutions() -> None:
    assert Fraction(1, EPSILON_UNITS_PER_ONE) == EPSILON_RESOLUTION
    assert Fraction(1, DELTA_UNITS_PER_ONE) == DELTA_RESOLUTION


# --- exact decimal reading ---------------------------------------------------------------------


def test_a_tenth_ten_times_is_exactly_one() -> None:
    tenth = Cost.of(0.1)
    assert tenth == Cost(10**8, 0)
    total = Cost()
    for _ in range(10):
        total = total + tenth
    assert total == Cost.of(1.0) == Cost.cap(1.0) == Cost(EPSILON_UNITS_PER_ONE, 0)
    assert total.epsilon == 1.0
    assert sum(0.1 for _ in range(10)) != 1.0  # what floats would have done


@pytest.mark.parametrize(
    ("epsilon", "units"),
    [(0.1, 10**8), (0.3, 3 * 10**8), (1.5, 15 * 10**8), (1e-9, 1), (2.5e-7, 250), (1e9, 10**18)],
)
def test_decimal_epsilons_are_exact(epsilon: float, units: int) -> None:
    assert Cost.of(epsilon).epsilon_units == units
    assert Cost.cap(epsilon).epsilon_units == units
    assert Cost.of(epsilon).epsilon == epsilon


@pytest.mark.parametrize(
    ("delta", "units"), [(1e-6, 10**12), (1e-18, 1), (5e-10, 5 * 10**8), (0.5, 5 * 10**17)]
)
def test_decimal_deltas_are_exact(delta: float, units: int) -> None:
    assert Cost.of(0.0, delta).delta_units == units
    assert Cost.cap(0.0, delta).delta_units == units
    assert Cost.of(0.0, delta).delta == delta


# --- rounding direction ------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [1 / 3, 2 / 3, math.pi, 1e-10, 1.0000000001e-9, 0.1234567891])
def test_charges_round_up_and_caps_round_down(epsilon: float) -> None:
    exact = Fraction(repr(epsilon)) * EPSILON_UNITS_PER_ONE
    assert exact.denominator != 1, "the value must not be representable"
    charge, cap = Cost.of(epsilon).epsilon_units, Cost.cap(epsilon).epsilon_units
    assert charge == math.ceil(exact)
    assert cap == math.floor(exact)
    assert charge == cap + 1
    assert Cost.of(epsilon).epsilon >= epsilon >= Cost.cap(epsilon).epsilon


def test_delta_charges_round_up_and_caps_round_down() -> None:
    assert Cost.of(0.0, 1.5e-18).delta_units == 2
    assert Cost.cap(0.0, 1.5e-18).delta_units == 1
    assert Cost.of(0.0, 1e-19).delta_units == 1
    assert Cost.cap(0.0, 1e-19).delta_units == 0
    third = 1e-6 / 3
    assert Cost.of(0.0, third).delta_units == Cost.cap(0.0, third).delta_units + 1


def test_a_third_three_times_overstates_never_understates() -> None:
    third = Cost.of(1 / 3)
    assert third + third + third > Cost.cap(1.0)
    assert not (third + third + third).fits_within(Cost.cap(1.0))
    assert (Cost.cap(1 / 3) + Cost.cap(1 / 3) + Cost.cap(1 / 3)).fits_within(Cost.cap(1.0))


# --- arithmetic --------------------------------------------------------------------------------


def test_cost_arithmetic() -> None:
    a, b = Cost(5, 7), Cost(3, 11)
    assert a + b == Cost(8, 18)
    assert a - b == Cost(2, -4)
    assert a.join(b) == Cost(5, 11) == b.join(a)
    assert a.fits_within(Cost(5, 7))
    assert not a.fits_within(Cost(4, 100))
    assert not a.fits_within(Cost(100, 6))
    assert Cost() == Cost(0, 0)
    assert Cost(1, 0) < Cost(1, 1) < Cost(2, 0)


def test_cost_is_frozen_and_hashable() -> None:
    cost = Cost.of(0.5, 1e-6)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cost.epsilon_units = 0  # type: ignore[misc]
    assert {cost, Cost.of(0.5, 1e-6)} == {cost}


def test_largest_cap_fits_a_signed_64_bit_integer() -> None:
    cap = Cost.cap(1e9, 1 - 1e-16)
    assert cap.epsilon_units < 2**63
    assert cap.delta_units < 2**63


# --- validation at the boundary ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["epsilon", "delta"])
@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (math.nan, "nan"),
        (math.inf, "inf"),
        (-math.inf, "-inf"),
        (-0.1, "-0.1"),
        (-1, "-1"),
        (True, "True"),
        (False, "False"),
        ("0.5", "'0.5'"),
        (None, "None"),
        ([0.5], "[0.5]"),
    ],
)
def test_invalid_values_raise_parameter_error_naming_the_parameter(
    name: str, value: object, shown: str
) -> None:
    with pytest.raises(ParameterError) as caught:
        check_budget_value(name, value, allow_zero=True)  # type: ignore[arg-type]
    message = str(caught.value)
    assert message.startswith(name)
    assert shown in message
    assert isinstance(caught.value, ValueError)


def test_zero_is_allowed_only_when_asked() -> None:
    assert check_budget_value("delta", 0.0, allow_zero=True) == 0.0
    assert check_budget_value("epsilon", 0, allow_zero=True) == 0.0
    with pytest.raises(ParameterError, match="epsilon must be > 0, got 0"):
        check_budget_value("epsilon", 0.0, allow_zero=False)
    with pytest.raises(ParameterError, match="delta must be > 0"):
        check_budget_value("delta", 0, allow_zero=False)


@pytest.mark.parametrize(
    ("name", "value"),
    [("epsilon", 1e-10), ("epsilon", 9.99e-10), ("delta", 1e-19), ("delta", 5e-324)],
)
def test_values_below_the_resolution_are_refused(name: str, value: float) -> None:
    with pytest.raises(ParameterError, match=f"{name} .* is below the ledger's resolution"):
        check_budget_value(name, value, allow_zero=True)


@pytest.mark.parametrize(("name", "value"), [("epsilon", 1e-9), ("delta", 1e-18)])
def test_the_resolution_itself_is_accepted(name: str, value: float) -> None:
    assert check_budget_value(name, value, allow_zero=False) == value


def test_delta_must_be_below_one() -> None:
    assert check_budget_value("delta", 0.999999, allow_zero=True) == 0.999999
    for value in (1, 1.0, 2.5):
        with pytest.raises(ParameterError, match="delta must be < 1"):
            check_budget_value("delta", value, allow_zero=True)


def test_epsilon_has_a_ceiling() -> None:
    assert check_budget_value("epsilon", 1e9, allow_zero=False) == 1e9
    with pytest.raises(ParameterError, match="epsilon must be <= 1e"):
        check_budget_value("epsilon", 1.0000001e9, allow_zero=False)


def test_valid_values_come_back_as_floats() -> None:
    value = check_budget_value("epsilon", 2, allow_zero=False)
    assert value == 2.0
    assert type(value) is float
    assert check_budget_value("epsilon", np.float64(0.5), allow_zero=False) == 0.5


@pytest.mark.parametrize("value", [math.nan, math.inf, -0.5, True])
def test_cost_of_refuses_what_check_budget_value_refuses(value: float) -> None:
    with pytest.raises(ParameterError, match="epsilon"):
        Cost.of(value)
