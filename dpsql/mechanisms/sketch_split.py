"""How the combined structure shares ε between its threshold and its ALP sketch.

The sketch answers a key the threshold did not release. Such a key's true count lies in ``[0, c*
- 1]`` at the confidence level, ``c*`` being the smallest count the threshold releases with that
probability (:meth:`dpsql.mechanisms.combined.CombinedRelease.answer`), so answering 0 errs by at
most ``c* - 1``. The sketch's expected error is at most ``F(α, k/s) · α'Δ/ε_sketch``
(:func:`dpsql.mechanisms.alp.error_bound_factor`, full version of Aumüller, Lebeda, Pagh). Both are
known before any data is read, from ε, δ (or the domain) and the contribution bounds alone.

:func:`choose` takes the largest threshold share ``split`` in :data:`SPLITS` at which the best α in
:data:`ALPHAS` gives the sketch an error bound at most half of ``c* - 1`` (it then clearly beats
answering 0), so the threshold releases as many keys as the sketch allows. When no split achieves
that, the sketch cannot help at this sensitivity: the threshold gets :data:`SPLITS`'s largest
share and ``sketch_helps`` says whether the sketch still beats 0 at all (EXPLAIN reports it).
The choice is a function of public parameters only, so it costs no privacy.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from dpsql.mechanisms import alp, threshold

__all__ = ["ALPHAS", "ROWS_PER_KEY", "SPLITS", "SketchChoice", "choose"]

SPLITS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
"""Candidate threshold shares of ε (the paper's ε/2 first)."""

ROWS_PER_KEY = 10
"""Sketch rows per expected key the engine allocates (``s = ROWS_PER_KEY · expected_keys``)."""

ALPHAS = tuple(Fraction(a) for a in ("1", "3/2", "2", "5/2", "3", "10/3", "4", "5", "6", "8"))
"""Candidate ALP accuracy parameters α."""


@dataclass(frozen=True)
class SketchChoice:
    """The chosen split and α, with the facts that decided them."""

    split: float
    alpha: Fraction
    tau: int
    sketch_error_bound: float
    unreleased_ceiling: int
    sketch_helps: bool

    def note(self) -> str:
        """What EXPLAIN says about the sketch."""
        verdict = (
            "the sketch beats answering 0 for keys the threshold does not release"
            if self.sketch_helps
            else "the sketch CANNOT beat answering 0 at this sensitivity: read lookups of "
            "unreleased keys as the interval [0, unreleased_count_at_most]; the threshold gets "
            "most of epsilon"
        )
        return (
            f"threshold share {self.split:g} of epsilon, ALP alpha {float(self.alpha):.3g}: "
            f"sketch expected error at most {self.sketch_error_bound:.3g} vs at most "
            f"{self.unreleased_ceiling} for answering 0; {verdict}"
        )


def _tau(epsilon: float, delta: float, bounds: threshold.Contribution, domain: object) -> int:
    limits = {
        "max_groups_per_unit": bounds.max_groups_per_unit,
        "max_rows_per_group": bounds.max_rows_per_group,
        "max_rows_per_unit": bounds.max_rows_per_unit,
    }
    if delta > 0:
        return threshold.tau_for_delta(epsilon=epsilon, delta=delta, **limits)
    return threshold.tau_for_false_positives(epsilon=epsilon, domain=domain, **limits)


def _steps(alpha: Fraction, keys_per_row: float) -> float:
    """The error bound in units of ``Δ/ε``, at the α the sketch actually uses (``α'``)."""
    used = alp.effective_alpha(alp.flip_probability(alpha))
    return alp.error_bound_factor(used, keys_per_row) * float(used)


@lru_cache(maxsize=256)
def choose(
    epsilon: float,
    delta: float,
    bounds: threshold.Contribution,
    domain: threshold.Domain | None,
    keys_per_row: float,
    confidence: float,
) -> SketchChoice:
    """The split and α for the combined structure at these public parameters (module doc).

    >>> bounds = threshold.Contribution(10, 1)
    >>> choose(1.0, 1e-6, bounds, None, 0.1, 0.95).sketch_helps
    False
    >>> pure = choose(1.0, 0.0, threshold.Contribution(1, 1), threshold.HashDomain(), 0.1, 0.95)
    >>> pure.sketch_helps, pure.split
    (True, 0.5)
    """
    found: SketchChoice | None = None
    for split in SPLITS:
        share = split * epsilon
        tau = _tau(share, delta, bounds, domain)
        scale = threshold.noise_scale_for(
            epsilon=share,
            max_groups_per_unit=bounds.max_groups_per_unit,
            max_rows_per_group=bounds.max_rows_per_group,
            max_rows_per_unit=bounds.max_rows_per_unit,
        )
        ceiling = threshold.count_released_with_probability(tau, scale, confidence) - 1
        step = bounds.l1 / ((1.0 - split) * epsilon)
        error, alpha = min((_steps(a, keys_per_row) * step, a) for a in ALPHAS)
        choice = SketchChoice(split, alpha, tau, error, ceiling, error < ceiling)
        if error <= ceiling / 2:
            found = choice
        elif found is not None:
            break
        last = choice
    return found if found is not None else last
