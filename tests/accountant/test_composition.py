"""Parallel composition over partition regions, and the advanced-composition bound."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dpsql.accountant.composition import Charge, advanced_total, basic_total, leaves, spend
from dpsql.accountant.events import MechanismEvent, ParallelEvent, SequentialEvent
from dpsql.accountant.regions import Interval, Region, max_cost_over_points
from dpsql.accountant.units import Cost


def charge(epsilon: float, region: Region | None = None, family: str | None = "t.c") -> Charge:
    cost = Cost.of(epsilon)
    return Charge("a", cost, ((epsilon, 0.0),), family if region else None, region)


def test_disjoint_partitions_compose_in_parallel() -> None:
    charges = [charge(1.0, Region.point("DK")), charge(1.0, Region.point("NO"))]
    assert basic_total(charges) == Cost.of(1.0)


def test_overlapping_partitions_add_up() -> None:
    charges = [
        charge(1.0, Region.point("DK")),
        charge(0.5, Region((Interval("A", True, "E", False),))),  # contains DK
        charge(0.25, Region.point("NO")),
    ]
    assert basic_total(charges) == Cost.of(1.5)


def test_open_and_closed_ends_decide_disjointness() -> None:
    below = Region((Interval(None, False, 10, False),))  # c < 10
    at_or_above = Region((Interval(10, True, None, False),))  # c >= 10
    at_most = Region((Interval(None, False, 10, True),))  # c <= 10
    assert basic_total([charge(1.0, below), charge(1.0, at_or_above)]) == Cost.of(1.0)
    assert basic_total([charge(1.0, at_most), charge(1.0, at_or_above)]) == Cost.of(2.0)


def test_unpartitioned_charges_and_other_families_add() -> None:
    charges = [
        charge(1.0, Region.point("DK")),
        charge(1.0, Region.point("NO")),
        charge(0.5),
        charge(0.25, Region.point(3), family="t.other"),
    ]
    assert basic_total(charges) == Cost.of(1.75)


def test_max_over_points_matches_brute_force_on_integers() -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        charges = []
        for _ in range(rng.integers(1, 6)):
            low, high = sorted(rng.integers(0, 12, 2).tolist())
            region = Region((Interval(low, bool(rng.integers(2)), high, bool(rng.integers(2))),))
            charges.append((region, Cost(int(rng.integers(1, 100)), 0)))
        best, _ = max_cost_over_points(charges)
        halves = [x / 2 for x in range(-2, 27)]
        brute = max(sum((c.epsilon_units for r, c in charges if r.contains(x)), 0) for x in halves)
        assert best.epsilon_units == brute


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


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        (Region.point("DK"), Region.point("DK"), True),
        (Region.point(1), Region((Interval(1, False, 5, True),)), False),
        (Region.point(1), Region((Interval(1, True, 5, True),)), True),
        (Region.everything(), Region.point("x"), True),
        (Region((Interval(0, True, 1, True), Interval(3, True, 4, True))), Region.point(2), False),
    ],
)
def test_overlaps(a: Region, b: Region, overlap: bool) -> None:
    assert a.overlaps(b) is overlap
    assert b.overlaps(a) is overlap


def test_region_round_trip() -> None:
    for region in [Region.point("DK"), Region((Interval(None, False, 3.5, True),))]:
        assert Region.from_list(region.to_list()) == region
    assert list(itertools.islice(Region.point("DK").endpoints(), 1)) == ["DK"]
