"""Which mechanism releases the keys of a GROUP BY without public keys, when none is named.

With δ > 0 the candidates, at the same (ε, δ) and contribution bounds, are the Laplace threshold
(:mod:`dpsql.mechanisms.threshold`, L1 sensitivity ``min(L0·L∞, R)``), the Gaussian threshold
(:mod:`dpsql.mechanisms.gaussian_threshold`, L2 sensitivity ``√(L∞'·l1)``), joint selection
(:mod:`dpsql.mechanisms.joint_selection`: noisy weights and noisy counts decide each key
together), weighted selection (:mod:`dpsql.mechanisms.weighted_selection`) and its two-round
adaptive form ``mad2r`` (:mod:`dpsql.mechanisms.adaptive_selection`). Two numbers describe each,
from ε, δ and the policy alone (never the data):

- **keys**: the persons a key needs to be released at least half the time, at a public reference
  (persons with ``m = ⌈K/2⌉`` keys each, each adding ``r = ⌈L∞'/2⌉`` rows to the key: persons use
  half their allowance; ``K = min(L0, R)``, ``L∞' = min(L∞, R)``). Fewer persons, more keys.
- **count error**: the mean absolute error of a released count, ``E|noise|`` of the counts' noise
  (discrete Laplace or discrete Gaussian, exact).

The default (``prefer`` unset) is the mechanism needing the fewest persons among those whose count
error is at most :data:`COUNT_ERROR_SLACK` times the best count error at the query's (ε, δ) (the
better of the two thresholds, which spend the whole budget on the counts). Joint selection enters
with the largest share of ρ on the weights that keeps its count error within that bound; weighted
selection and ``mad2r`` spend most of ρ on weights that are not counts, and at a share that met the
bound they would decide on less than joint selection does with the same noises (it also uses the
counts), so they are not candidates of the default. ``OPTIONS(prefer='keys')`` moves to the end of
the frontier with the most keys (weighted selection or ``mad2r``, by the rule below),
``prefer='counts'`` to the end with the best counts (the threshold with the smallest count error).

The most keys (``prefer='keys'``): the fewest persons among the thresholds and weighted selection
(ties: Laplace, then Gaussian), except that weighted selection must need at least
:data:`WEIGHTED_MARGIN` fewer persons than the better threshold. When weighted selection wins,
``mad2r`` replaces it if (a) in its worst case — round 1 releases none of a person's other keys,
so round 2 is weighted selection on 94% of the ρ — it needs at most :data:`ADAPTIVE_WORST_LOSS`
more persons than weighted selection, and (b) at the public reference where half of those
persons' keys are released in round 1 it needs at least :data:`WEIGHTED_MARGIN` fewer. Its gain
is data-dependent and nothing proves it never releases fewer keys; (a) bounds what it can lose.

``EXPLAIN`` shows, for every candidate, the persons needed half the time and with the query's
confidence, and the count error. With δ = 0 (a declared ``key_domain``) only pure-DP mechanisms
qualify: the combined threshold + ALP synopsis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from dpsql.errors import ParameterError

if TYPE_CHECKING:
    from dpsql.mechanisms.threshold import Contribution

__all__ = [
    "ADAPTIVE_DEFAULT",
    "ADAPTIVE_WORST_LOSS",
    "COUNT_ERROR_SLACK",
    "PREFERENCES",
    "WEIGHTED_MARGIN",
    "Candidate",
    "DefaultChoice",
    "candidates",
    "choose_default",
]

WEIGHTED_MARGIN = 0.1
"""With ``prefer='keys'``, weighted selection must need at least this share fewer persons."""

ADAPTIVE_WORST_LOSS = 0.05
"""mad2r replaces weighted selection only if its worst case needs at most this share more."""

ADAPTIVE_DEFAULT = True
"""Whether ``prefer='keys'`` may pick mad2r (False: weighted selection, one round)."""

COUNT_ERROR_SLACK = 1.3
"""The default's count error is at most this times the best count error at the query's (ε, δ)."""

PREFERENCES = ("keys", "counts")
"""What ``OPTIONS(prefer=...)`` may name: the end of the keys/counts frontier to move to."""

_SHARES = (0.02, 0.05, 0.1, 0.2, 0.4, 0.8)
"""Joint selection's weights shares tried first (then bisection to 0.01 above the largest that
meets the count error)."""


@dataclass(frozen=True)
class Candidate:
    """One key mechanism at a query's (ε, δ) and bounds, at the public reference."""

    mechanism: str
    count_error: float
    """Mean absolute error of a released count (``E|noise|``)."""
    persons_half: float
    """Persons (``keys_each`` keys, ``rows_each`` rows to the key each) whose key is released
    half the time (fractional: the statistic's mean reaches τ)."""
    selection_share: float | None = None
    """The weights' share of ρ (joint, weighted, mad2r)."""
    plan: Any = field(default=None, compare=False, repr=False)
    """The mechanism's plan (its persons at other probabilities are computed from it)."""

    def persons_released_with_probability(
        self, probability: float, keys_each: int, rows_each: int
    ) -> int:
        """The fewest persons whose key is released with at least ``probability``."""
        from dpsql.mechanisms import threshold

        if self.mechanism == "threshold":
            tau, scale = self.plan
            count = threshold.count_released_with_probability(tau, scale, probability)
            return max(1, math.ceil(count / rows_each))
        if self.mechanism == "threshold_gaussian":
            count = self.plan.count_released_with_probability(probability)
            return max(1, math.ceil(count / rows_each))
        if self.mechanism == "joint":
            return self.plan.persons_released_with_probability(probability, keys_each, rows_each)
        return self.plan.persons_released_with_probability(probability, keys_each)

    def shown(self, keys_each: int, rows_each: int, confidence: float) -> dict[str, Any]:
        """What ``EXPLAIN`` shows for this candidate."""
        shown: dict[str, Any] = {
            "persons_released_half_the_time": self.persons_released_with_probability(
                0.5, keys_each, rows_each
            ),
            f"persons_released_with_probability_{confidence:g}": (
                self.persons_released_with_probability(confidence, keys_each, rows_each)
            ),
            "count_error": round(self.count_error, 3),
        }
        if self.selection_share is not None:
            shown["selection_share"] = self.selection_share
        return shown


