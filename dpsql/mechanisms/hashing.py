"""Seeded 64-bit key hashes, the ALP hash family, and argument checks shared by sparse mechanisms.

Everything here is a deterministic function of a public 64-bit ``seed`` (stored in every release),
so anyone holding a release can recompute the hash of a candidate key; no data ever enters a seed.

Key hashes (scheme ``KEY_HASH_SCHEME``)
---------------------------------------
``key_seed = seed_words(seed, 1)[0]`` and then

* ``str`` keys: ``pandas.util.hash_array(keys, encoding="utf8", hash_key=f"{key_seed:016x}",
  categorize=False)``, i.e. SipHash-2-4 keyed with those 16 ASCII bytes over the UTF-8 bytes of each
  key, followed by pandas' SplitMix64 finaliser (vectorized in C, no Python loop per key);
* integer keys (their 64-bit two's-complement pattern ``x``): ``mix64(x XOR key_seed)``, a
  bijection, so distinct integers never share a hash.

ALP hash family
---------------
``h_b(x) = ((((A_b · x + C_b) mod 2**64) >> 32) · s) >> 32`` for ``b = 0 .. m-1``:
multiply-add-shift (Dietzfelbinger et al. 1997) on the 64-bit key hash, then Lemire's multiply-shift
range reduction to ``[0, s)``. ``A_b`` (odd) and ``C_b`` are ``seed_words(seed, 2m + 1)[1:]``.
This stands in for the universal family of Alg. 1 (Aumüller, Lebeda, Pagh, CCS'21); with
pseudo-random key hashes the per-bit collision probability of two keys is ≈ ``1/s``.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from numbers import Real
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from dpsql.errors import ParameterError

if TYPE_CHECKING:
    pass

__all__ = [
    "KEY_HASH_SCHEME",
    "HashFamily",
    "KeyKind",
    "as_key_array",
    "hash_keys",
    "mix64",
    "new_seed",
    "pack_header",
    "seed_words",
    "unpack_header",
]

KEY_HASH_SCHEME = "dpsql-keyhash-v1"
"""Name of the key-hash definition above; stored in serialized releases and checked on load."""

KeyKind = Literal["str", "int"]

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def mix64(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on a uint64 array (a bijection of 64-bit words), as a new array."""
    z = np.array(values, dtype=np.uint64, copy=True)
    z ^= z >> np.uint64(30)
    z *= np.uint64(_MIX1)
    z ^= z >> np.uint64(27)
    z *= np.uint64(_MIX2)
    z ^= z >> np.uint64(31)
    return z


def _mix64_int(value: int) -> int:
    z = value & _MASK64
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


def seed_words(seed: int, count: int) -> np.ndarray:
    """The first ``count`` outputs of SplitMix64 started at ``seed`` (uint64; stable forever).

    >>> [hex(int(w)) for w in seed_words(0, 2)]
    ['0xe220a8397b1dcdaf', '0x6e789e6aa1b965f4']
    """
    words = [_mix64_int(seed + (j + 1) * _GOLDEN) for j in range(count)]
    return np.array(words, dtype=np.uint64)


def new_seed(rng: np.random.Generator) -> int:
    """A fresh public 64-bit seed drawn from ``rng`` (data-independent)."""
    return int(rng.integers(0, 2**64, dtype=np.uint64))


