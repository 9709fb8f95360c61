"""The combined structure's split of ε and α come from the sensitivity, not from fixed halves."""

from __future__ import annotations

import numpy as np
import pytest

from dpsql.mechanisms import combined, sketch_split, threshold


def test_the_sketch_cannot_help_at_the_benchmark_sensitivity() -> None:
    """L0 = 10, L∞ = 1, ε = 1, δ = 1e-6 (benchmarks/bench_histogram.py): the sketch's error bound
    exceeds the interval of answering 0, so the threshold gets 0.95 of ε, not half."""
    choice = sketch_split.choose(1.0, 1e-6, threshold.Contribution(10, 1, 10), None, 0.1, 0.95)
    assert not choice.sketch_helps and choice.split == 0.95
    half = threshold.tau_for_delta(
        epsilon=0.5, delta=1e-6, max_groups_per_unit=10, max_rows_per_group=1
    )
    assert choice.tau < 0.6 * half  # nearly the threshold's own τ, instead of ε/2's


@pytest.mark.parametrize(
    ("bounds", "delta", "domain"),
    [
        (threshold.Contribution(1, 1), 0.0, threshold.HashDomain()),
        (threshold.Contribution(2, 1, 5), 0.0, threshold.HashDomain()),
        (threshold.Contribution(1, 1), 0.0, threshold.IntegerDomain(0, 2**62)),
    ],
)
def test_the_largest_split_at_which_the_sketch_clearly_beats_zero(
    bounds: threshold.Contribution, delta: float, domain: threshold.Domain | None
) -> None:
    choice = sketch_split.choose(1.0, delta, bounds, domain, 0.1, 0.95)
    assert choice.sketch_helps and choice.sketch_error_bound <= choice.unreleased_ceiling / 2
    larger = [s for s in sketch_split.SPLITS if s > choice.split]
    if larger:  # the next larger share no longer leaves the sketch clearly better than 0
        step = bounds.l1 / ((1 - larger[0]) * 1.0)
        best = min(sketch_split._steps(a, 0.1) for a in sketch_split.ALPHAS)
        tau = sketch_split._tau(larger[0], delta, bounds, domain)
        scale = threshold.noise_scale_for(
            epsilon=larger[0],
            max_groups_per_unit=bounds.max_groups_per_unit,
            max_rows_per_group=bounds.max_rows_per_group,
            max_rows_per_unit=bounds.max_rows_per_unit,
        )
        ceiling = threshold.count_released_with_probability(tau, scale, 0.95) - 1
        assert best * step > ceiling / 2


def test_the_choice_matches_the_released_structure() -> None:
    """The τ, error bound and ceiling the planner shows are those of the structure released."""
    bounds = threshold.Contribution(1, 1)
    domain = threshold.IntegerDomain(0, 2**62)
    choice = sketch_split.choose(1.0, 0.0, bounds, domain, 0.1, 0.95)
    out = combined.release(
        np.arange(100),
        np.arange(100) * 3,
        epsilon=1.0,
        split=choice.split,
        alpha=choice.alpha,
        domain=domain,
        s=1000,
        rng=np.random.Generator(np.random.PCG64(4)),
    )
    answer = out.answer([5], confidence=0.95, keys_per_row=0.1)
    assert out.threshold.tau == choice.tau
    assert answer.unreleased_ceiling == choice.unreleased_ceiling
    assert answer.sketch_error_bound == pytest.approx(choice.sketch_error_bound)
    assert answer.sketch_beats_zero == choice.sketch_helps
