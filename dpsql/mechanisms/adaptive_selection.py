"""Two-round adaptive weighted partition selection (``mechanism='mad2r'``), then noisy counts.

The adaptive re-weighting of Chen, Cohen-Addad, Epasto, Zadimoghaddam, "Scalable Private Partition
Selection via Adaptive Weighting" (ICML 2025): weight a person puts on a key far above the
threshold is wasted, so move it to their other keys. The one-round MAD of that paper moves it
inside a single noisy pass, with a sensitivity bound of its own; the two-round MAD2R first runs a
round and lets its output steer the second. dpsql implements the two-round structure in the
variant whose privacy follows from composition alone (the paper's text was not available to us;
``docs/partition_selection.md`` says why the one-round bound we could prove does not pay):

1. **Round 1.** The weighted Gaussian selection of :mod:`dpsql.mechanisms.weighted_selection`
   (each person's kept keys weighted ``w_n = ⌊√(W²/n)⌋``, L2 norm at most W) with noise
   ``N_Z(0, σ₁²)`` and threshold τ₁, on a small share of the selection budget: it finds the keys
   far above any threshold. Its output ``S₁`` is public.
2. **Round 2.** Every person drops their keys in ``S₁`` and spreads the whole W over the keys they
   keep among the rest (``w_m`` on each of their ``m`` remaining kept keys): the weight the heavy
   keys no longer need goes to the person's other keys. Noise ``N_Z(0, σ₂²)``, threshold τ₂, on
   the keys not in ``S₁``: ``S₂``. The released keys are ``S₁ ∪ S₂``.
3. **Counts.** Each released key's bounded count (round 1's bounding) gets ``N_Z(0, σ_c²)``.

Privacy (the theorem relied on: approximate zCDP composes adaptively, Bun and Steinke 2016,
Lemma 8.3, with CKS 2020 Theorem 14 for the discrete Gaussian and Corollary 13 for the
conversion). Let D' be D plus one person u. In round 1 every other person's weights depend on
their own rows only, so u moves the weights of keys present in D by its own vector, of L2 norm
at most W (``ρ₁ = W²/(2σ₁²)``-zCDP), and releases one of its at most K keys absent from D with
probability at most ``δ_τ₁ = max_n 1 − (1 − P(w_n + Z₁ ≥ τ₁))^n`` (exact discrete tails). Given
``S₁`` — a public output, the same input to both D and D' — each person's round-2 weights are a
function of their own rows and ``S₁``, with L2 norm at most W; so round 2 is the same mechanism
on the same kind of input: ``ρ₂ = W²/(2σ₂²)``-zCDP on the keys with round-2 weight in D, and
probability at most ``δ_τ₂`` of releasing a key only u gives round-2 weight to. The counts of the
released keys move by at most ``Δ₂ = √(L∞'·l1)`` in L2: ``ρ_c``. The release is therefore
``(δ_τ₁ + δ_τ₂)``-approximately ``(ρ₁ + ρ₂ + ρ_c)``-zCDP, hence ``(ε, δ_noise + δ_τ₁ + δ_τ₂)``-DP
with ``δ_noise`` from CKS Corollary 13; :func:`plan` keeps that total at most δ.

:func:`plan` takes the weighted selection's ρ (the same noise budget, same counts' σ), gives
round 1 the share :data:`DEFAULT_FIRST_SHARE` of the selection's ρ and splits the threshold's δ
part :data:`DEFAULT_FIRST_DELTA_SHARE` : rest between the rounds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from dpsql.errors import ParameterError
from dpsql.mechanisms import discrete_gaussian as dg
from dpsql.mechanisms import weighted_selection as ws
from dpsql.mechanisms.hashing import as_key_array, fraction_in_open_unit
from dpsql.mechanisms.random import resolve_rng
from dpsql.mechanisms.threshold import (
    Contribution,
    ThresholdRelease,
    _count_array,
    _unique,
)

if TYPE_CHECKING:
    pass

__all__ = [
    "DEFAULT_FIRST_DELTA_SHARE",
    "DEFAULT_FIRST_SHARE",
    "DEFAULT_SELECTION_SHARE",
    "AdaptivePlan",
    "SecondRound",
    "plan",
    "release",
    "second_round_weights",
]

DEFAULT_SELECTION_SHARE = ws.DEFAULT_SELECTION_SHARE
"""Share of ρ spent on both rounds' selection (weighted selection's); the counts get the rest."""

DEFAULT_FIRST_SHARE = 0.06
"""Share of the selection's ρ spent on round 1 (finding the keys far above any threshold)."""

