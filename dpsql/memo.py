"""Results kept for inputs that recur unchanged: a query asked again keeps its bound shape, plan
and generated SQL fragments as the same objects, so what was computed from them once is not
computed again.

:class:`Kept` keys each result by its inputs: plain values (numbers, text, bytes, None) by
value, any other object by its identity, which is safe only for objects nobody changes (bound
shapes, plans, policies and converted keys are never changed once made). It holds the objects
it keys by, so no other object can take their identity while it keeps them, and forgets
everything once it holds ``size`` results (a bound on memory, not an LRU: what recurs is
computed again once).

>>> kept = Kept(size=2)
>>> made = []
>>> kept.get(("a", 1), lambda: made.append(1) or "x"), kept.get(("a", 1), lambda: "y"), made
('x', 'x', [1])
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["Kept"]

T = TypeVar("T")

_BY_VALUE = (str, bytes, int, float, bool, type(None))


def _key(inputs: tuple[object, ...]) -> tuple[Hashable, ...]:
    return tuple((type(part), part) if isinstance(part, _BY_VALUE) else id(part) for part in inputs)


class Kept(Generic[T]):
    """Results by their inputs (module doc); at most ``size`` of them."""

    def __init__(self, size: int = 256):
        self.size = size
        self._kept: dict[tuple[Hashable, ...], tuple[tuple[object, ...], T]] = {}

    def get(self, inputs: tuple[object, ...], make: Callable[[], T]) -> T:
        """The result kept for ``inputs``, else ``make()`` (kept; an exception keeps nothing)."""
        found = self._kept.get(_key(inputs))
        if found is not None:
            return found[1]
        result = make()
        self.put(inputs, result)
        return result

    def find(self, inputs: tuple[object, ...]) -> T | None:
        """The result kept for ``inputs``, or None."""
        found = self._kept.get(_key(inputs))
        return None if found is None else found[1]

    def known(self, inputs: tuple[object, ...]) -> bool:
        """Whether a result is kept for ``inputs`` (None included)."""
        return _key(inputs) in self._kept

    def put(self, inputs: tuple[object, ...], result: T) -> None:
        """Keep ``result`` for ``inputs`` (in place of any result kept for them)."""
        key = _key(inputs)
        if key not in self._kept and len(self._kept) >= self.size:
            self._kept.clear()
        self._kept[key] = (inputs, result)

    def clear(self) -> None:
        """Forget every result."""
        self._kept.clear()
