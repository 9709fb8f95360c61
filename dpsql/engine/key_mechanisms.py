"""Which mechanism releases the keys of a GROUP BY without public keys, when none is named.

With δ > 0 the candidates, at the same (ε, δ) and contribution bounds, are the Laplace threshold
(:mod:`dpsql.mechanisms.threshold`, L1 sensitivity ``min(L0·L∞, R)``), the Gaussian threshold
(:mod:`dpsql.mechanisms.gaussian_threshold`, L2 sensitivity ``√(L∞'·l1)``) and weighted selection
(:mod:`dpsql.mechanisms.weighted_selection`, each person's weights of L2 norm at most W). Each
releases a key with probability at least 1/2 once its statistic reaches τ (symmetric noise), so the
comparison is the number of persons a key needs to be released half the time:

- thresholds: ``τ / r`` persons who each add ``r`` rows to the key;
- weighted: ``τ_w / w_m`` persons who each have ``m`` keys;

with the public reference ``m = ⌈K/2⌉``, ``r = ⌈L∞'/2⌉`` (``K = min(L0, R)`` keys and ``L∞' =
min(L∞, R)`` rows per key allowed per person: persons use half their allowance).

The smallest wins (ties: Laplace, then Gaussian), except that weighted selection must need at
least :data:`WEIGHTED_MARGIN` fewer persons than the better threshold: its counts are a second,
noisier release, so a marginal gain in keys is not worth them.

When weighted selection wins, its two-round adaptive form (``mad2r``,
:mod:`dpsql.mechanisms.adaptive_selection`) replaces it if (a) in its worst case — round 1
releases none of a person's other keys, so round 2 is weighted selection on 94% of the ρ — it
needs at most :data:`ADAPTIVE_WORST_LOSS` more persons than weighted selection, and (b) at the
public reference where half of those persons' keys are released in round 1 (round 2 gives each of
the remaining ``⌈m/2⌉`` keys ``w_⌈m/2⌉``) it needs at least :data:`WEIGHTED_MARGIN` fewer. Its
gain is data-dependent (how many of a person's keys are heavy) and nothing proves it never
releases fewer keys; (a) bounds what it can lose, (b) says it pays where heavy keys exist, as in
every benchmark table (``docs/partition_selection.md``). On DuckDB its round 2 reads round 1's
ranked cells, kept for the query, not the rows (other backends read the rows again). Everything
is computed from ε, δ and the policy alone, never from the data, and costs no privacy;
``EXPLAIN`` shows the numbers. With δ = 0 (a declared ``key_domain``) only pure-DP mechanisms
qualify: the combined threshold + ALP synopsis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpsql.mechanisms import adaptive_selection, gaussian_threshold, threshold, weighted_selection

__all__ = [
    "ADAPTIVE_DEFAULT",
    "ADAPTIVE_WORST_LOSS",
    "WEIGHTED_MARGIN",
    "DefaultChoice",
    "choose_default",
]

WEIGHTED_MARGIN = 0.1
"""Weighted selection is the default only if it needs at least this share fewer persons."""

ADAPTIVE_WORST_LOSS = 0.05
"""mad2r replaces weighted selection only if its worst case needs at most this share more."""

ADAPTIVE_DEFAULT = True
"""Whether the default may pick mad2r (False: weighted selection, one round and no kept cells)."""


@dataclass(frozen=True)
class DefaultChoice:
    """The mechanism chosen for a δ > 0 key release and the numbers that chose it."""

    mechanism: str
    needed: dict[str, float]
    """Persons a key needs to be released half the time, per candidate mechanism."""
    reference_keys: int
    reference_rows: int = 1

    def why(self) -> str:
        listed = ", ".join(f"{name} {value:.4g}" for name, value in self.needed.items())
        return (
            f"default: {self.mechanism}, the fewest persons a key needs to be released at least "
            f"half the time at equal (epsilon, delta) and bounds ({listed}; weighted assumes "
            f"persons with {self.reference_keys} keys each, thresholds persons adding "
            f"{self.reference_rows} rows, and weighted must need "
            f"{WEIGHTED_MARGIN:.0%} fewer, its counts being noisier"
            + (
                f"; mad2r at the reference with half of those keys released in round 1, "
                f"mad2r_worst with none, at most {ADAPTIVE_WORST_LOSS:.0%} above weighted)"
                if "mad2r" in self.needed
                else ")"
            )
        )


def choose_default(epsilon: float, delta: float, bounds: threshold.Contribution) -> DefaultChoice:
    """The δ > 0 default (module doc).

    >>> choose_default(1.0, 1e-6, threshold.Contribution(10, 1, 10)).mechanism
    'mad2r'
    >>> choose_default(1.0, 1e-6, threshold.Contribution(1, 1)).mechanism
    'threshold'
    """
    rows = math.ceil(bounds.per_key / 2)
    needed: dict[str, float] = {
        "threshold": (
            threshold.tau_for_delta(
                epsilon=epsilon,
                delta=delta,
                max_groups_per_unit=bounds.max_groups_per_unit,
                max_rows_per_group=bounds.max_rows_per_group,
                max_rows_per_unit=bounds.max_rows_per_unit,
            )
            / rows
        )
    }
    gaussian = gaussian_threshold.plan(epsilon, delta, bounds)
    if gaussian is not None:
        needed["threshold_gaussian"] = gaussian.tau / rows
    reference = math.ceil(bounds.new_keys / 2)
    if bounds.new_keys > 1:
        weighted = weighted_selection.plan(epsilon, delta, bounds)
        if weighted is not None:
            needed["weighted"] = weighted.units_needed(reference)
    thresholds = {name: value for name, value in needed.items() if name != "weighted"}
    chosen = min(thresholds, key=lambda name: (thresholds[name], list(needed).index(name)))
    if needed.get("weighted", math.inf) <= (1 - WEIGHTED_MARGIN) * needed[chosen]:
        chosen = "weighted"
        adaptive = adaptive_selection.plan(epsilon, delta, bounds) if ADAPTIVE_DEFAULT else None
        if adaptive is not None:
            needed["mad2r"] = adaptive.units_needed(math.ceil(reference / 2))
            needed["mad2r_worst"] = adaptive.units_needed(reference)
            if needed["mad2r_worst"] <= (1 + ADAPTIVE_WORST_LOSS) * needed["weighted"] and (
                needed["mad2r"] <= (1 - WEIGHTED_MARGIN) * needed["weighted"]
            ):
                chosen = "mad2r"
    return DefaultChoice(chosen, needed, reference, rows)
