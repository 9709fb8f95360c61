"""Which mechanism releases the keys of a GROUP BY without public keys, when none is named.

With δ > 0, the candidates are the Laplace threshold (:mod:`dpsql.mechanisms.threshold`, L1
sensitivity ``min(L0·L∞, R)``) and the Gaussian threshold (:mod:`dpsql.mechanisms.
gaussian_threshold`, L2 sensitivity ``sqrt(L∞'·l1)``, ``√L0·L∞`` without R), at the same (ε, δ) and
bounds. Both release a key with true count ``c`` with probability ``P(c + Z >= τ)``, at least 1/2
exactly when ``c >= τ`` (both noises are symmetric), so the one with the smaller τ releases every
key the other releases half the time, and more: the default is the smaller τ (ties: Laplace, which
is pure ε-DP on the released counts). The choice is computed from ε, δ and the policy's bounds
alone, never from the data, and costs no privacy. ``EXPLAIN`` shows both τ's.

With δ = 0 (a declared ``key_domain``) only pure-DP mechanisms qualify: the combined threshold +
ALP synopsis, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpsql.mechanisms import gaussian_threshold, threshold

__all__ = ["DefaultChoice", "choose_default"]


@dataclass(frozen=True)
class DefaultChoice:
    """The mechanism chosen for a δ > 0 key release and why."""

    mechanism: str
    laplace_tau: int
    gaussian: gaussian_threshold.GaussianThreshold | None

    def why(self) -> str:
        if self.gaussian is None:
            return (
                f"default: Laplace threshold (tau = {self.laplace_tau}); no discrete Gaussian "
                "meets delta at this epsilon within sigma <= 32768"
            )
        name = "Gaussian" if self.mechanism == "threshold_gaussian" else "Laplace"
        return (
            f"default: {name} threshold, the smaller tau at equal (epsilon, delta) and bounds "
            f"(Laplace tau = {self.laplace_tau}, Gaussian tau = {self.gaussian.tau}); a key "
            "whose bounded count reaches tau is released at least half the time, so the smaller "
            "tau releases more keys"
        )


def choose_default(epsilon: float, delta: float, bounds: threshold.Contribution) -> DefaultChoice:
    """The δ > 0 default (module doc).

    >>> choose_default(1.0, 1e-6, threshold.Contribution(10, 1, 10)).mechanism
    'threshold_gaussian'
    >>> choose_default(1.0, 1e-6, threshold.Contribution(1, 1)).mechanism
    'threshold'
    """
    laplace_tau = threshold.tau_for_delta(
        epsilon=epsilon,
        delta=delta,
        max_groups_per_unit=bounds.max_groups_per_unit,
        max_rows_per_group=bounds.max_rows_per_group,
        max_rows_per_unit=bounds.max_rows_per_unit,
    )
    gaussian = gaussian_threshold.plan(epsilon, delta, bounds)
    better = gaussian is not None and gaussian.tau < laplace_tau
    return DefaultChoice("threshold_gaussian" if better else "threshold", laplace_tau, gaussian)
