"""zCDP composition in the ledger: curves of leaves, totals against dp-accounting, the cap."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from dp_accounting import GaussianDpEvent, LaplaceDpEvent, SelfComposedDpEvent
from dp_accounting.rdp import RdpAccountant

from dpsql.accountant.events import MechanismEvent, ParallelEvent, SequentialEvent
from dpsql.accountant.ledger import Ledger
from dpsql.accountant.limits import Limits
from dpsql.accountant.units import Cost
from dpsql.accountant.zcdp import curves, zcdp_total
from dpsql.errors import BudgetExceededError


def _gaussian(rho: float, delta: float = 0.0) -> MechanismEvent:
    return MechanismEvent(
        "threshold_gaussian", 1.0, 1e-6, "COUNT(*)", (("zcdp_rho", rho), ("zcdp_delta", delta))
    )


def test_curves_of_leaves() -> None:
    pure = MechanismEvent("discrete_laplace", 0.5, 0.0, "COUNT(*)")
    laplace_threshold = MechanismEvent("threshold", 1.0, 1e-6, "COUNT(*)")
    other = MechanismEvent("numeric_sparse", 1.0, 1e-6, "COUNT(*)")
    assert curves(SequentialEvent((pure, _gaussian(0.02, 3e-7)))) == ((0.125, 0.0), (0.02, 3e-7))
    assert curves(laplace_threshold) == ((0.5, 1e-6),)
    assert curves(SequentialEvent((pure, other))) is None
    assert curves(ParallelEvent((pure, _gaussian(0.2)))) == ((0.2, 0.0),)


def test_hundred_gaussian_releases_match_dp_accounting() -> None:
    """100 Gaussian releases of noise multiplier 5 (ρ = 1/50 each): the ledger's ε at δ′ = 1e-6
    equals the RDP accountant's for the same composition (within its order grid)."""
    total = zcdp_total([((1 / 50, 0.0),)] * 100, 1e-6)
    accountant = RdpAccountant()
    accountant.compose(SelfComposedDpEvent(GaussianDpEvent(5.0), 100))
    assert total is not None
    assert total.epsilon == pytest.approx(accountant.get_epsilon(1e-6), rel=2e-3)
    assert total.delta == pytest.approx(1e-6, rel=1e-6)
    alone = zcdp_total([((1 / 50, 0.0),)], 1e-6)
    assert alone is not None and total.epsilon < 100 * alone.epsilon / 7  # basic: 100 × alone


def test_pure_laplace_steps_convert_through_their_zcdp_curve() -> None:
    """ε-DP ⇒ ε²/2-zCDP: never tighter than the library's own Laplace RDP curve allows."""
    total = zcdp_total([((0.5**2 / 2, 0.0),)] * 50, 1e-6)
    accountant = RdpAccountant()
    accountant.compose(SelfComposedDpEvent(LaplaceDpEvent(2.0), 50))  # scale 2 = 0.5-DP
    assert total is not None and total.epsilon >= accountant.get_epsilon(1e-6) * 0.99
    assert total.epsilon < 25.0


def _ledger(tmp_path: Path, zcdp: bool) -> Ledger:
    ledger = Ledger(tmp_path / ("z.db" if zcdp else "b.db"), dataset="d")
    limits = Limits(Cost.cap(10.0, 1e-3), {"a": Cost.cap(10.0, 1e-3)}, None, 1e-6 if zcdp else None)
    ledger.set_policy({"dataset": {"composition": "zcdp" if zcdp else "basic"}}, limits)
    return ledger


def test_the_cap_admits_gaussian_releases_by_the_zcdp_rule(tmp_path: Path) -> None:
    """Each release is (1, 1e-6)-DP alone: basic composition admits 10; zCDP admits many more,
    says so in the budget, and refuses once its own total passes the cap."""
    rho = 1 / (2 * 4.8**2)
    admitted = {}
    for zcdp in (False, True):
        ledger = _ledger(tmp_path, zcdp)
        count = 0
        with pytest.raises(BudgetExceededError):
            for _ in range(400):
                ledger.charge(analyst="a", event=_gaussian(rho, 3e-7), query="q", plan={},
                              mechanism="threshold_gaussian")  # fmt: skip
                count += 1
        admitted[zcdp] = count
        line = ledger.budget("a")[0]
        assert line.rule == ("zcdp" if zcdp else "basic")
        assert line.spent.epsilon <= 10.0
        assert ledger.verify() == count + 1
    assert admitted[False] == 10
    expected = max(
        k for k in range(1, 400)
        if (z := zcdp_total([((rho, 3e-7),)] * k, 1e-6)) is not None and z.fits_within(
            Cost.cap(10.0, 1e-3)
        )
    )  # fmt: skip
    assert admitted[True] == expected > 40


def test_a_leaf_without_a_curve_falls_back_to_the_other_rules(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path, True)
    ledger.charge(
        analyst="a",
        event=MechanismEvent("numeric_sparse", 1.0, 1e-6, "x"),
        query="q",
        plan={},
        mechanism="numeric_sparse",
    )
    ledger.charge(analyst="a", event=_gaussian(0.02), query="q", plan={}, mechanism="g")
    line = ledger.budget("a")[0]
    assert line.rule == "basic" and line.spent.epsilon == pytest.approx(2.0)
    assert math.isclose(ledger.budget()[0].spent.epsilon, 2.0)
