"""Randomness for mechanisms: a cryptographically secure NumPy generator by default.

Mechanisms take ``rng: numpy.random.Generator | None``. ``None`` means a fresh generator backed by
ChaCha20 (20 rounds, from ``randomgen``) keyed with 256 bits from the operating system's CSPRNG, so
every draw a mechanism makes in normal use comes from a cryptographically secure stream. Tests pass
a seeded generator to make runs reproducible.
"""

from __future__ import annotations

import secrets

import numpy as np
from randomgen import ChaCha

__all__ = ["resolve_rng", "secure_generator"]


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
