"""Counter-based shared randomness: Philox4x64-10 evaluated on whole NumPy arrays.

Philox (Salmon et al., SC'11, "Parallel random numbers: as easy as 1, 2, 3") maps a 256-bit
counter and a 128-bit key to 256 pseudo-random bits; any counter is evaluated in O(1), which is
what lets a compressed randomized-response message be decoded one entry at a time (Hillebrand et
al., Sec. 2.2, Thm 2). ``numpy.random.Philox`` runs the same function one counter at a time (and
first increments its counter); :func:`philox4x64` runs it on arrays of counters and keys, and the
tests check it word for word against NumPy. Keeping our own copy also pins the stream: stored
releases decode identically whatever NumPy version later reads them.

>>> import numpy as np
>>> words = philox4x64((np.uint64(0),) * 4, (np.uint64(0), np.uint64(0)))
>>> hex(int(words[0][0]))  # the Random123 known-answer vector for a zero counter and key
'0x16554d9eca36314c'
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["philox4x64", "uniform53"]

_M0 = 0xD2E7470EE14C6C93
_M1 = 0xCA5A826395121157
_W0 = np.uint64(0x9E3779B97F4A7C15)
_W1 = np.uint64(0xBB67AE8584CAA73B)
_LOW32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)
_SHIFT11 = np.uint64(11)

UInt64Array = npt.NDArray[np.uint64]


def _mulhilo(a: UInt64Array, multiplier: int) -> tuple[UInt64Array, UInt64Array]:
    """High and low 64-bit halves of ``a * multiplier`` (a 128-bit product), from 32-bit limbs."""
    m_lo = np.uint64(multiplier & 0xFFFFFFFF)
    m_hi = np.uint64(multiplier >> 32)
    a_lo = a & _LOW32
    a_hi = a >> _SHIFT32
    ll = a_lo * m_lo
    lh = a_lo * m_hi
    hl = a_hi * m_lo
    middle = (ll >> _SHIFT32) + (lh & _LOW32) + (hl & _LOW32)
    high = a_hi * m_hi + (lh >> _SHIFT32) + (hl >> _SHIFT32) + (middle >> _SHIFT32)
    return high, a * np.uint64(multiplier)


_SMALL = 32  # below this many elements, Python integers beat ~350 NumPy calls of fixed overhead
_MASK = (1 << 64) - 1


def _philox_scalar(x0: int, x1: int, x2: int, x3: int, k0: int, k1: int, rounds: int):
    """Philox4x64 on Python integers (exact 128-bit products)."""
    for round_index in range(rounds):
        if round_index:
            k0 = (k0 + 0x9E3779B97F4A7C15) & _MASK
            k1 = (k1 + 0xBB67AE8584CAA73B) & _MASK
        product0 = _M0 * x0
        product1 = _M1 * x2
        x0, x1, x2, x3 = (
            (product1 >> 64) ^ x1 ^ k0,
            product1 & _MASK,
            (product0 >> 64) ^ x3 ^ k1,
            product0 & _MASK,
        )
    return x0, x1, x2, x3


def philox4x64(
    counter: tuple[npt.ArrayLike, npt.ArrayLike, npt.ArrayLike, npt.ArrayLike],
    key: tuple[npt.ArrayLike, npt.ArrayLike],
    rounds: int = 10,
) -> tuple[UInt64Array, UInt64Array, UInt64Array, UInt64Array]:
    """The four output words of Philox4x64 for broadcastable arrays of counter and key words.

    Equal to ``numpy.random.Philox(counter=c - 1, key=k).random_raw(4)`` for each element (NumPy
    increments the counter before its first block). All arithmetic is modulo 2**64.
    """
    arrays = np.broadcast_arrays(*(np.asarray(w, dtype=np.uint64) for w in (*counter, *key)))
    if arrays[0].size <= _SMALL:
        shape = arrays[0].shape if arrays[0].ndim else (1,)
        columns = zip(*(a.ravel().tolist() for a in arrays), strict=True)
        blocks = [_philox_scalar(*column, rounds) for column in columns]
        words = np.array(blocks, dtype=np.uint64).reshape(-1, 4)
        return tuple(words[:, i].reshape(shape) for i in range(4))  # type: ignore[return-value]
    x0, x1, x2, x3, k0, k1 = (np.array(w, dtype=np.uint64, ndmin=1) for w in arrays)
    with np.errstate(over="ignore"):
        for round_index in range(rounds):
            if round_index:
                k0 = k0 + _W0
                k1 = k1 + _W1
            hi0, lo0 = _mulhilo(x0, _M0)
            hi1, lo1 = _mulhilo(x2, _M1)
            x0, x1, x2, x3 = hi1 ^ x1 ^ k0, lo1, hi0 ^ x3 ^ k1, lo0
    return x0, x1, x2, x3


def uniform53(word: UInt64Array) -> UInt64Array:
    """The top 53 bits of a word: an integer uniform on ``[0, 2**53)``."""
    return word >> _SHIFT11
