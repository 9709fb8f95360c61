"""Parallel composition over partition values, and the advanced-composition bound."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpsql.accountant.composition import Charge, advanced_total, basic_total, leaves, spend
from dpsql.accountant.events import MechanismEvent, ParallelEvent, SequentialEvent
from dpsql.accountant.partitions import Totals
from dpsql.accountant.units import Cost


def charge(epsilon: float, values: tuple[str, ...] | None = None, family: str = "t.c") -> Charge:
    cost = Cost.of(epsilon)
    return Charge("a", cost, ((epsilon, 0.0),), family if values else None, values)


def test_disjoint_partitions_compose_in_parallel() -> None:
    charges = [charge(1.0, ("DK",)), charge(1.0, ("NO",))]
    assert basic_total(charges) == Cost.of(1.0)


def test_overlapping_value_sets_add_up() -> None:
    charges = [charge(1.0, ("DK",)), charge(0.5, ("DK", "NO", "SE")), charge(0.25, ("NO",))]
    assert basic_total(charges) == Cost.of(1.5)


def test_unpartitioned_charges_and_other_families_add() -> None:
    charges = [
        charge(1.0, ("DK",)),
        charge(1.0, ("NO",)),
        charge(0.5),
        charge(0.25, ("3",), family="t.other"),
    ]
    assert basic_total(charges) == Cost.of(1.75)


def test_incremental_totals_match_brute_force() -> None:
    """The running totals (O(values touched) per charge) equal the largest spend of any one
    person, recomputed from scratch after every charge, and ``total_with`` predicts ``add``."""
    rng = np.random.default_rng(7)
    people = [(str(a), str(b)) for a in range(6) for b in range(3)]  # (t.c, t.d) of a person
    for _ in range(50):
        totals, charges = Totals(), []
        for _ in range(int(rng.integers(1, 12))):
            family = ("t.c", "t.d")[int(rng.integers(2))]
            width = 6 if family == "t.c" else 3
            values = tuple(str(v) for v in rng.choice(width, int(rng.integers(1, 4))))
            new = charge(float(rng.integers(1, 100)) / 100, values if rng.random() < 0.8 else None,
                         family)
            predicted = totals.total_with(new)
            totals.add(new)
            charges.append(new)
            assert totals.total() == predicted

            def exposure(person: tuple[str, str], charges: list[Charge] = charges) -> int:
                return sum(
                    c.cost.epsilon_units
                    for c in charges
                    if not c.partitioned
                    or (c.values is not None and person[0 if c.family == "t.c" else 1] in c.values)
                )

            # Every combination of values is a possible person: the total is exactly the worst.
            assert totals.total().epsilon_units == max(exposure(p) for p in people)
            assert totals.total() == basic_total(charges)


def test_advanced_composition_formula_and_when_it_wins() -> None:
    steps = [charge(0.01) for _ in range(1000)]
    basic = basic_total(steps)
    advanced = advanced_total(steps, 1e-6)
    expected = math.sqrt(2 * math.log(1e6) * 1000 * 0.01**2) + 1000 * 0.01 * math.expm1(0.01)
    assert advanced.epsilon == pytest.approx(expected, rel=1e-9)
    assert advanced.epsilon >= expected  # rounded up, never down
    assert advanced.delta == pytest.approx(1e-6)
    assert advanced.epsilon < basic.epsilon == pytest.approx(10.0)
    chosen = spend(steps, advanced_delta=1e-6)
    assert chosen.best == advanced and chosen.rule == "advanced"
    few = spend([charge(1.0)], advanced_delta=1e-6)
    assert few.best == few.basic and few.rule == "basic"


def test_a_charge_fits_when_either_bound_fits() -> None:
    steps = spend([charge(0.01) for _ in range(1000)], advanced_delta=1e-6)
    assert steps.fits_within(Cost.cap(5.0, 1e-5))  # advanced fits, basic (10) does not
    assert not steps.fits_within(Cost.cap(5.0, 0.0))  # advanced needs delta' > 0
    assert not spend([charge(0.01)] * 1000, advanced_delta=None).fits_within(Cost.cap(5.0, 1e-5))


def test_leaves_flatten_sequences_and_collapse_parallel_nodes() -> None:
    tree = SequentialEvent(
        (
            MechanismEvent("m", 0.5),
            ParallelEvent((MechanismEvent("m", 0.2), MechanismEvent("m", 0.3, 1e-9))),
        )
    )
    assert leaves(tree) == ((0.5, 0.0), (0.3, 1e-9))