@dataclass(frozen=True)
class DefaultChoice:
    """The mechanism chosen for a δ > 0 key release and the numbers that chose it."""

    mechanism: str
    needed: dict[str, float]
    """Persons a key needs to be released half the time, per candidate mechanism."""
    reference_keys: int
    reference_rows: int = 1
    errors: dict[str, float] = field(default_factory=dict)
    """Mean absolute error of a released count, per candidate mechanism."""
    prefer: str | None = None
    selection_share: float | None = None
    """The chosen mechanism's weights share of ρ, when it has one."""

    def why(self) -> str:
        listed = ", ".join(
            f"{name} {value:.4g}"
            + (f" (count error {self.errors[name]:.3g})" if name in self.errors else "")
            for name, value in self.needed.items()
        )
        reference = (
            f"persons with {self.reference_keys} keys each adding {self.reference_rows} rows "
            "to the key"
        )
        if self.prefer == "counts":
            return (
                f"prefer='counts': {self.mechanism}, the smallest count error at equal "
                f"(epsilon, delta) and bounds (persons needed half the time: {listed}; "
                f"{reference})"
            )
        if self.prefer == "keys":
            return (
                f"prefer='keys': {self.mechanism}, the fewest persons a key needs to be "
                f"released at least half the time ({listed}; {reference}; weighted must need "
                f"{WEIGHTED_MARGIN:.0%} fewer"
                + (
                    f"; mad2r at the reference with half of those keys released in round 1, "
                    f"mad2r_worst with none, at most {ADAPTIVE_WORST_LOSS:.0%} above weighted)"
                    if "mad2r" in self.needed
                    else ")"
                )
            )
        return (
            f"default: {self.mechanism}, the fewest persons a key needs to be released at "
            f"least half the time among mechanisms whose count error is at most "
            f"{COUNT_ERROR_SLACK:g} times the best ({listed}; {reference}; joint selection at "
            "the largest weights share within that bound; prefer='keys' or 'counts' moves "
            "along the frontier)"
        )