DEFAULT_FIRST_DELTA_SHARE = 0.2
"""Share of the thresholds' δ part given to round 1's threshold."""

SecondRound = Callable[[np.ndarray], tuple[object, object]]
"""Given round 1's released keys, the keys and summed round-2 weights (persons' kept keys outside
them, ``w_m`` each for ``m`` such keys), computed where the data lives (one SQL pass)."""


@dataclass(frozen=True)
class AdaptivePlan(ws.WeightedPlan):
    """Both rounds' noises and thresholds. The inherited ``selection_sigma_squared`` and ``tau``
    are round 2's (they decide the keys no heavy key vouches for); ``threshold_delta`` is
    ``δ_τ₁ + δ_τ₂``."""

    first_share: float
    first_sigma_squared: Fraction
    first_tau: int

    @property
    def selection_rho(self) -> float:
        return _rho(self.first_sigma_squared) + _rho(self.selection_sigma_squared)

    @property
    def first_sigma(self) -> float:
        return float(self.first_sigma_squared) ** 0.5

    def release_probability(self, persons: int, keys_each: int = 1) -> float:
        """``P`` that a key of ``persons`` persons with ``keys_each`` kept keys each is released
        by either round, when round 1 releases none of their other keys (round 2 then weighs
        the key as round 1 did; the rounds' noises are independent)."""
        weight = self.weights[min(keys_each, len(self.weights)) - 1]
        first = dg.tail_at_least(self.first_tau - persons * weight, self.first_sigma_squared)
        second = dg.tail_at_least(self.tau - persons * weight, self.selection_sigma_squared)
        return 1.0 - (1.0 - first) * (1.0 - second)


def _rho(sigma_squared: Fraction) -> float:
    return ws.WEIGHT_SCALE**2 / (2.0 * float(sigma_squared))


@lru_cache(maxsize=128)
def plan(
    epsilon: float,
    delta: float,
    bounds: Contribution,
    selection_share: float = ws.DEFAULT_SELECTION_SHARE,
    first_share: float = DEFAULT_FIRST_SHARE,
) -> AdaptivePlan | None:
    """Both rounds at (ε, δ) for ``bounds`` (module doc); None when weighted selection has none.

    >>> chosen = plan(1.0, 1e-6, Contribution(10, 1, 10))
    >>> chosen.delta <= 1e-6, chosen.first_tau > chosen.tau, round(chosen.count_sigma, 1)
    (True, True, 33.4)
    """
    share = float(fraction_in_open_unit("first_share", first_share))
    base = ws.plan(epsilon, delta, bounds, selection_share)
    if base is None:
        return None
    rho = base.selection_rho
    # quantised() rounds σ² up, so ρ₁ + ρ₂ <= the weighted selection's ρ: δ_noise only shrinks.
    first = dg.quantised(ws.WEIGHT_SCALE**2 / (2.0 * share * rho))
    second = dg.quantised(ws.WEIGHT_SCALE**2 / (2.0 * (1.0 - share) * rho))
    if max(first, second) > dg.MAX_SIGMA_SQUARED:
        return None
    count_rho = base.count_l2_sensitivity**2 / (2.0 * float(base.count_sigma_squared))
    noise = dg.zcdp_delta(_rho(first) + _rho(second) + count_rho, epsilon)
    budget = float(delta) - noise
    if budget <= 0:
        return None
    first_tau = ws.smallest_tau(first, DEFAULT_FIRST_DELTA_SHARE * budget, base.weights)
    first_delta = ws.selection_delta(first_tau, first, base.weights)
    tau = ws.smallest_tau(second, budget - first_delta, base.weights)
    return AdaptivePlan(
        epsilon,
        base.selection_share,
        base.weights,
        second,
        tau,
        base.count_sigma_squared,
        base.count_l2_sensitivity,
        noise,
        first_delta + ws.selection_delta(tau, second, base.weights),
        share,
        first,
        first_tau,
    )


