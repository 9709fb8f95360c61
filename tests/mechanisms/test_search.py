"""The integer searches against a scan over every integer."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dpsql.mechanisms.search import least_above, least_between


@given(st.integers(-1000, 1000), st.integers(1, 500), st.integers(1, 64))
def test_least_above_finds_the_first_integer_that_fits(low: int, gap: int, step: int) -> None:
    answer = low + gap
    calls: list[int] = []

    def fits(value: int) -> bool:
        calls.append(value)
        return value >= answer

    assert least_above(fits, low, step) == answer
    assert min(calls) > low  # never asks below where it starts
    assert len(calls) <= 2 * (gap.bit_length() + 2) + 1  # doubling, then bisection


@given(st.integers(-1000, 1000), st.integers(1, 2000), st.data())
def test_least_between_finds_the_first_integer_that_fits(low: int, width: int, data) -> None:
    high = low + width
    answer = data.draw(st.integers(low + 1, high))
    assert least_between(lambda value: value >= answer, low, high) == answer