def _reference(bounds: Contribution) -> tuple[int, int]:
    """(keys each, rows each) of the public reference person."""
    return max(1, math.ceil(bounds.new_keys / 2)), max(1, math.ceil(bounds.per_key / 2))


@lru_cache(maxsize=128)
def candidates(epsilon: float, delta: float, bounds: Contribution) -> tuple[Candidate, ...]:
    """Every key mechanism that meets (ε, δ) for ``bounds``, as the default rule sees it (the
    weighted ones at their default share; joint selection at the largest share whose count
    error is within :data:`COUNT_ERROR_SLACK` of the best)."""
    from dpsql.mechanisms import (
        adaptive_selection,
        gaussian_threshold,
        laplace,
        threshold,
        weighted_selection,
    )
    from dpsql.mechanisms import discrete_gaussian as dg

    keys_each, rows_each = _reference(bounds)
    limits = {
        "max_groups_per_unit": bounds.max_groups_per_unit,
        "max_rows_per_group": bounds.max_rows_per_group,
        "max_rows_per_unit": bounds.max_rows_per_unit,
    }
    tau = threshold.tau_for_delta(epsilon=epsilon, delta=delta, **limits)
    scale = threshold.noise_scale_for(epsilon=epsilon, **limits)
    found = [
        Candidate("threshold", laplace.expected_abs(scale), tau / rows_each, None, (tau, scale))
    ]
    gaussian = gaussian_threshold.plan(epsilon, delta, bounds)
    if gaussian is not None:
        found.append(
            Candidate(
                "threshold_gaussian",
                dg.expected_abs(gaussian.sigma_squared),
                gaussian.tau / rows_each,
                None,
                gaussian,
            )
        )
    if bounds.new_keys > 1:
        best = min(c.count_error for c in found)
        joint = _joint_within(epsilon, delta, bounds, COUNT_ERROR_SLACK * best)
        if joint is not None:
            found.append(
                Candidate(
                    "joint",
                    dg.expected_abs(joint.count_sigma_squared),
                    joint.units_needed(keys_each, rows_each),
                    joint.selection_share,
                    joint,
                )
            )
        weighted = weighted_selection.plan(epsilon, delta, bounds)
        if weighted is not None:
            found.append(
                Candidate(
                    "weighted",
                    dg.expected_abs(weighted.count_sigma_squared),
                    weighted.units_needed(keys_each),
                    weighted.selection_share,
                    weighted,
                )
            )
        adaptive = adaptive_selection.plan(epsilon, delta, bounds) if ADAPTIVE_DEFAULT else None
        if adaptive is not None:
            found.append(
                Candidate(
                    "mad2r",
                    dg.expected_abs(adaptive.count_sigma_squared),
                    adaptive.units_needed(math.ceil(keys_each / 2)),
                    adaptive.selection_share,
                    adaptive,
                )
            )
    return tuple(found)