def release(
    keys: object,
    counts: object,
    weights: object,
    second_round: SecondRound,
    *,
    epsilon: float,
    delta: float,
    bounds: Contribution,
    selection_share: float = ws.DEFAULT_SELECTION_SHARE,
    first_share: float = DEFAULT_FIRST_SHARE,
    confidence: float = 0.95,
    rng: np.random.Generator | None = None,
) -> ThresholdRelease:
    """Keys released by either round (random order), with separately noised counts.

    ``weights`` are round 1's summed weights of ``keys`` (as for weighted selection),
    ``counts`` their bounded counts; ``second_round`` computes round 2's weights from round 1's
    keys (:data:`SecondRound`, e.g. :func:`second_round_weights`). A key only round 2 finds
    and absent from ``keys`` has bounded count 0 (no person kept it in round 1's bounding).

    >>> rng = np.random.Generator(np.random.PCG64(5))
    >>> pairs = (np.repeat(np.arange(900), 2), np.tile(["a", "b"], 900))
    >>> out = release(["a", "b"], [900, 900], [900 * 90, 900 * 90],
    ...               lambda found: second_round_weights(*pairs, found, (128, 90)),
    ...               epsilon=1.0, delta=1e-6, bounds=Contribution(2, 1), rng=rng)
    >>> sorted(out.keys.tolist()), out.mechanism
    (['a', 'b'], 'mad2r')
    """
    chosen = plan(epsilon, delta, bounds, selection_share, first_share)
    if chosen is None:
        raise ParameterError(f"no adaptive selection meets delta={delta} at epsilon={epsilon}")
    kind, key_array, count_array, weight_array = ws.inputs(keys, counts, weights)
    rng = resolve_rng(rng)
    first = key_array[ws.selected(weight_array, chosen.first_sigma_squared, chosen.first_tau, rng)]
    second_keys, second_weights = second_round(first)
    second_kind, second_array = as_key_array(second_keys)
    second_weight_array = _count_array(second_weights, second_array.size)
    if second_array.size and second_kind != kind:
        raise ParameterError("round 2's keys are not of the same kind as round 1's")
    if not _unique(second_array):
        raise ParameterError("round 2's keys must be distinct")
    second = second_array[
        ws.selected(second_weight_array, chosen.selection_sigma_squared, chosen.tau, rng)
    ]
    # A round-1 key the round-2 read did not leave out (another database's comparison) is
    # released once: any public set of left-out keys keeps round 2 private, and this is
    # post-processing of both rounds' outputs.
    second = second[~_within(second, first)]
    selected = np.concatenate([first, second])
    import pandas as pd
    position = pd.Index(key_array).get_indexer(selected)
    true = np.zeros(selected.size, dtype=np.int64)
    true[position >= 0] = count_array[position[position >= 0]]
    return ws.counted(
        selected,
        true,
        chosen,
        kind=kind,
        epsilon=epsilon,
        bounds=bounds,
        confidence=confidence,
        mechanism="mad2r",
        rng=rng,
    )


def _within(values: np.ndarray, of: np.ndarray) -> np.ndarray:
    """Membership by hashing (``np.isin`` on object arrays is quadratic-ish)."""
    import pandas as pd
    return pd.Index(of).get_indexer(values) >= 0 if of.size else np.zeros(values.size, bool)


def second_round_weights(
    units: object, keys: object, found: object, weights: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """Round 2's summed weights from (unit, key) pairs already bounded (each unit's kept keys,
    distinct): each unit gives ``w_m`` to each of its ``m`` keys outside ``found``. The engine
    computes the same in SQL; this is the library's (and the tests') way.

    >>> second_round_weights([1, 1, 2], ["a", "b", "b"], ["a"], (128, 90))
    (array(['b'], dtype=object), array([256]))
    """
    unit_array = np.asarray(units)
    _, key_array = as_key_array(keys)
    keep = ~_within(key_array, np.asarray(found, dtype=key_array.dtype))
    unit_array, key_array = unit_array[keep], key_array[keep]
    if not key_array.size:
        return key_array, np.zeros(0, dtype=np.int64)
    import pandas as pd
    unit_index, unit_values = pd.factorize(unit_array)
    per_unit = np.bincount(unit_index, minlength=unit_values.size)
    if per_unit.max() > len(weights):
        raise ParameterError(f"a unit has more than {len(weights)} keys: bound the pairs first")
    given = np.array(weights, dtype=np.int64)[per_unit[unit_index] - 1]
    key_index, distinct = pd.factorize(key_array)
    totals = np.bincount(key_index, weights=given, minlength=distinct.size)
    return np.asarray(distinct, dtype=key_array.dtype), totals.astype(np.int64)
