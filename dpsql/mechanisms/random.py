"""Randomness for mechanisms: a cryptographically secure NumPy generator by default.

Mechanisms take ``rng: numpy.random.Generator | None``. ``None`` means a fresh generator backed by
ChaCha20 (20 rounds, from ``randomgen``) keyed with 256 bits from the operating system's CSPRNG, so
every draw a mechanism makes in normal use comes from a cryptographically secure stream. Tests pass
a seeded generator to the mechanism functions to make runs reproducible.

Sessions take no generator from their caller: an analyst who chose the generator could replay
every draw. ``_seeded_for_tests`` is the one internal hook that makes a session reproducible; it is
for dpsql's own tests and benchmarks, not part of the API.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
from randomgen import ChaCha

__all__ = ["resolve_rng", "secure_generator", "session_generator"]

_TEST_GENERATOR: ContextVar[np.random.Generator | None] = ContextVar(
    "_dpsql_test_generator", default=None
)


def secure_generator() -> np.random.Generator:
    """A ``numpy.random.Generator`` over ChaCha20 keyed from ``secrets`` (the OS CSPRNG)."""
    return np.random.Generator(ChaCha(seed=secrets.randbits(256), rounds=20))


def resolve_rng(rng: np.random.Generator | None) -> np.random.Generator:
    """The caller's generator when given (reproducible tests), else a secure one."""
    if rng is None:
        return secure_generator()
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator or None, got {type(rng).__name__}")
    return rng


def session_generator() -> np.random.Generator:
    """The generator a new session draws from: secure, unless a test set one (see module)."""
    generator = _TEST_GENERATOR.get()
    return generator if generator is not None else secure_generator()


@contextmanager
def _seeded_for_tests(generator: np.random.Generator) -> Iterator[None]:
    """Internal, for dpsql's tests: sessions created inside draw from ``generator``."""
    token = _TEST_GENERATOR.set(generator)
    try:
        yield
    finally:
        _TEST_GENERATOR.reset(token)