def _joint_within(epsilon: float, delta: float, bounds: Contribution, error: float) -> Any:
    """Joint selection at the largest weights share (to 0.01, at most 0.8) whose count error is
    at most ``error``; None when no share meets it."""
    from dpsql.mechanisms import discrete_gaussian as dg
    from dpsql.mechanisms import joint_selection

    def within(share: float) -> Any:
        chosen = joint_selection.plan(epsilon, delta, bounds, share)
        if chosen is None or dg.expected_abs(chosen.count_sigma_squared) > error:
            return None
        return chosen

    # Feasibility (σ_w² within the sampler's range) improves with the share, the count error
    # worsens: the largest passing share of a coarse grid, then bisection towards the next.
    passing = [share for share in _SHARES if within(share) is not None]
    if not passing:
        return None
    low = max(passing)
    higher = [share for share in _SHARES if share > low]
    found = within(low)
    if not higher:
        return found
    high = min(higher)
    while high - low > 0.01:
        middle = round((low + high) / 2, 3)
        chosen = within(middle)
        if chosen is None:
            high = middle
        else:
            low, found = middle, chosen
    return found


def choose_default(
    epsilon: float, delta: float, bounds: Contribution, prefer: str | None = None
) -> DefaultChoice:
    """The δ > 0 mechanism (module doc), ``prefer`` naming an end of the frontier or None.

    >>> from dpsql.mechanisms.threshold import Contribution
    >>> choose_default(1.0, 1e-6, Contribution(10, 1, 10)).mechanism
    'joint'
    >>> choose_default(1.0, 1e-6, Contribution(10, 1, 10), prefer="keys").mechanism
    'mad2r'
    >>> choose_default(1.0, 1e-6, Contribution(1, 1)).mechanism
    'threshold'
    """
    if prefer is not None and prefer not in PREFERENCES:
        raise ParameterError(
            f"prefer must be one of {', '.join(repr(p) for p in PREFERENCES)}, got {prefer!r}"
        )
    found = {c.mechanism: c for c in candidates(epsilon, delta, bounds)}
    keys_each, rows_each = _reference(bounds)
    thresholds = [found[name] for name in ("threshold", "threshold_gaussian") if name in found]
    best_error = min(c.count_error for c in thresholds)
    if prefer == "counts":
        chosen = min(thresholds, key=lambda c: (c.count_error, c.persons_half))
        shown = thresholds
    elif prefer == "keys":
        return _most_keys(found, keys_each, rows_each)
    else:
        shown = [c for c in found.values() if c.mechanism in ("threshold", "threshold_gaussian")]
        shown += [c for c in found.values() if c.mechanism == "joint"]
        eligible = [c for c in shown if c.count_error <= COUNT_ERROR_SLACK * best_error]
        chosen = min(eligible, key=lambda c: c.persons_half)  # ties: the order above
    return DefaultChoice(
        chosen.mechanism,
        {c.mechanism: c.persons_half for c in shown},
        keys_each,
        rows_each,
        {c.mechanism: c.count_error for c in shown},
        prefer,
        chosen.selection_share,
    )


def _most_keys(found: dict[str, Candidate], keys_each: int, rows_each: int) -> DefaultChoice:
    """``prefer='keys'`` (module doc)."""
    needed = {n: found[n].persons_half for n in ("threshold", "threshold_gaussian") if n in found}
    errors = {n: found[n].count_error for n in needed}
    chosen = min(needed, key=lambda name: (needed[name], list(needed).index(name)))
    weighted = found.get("weighted")
    if weighted is not None:
        needed["weighted"] = weighted.persons_half
        errors["weighted"] = weighted.count_error
    if weighted is not None and weighted.persons_half <= (1 - WEIGHTED_MARGIN) * needed[chosen]:
        chosen = "weighted"
        adaptive = found.get("mad2r")
        if adaptive is not None:
            needed["mad2r"] = adaptive.persons_half
            needed["mad2r_worst"] = adaptive.plan.units_needed(keys_each)
            errors["mad2r"] = adaptive.count_error
            if needed["mad2r_worst"] <= (1 + ADAPTIVE_WORST_LOSS) * needed["weighted"] and (
                needed["mad2r"] <= (1 - WEIGHTED_MARGIN) * needed["weighted"]
            ):
                chosen = "mad2r"
    share = found[chosen].selection_share if chosen in found else None
    return DefaultChoice(chosen, needed, keys_each, rows_each, errors, "keys", share)