def check_seed(seed: object) -> int:
    """``seed`` as an int in ``[0, 2**64)``, or ParameterError."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= seed <= _MASK64:
        raise ParameterError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    return int(seed)


def as_key_array(keys: object, name: str = "keys") -> tuple[KeyKind, np.ndarray]:
    """``keys`` as a 1-d object array of ``str`` or an int64/uint64 array, with its kind.

    >>> as_key_array(["a", "b"])[0], as_key_array(np.array([3, 4], dtype=np.int32))[1].dtype
    ('str', dtype('int64'))
    """
    array = keys if isinstance(keys, np.ndarray) else np.asarray(keys, dtype=object)
    if array.ndim != 1:
        raise ParameterError(f"{name} must be one-dimensional, got shape {array.shape}")
    kind = array.dtype.kind
    if kind == "U":
        return "str", array.astype(object)
    if kind in "iu":
        return "int", array if array.dtype in (np.int64, np.uint64) else array.astype(np.int64)
    if kind == "O":
        import pandas as pd
        inferred = pd.api.types.infer_dtype(array, skipna=False)
        if inferred in ("string", "empty"):
            return "str", array
        if inferred == "integer":
            try:
                return "int", array.astype(np.int64)
            except OverflowError as error:
                raise ParameterError(f"{name} must fit in int64") from error
        raise ParameterError(f"{name} must be all str or all integers, got {inferred} values")
    if array.size == 0:
        raise ParameterError(f"{name} is empty with dtype {array.dtype}; pass an int or str dtype")
    raise ParameterError(f"{name} must hold str or integer keys, got dtype {array.dtype}")


def hash_keys(keys: object, seed: int) -> np.ndarray:
    """The 64-bit key hashes (uint64) of ``keys`` under ``seed``; see the module docstring.

    >>> hash_keys(["example.com"], 1) == hash_keys(np.array(["example.com"]), 1)
    array([ True])
    """
    kind, array = as_key_array(keys)
    key_seed = int(seed_words(check_seed(seed), 1)[0])
    if kind == "str":
        if array.size == 0:
            return np.empty(0, dtype=np.uint64)
        import pandas as pd
        return pd.util.hash_array(
            array, encoding="utf8", hash_key=f"{key_seed:016x}", categorize=False
        )
    return mix64(array.view(np.uint64) ^ np.uint64(key_seed))


@dataclass(frozen=True)
class HashFamily:
    """``m`` hash functions from 64-bit key hashes to ``[0, s)``, defined by a public seed."""

    seed: int
    m: int
    s: int

    @cached_property
    def multipliers(self) -> np.ndarray:
        """``A_0 .. A_{m-1}`` (odd uint64)."""
        return seed_words(self.seed, 2 * self.m + 1)[1::2] | np.uint64(1)

    @cached_property
    def increments(self) -> np.ndarray:
        """``C_0 .. C_{m-1}`` (uint64)."""
        return seed_words(self.seed, 2 * self.m + 1)[2::2]

    def rows(self, key_hashes: np.ndarray, function: int) -> np.ndarray:
        """``h_function(x)`` for every key hash ``x``: int64 rows in ``[0, s)``."""
        mixed = key_hashes * self.multipliers[function]
        mixed += self.increments[function]
        mixed >>= np.uint64(32)
        mixed *= np.uint64(self.s)
        mixed >>= np.uint64(32)
        return mixed.view(np.int64)

    def all_rows(self, key_hashes: np.ndarray) -> np.ndarray:
        """Rows under every function at once: shape ``(len(key_hashes), m)``, uint64."""
        mixed = key_hashes[:, None] * self.multipliers[None, :]
        mixed += self.increments[None, :]
        mixed >>= np.uint64(32)
        mixed *= np.uint64(self.s)
        mixed >>= np.uint64(32)
        return mixed


def positive_finite(name: str, value: object) -> float:
    """``value`` as a float, or ParameterError unless it is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, Real | np.integer | np.floating):
        raise ParameterError(f"{name} must be a finite positive number, got {value!r}")
    as_float = float(value)
    if not math.isfinite(as_float) or as_float <= 0:
        raise ParameterError(f"{name} must be a finite positive number, got {value!r}")
    return as_float


def positive_int(name: str, value: object) -> int:
    """``value`` as an int, or ParameterError unless it is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ParameterError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def fraction_in_open_unit(name: str, value: object) -> float:
    """``value`` as a float, or ParameterError unless ``0 < value < 1``."""
    as_float = positive_finite(name, value)
    if as_float >= 1.0:
        raise ParameterError(f"{name} must be strictly between 0 and 1, got {value!r}")
    return as_float


def exact_fraction(value: float | Fraction) -> Fraction:
    """``value`` as an exact Fraction (floats convert exactly)."""
    return value if isinstance(value, Fraction) else Fraction(value)


def pack_header(magic: bytes, header: dict[str, Any]) -> bytes:
    """``magic`` (8 bytes), a little-endian length and the JSON header: how every serialized
    release of this package starts; the body follows."""
    encoded = json.dumps(header, sort_keys=True).encode()
    return magic + struct.pack("<I", len(encoded)) + encoded


def unpack_header(data: bytes, magic: bytes, what: str) -> tuple[dict[str, Any], int]:
    """The header written by :func:`pack_header` and the offset of the body after it."""
    if len(data) < 12 or data[:8] != magic:
        raise ParameterError(f"data is not a serialized {what} (bad magic)")
    (length,) = struct.unpack("<I", data[8:12])
    header = json.loads(data[12 : 12 + length])
    if not isinstance(header, dict):
        raise ParameterError(f"malformed {what} header")
    return header, 12 + length
