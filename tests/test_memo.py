"""Results kept for recurring inputs: plain values by value, other objects by identity."""

from __future__ import annotations

from dpsql.memo import Kept


def test_values_by_value_objects_by_identity_and_a_bounded_size() -> None:
    kept: Kept[int] = Kept(size=3)
    calls: list[object] = []

    def make(value: int):
        return lambda: calls.append(value) or value

    first, twin = [1, 2], [1, 2]  # equal, not the same object
    assert kept.get((first, "a", 0.5), make(1)) == 1
    assert kept.get((first, "a", 0.5), make(2)) == 1  # same object, equal values
    assert kept.get((twin, "a", 0.5), make(3)) == 3  # an equal object is another input
    assert kept.get((first, "a", 1), make(4)) == 4  # 1 and 0.5 differ
    assert kept.get((first, "a", True), make(5)) == 5  # True is not 1
    assert calls == [1, 3, 4, 5]
    assert len(kept._kept) <= 3  # the fourth result cleared the others first
    assert kept.get((first, "a", 0.5), make(6)) == 6
