"""The Approximate Laplace Projection (ALP): an ε-DP sketch of a sparse vector that answers any key.

Aumüller, Lebeda and Pagh, "Differentially Private Sparse Vectors with Low Error, Optimal Space, and
Fast Access" (CCS'21): Algorithm 1 (projection) and Algorithm 2 (estimator).

Projection (Alg. 1). Each non-zero value ``x_i`` is scaled to ``x_i·ε/(α·Δ)`` and randomly
rounded to an integer ``y_i`` (capped at ``m = ⌈β·ε/(α·Δ)⌉``); its unary code ``1^{y_i} 0^{m-y_i}``
is spread over an ``m × s`` bit array, bit ``b`` going to row ``h_b(i)`` of column ``b`` (bits of
different keys are OR-ed); every bit is then flipped independently with probability
``p = 1/(α+2)``. The release is the flipped array plus the public seed of the hash functions, never
the keys or values.

Privacy (Sec. 3.1 and the full version). Cells are independent given the input, a key's random
rounding moves at most one of its bits, and the probability that a cell is 1 before flipping moves
by at most ``|Δy|``; after flipping, the probability of either output of the cell changes by a
factor at most ``1 + ((1 - 2p)/p)·|Δy| = 1 + α|Δy| <= e^{α|Δy|}``. Neighbours differ by at most ``Δ
= min(max_groups_per_unit · max_rows_per_group, max_rows_per_unit)`` in L1, i.e. by ``ε/α`` in
scaled units, so every output's probability changes by a factor at most ``e^ε``: the sketch is ε-DP
(δ = 0).

Exact flips. ``p`` is made a dyadic rational ``j/2^K`` (``K <= 16``) *rounded up*, and ``α`` is
replaced by the effective ``α' = (1 - 2p)/p <= α`` everywhere (scaling, ``m``, estimates), so the
argument above holds exactly with ``α'``. Flips are drawn bit-sliced: ``K`` random 64-bit words
give 64 cells at once. The default ``α = 10/3`` has ``p = 3/16`` exactly (4 random bits per cell);
``α = 3`` becomes ``p = 205/1024``, ``α' ≈ 2.995``.

Estimator (Alg. 2). ``f(n) = Σ_{b<n} (2·z̃[h_b(i), b] − 1)`` for ``n = 0..m``; the estimate is
the mean of the maximisers of ``f`` times ``α'·Δ/ε``. Any key can be queried; absent keys get small
values.

Size. ``s`` (rows) should be about ``rows_per_key · k`` for ``k`` non-zero keys (collision
probability ``<= k/s``), but ``k`` is private. With ``s=None`` a fraction ``size_fraction`` of ε
buys a discrete Laplace estimate of ``k`` (sensitivity ``max_groups_per_unit``) and ``s`` is derived
from it; the projection gets the rest of ε (sequential composition). Pass ``s`` to skip this when a
public bound on ``k`` is known. ``s`` is rounded up to a multiple of 64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from dpsql.errors import ParameterError
from dpsql.mechanisms.hashing import (
    KEY_HASH_SCHEME,
    HashFamily,
    KeyKind,
    as_key_array,
    check_seed,
    exact_fraction,
    fraction_in_open_unit,
    hash_keys,
    new_seed,
    pack_header,
    positive_finite,
    positive_int,
    unpack_header,
)
from dpsql.mechanisms.laplace import noise_scale, sample_discrete_laplace
from dpsql.mechanisms.random import resolve_rng

if TYPE_CHECKING:
    pass

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_ROWS_PER_KEY",
    "DEFAULT_SIZE_FRACTION",
    "ALPSketch",
    "default_beta",
    "effective_alpha",
    "error_bound_factor",
    "flip_probability",
    "project",
    "project_hashes",
    "walk_estimate",
]

DEFAULT_ALPHA = Fraction(10, 3)
"""Within 1.5 % of the best mean error of α = 3 (full version, Fig. 3(b)); flip probability 3/16."""

DEFAULT_ROWS_PER_KEY = 10.0
"""``s ≈ 10·k``: per-bit collision probability at most 0.1, the paper's Fig. 3 setting."""

DEFAULT_SIZE_FRACTION = 0.05
"""Share of ε spent on the noisy key count that sizes ``s`` when ``s`` is not given."""

MIN_ROWS = 64
MAX_ROWS = 2**32 - 64
MAX_FUNCTIONS = 2**15 - 1
MAX_CELLS = 2**36
_MIN_ALPHA, _MAX_ALPHA = 0.05, 100.0
_FLIP_BITS = 16
_ALPHA_KEEP = Fraction(995, 1000)
_CHUNK_CELLS = 1 << 19
_GROUP_CELLS = 1 << 23
_MAGIC = b"DPSQLALP"
_FORMAT_VERSION = 1


def flip_probability(alpha: float | Fraction) -> Fraction:
    """``1/(α+2)`` rounded up to the first ``j/2^K`` (K <= 16) whose ``α'`` is >= 0.995·α.

    >>> flip_probability(Fraction(10, 3)), flip_probability(3)
    (Fraction(3, 16), Fraction(205, 1024))
    """
    alpha = exact_fraction(alpha)
    target = 1 / (alpha + 2)
    for bits in range(1, _FLIP_BITS + 1):
        candidate = Fraction(math.ceil(target * 2**bits), 2**bits)
        if candidate == target or effective_alpha(candidate) >= _ALPHA_KEEP * alpha:
            return candidate
    return candidate


def effective_alpha(flip: Fraction) -> Fraction:
    """``α' = (1 - 2p)/p``: the α for which flip probability ``p`` is exactly ``1/(α'+2)``."""
    return (1 - 2 * flip) / flip


def error_bound_factor(alpha: float | Fraction, keys_per_row: float) -> float:
    """The full version's expected-error bound in unary steps (``α'Δ/ε``): ``1/2 + (4α+4)/α² +
    (4γ+4)/γ²`` with ``γ = (α+2)/(1 + α·keys_per_row) − 2``; infinite when ``γ <= 0``.

    >>> round(error_bound_factor(Fraction(10, 3), 0.1), 2)
    5.06
    """
    alpha = float(alpha)
    gamma = (alpha + 2.0) / (1.0 + alpha * float(keys_per_row)) - 2.0
    if gamma <= 0:
        return math.inf
    return 0.5 + (4 * alpha + 4) / alpha**2 + (4 * gamma + 4) / gamma**2


def default_beta(epsilon: float, sensitivity: int) -> float:
    """``β = 2·ln(2^63)·Δ/ε``, the pure-DP threshold for 64-bit key hashes (Sec. 4); ≈ 87.3·Δ/ε."""
    return 2.0 * 63.0 * math.log(2.0) * sensitivity / epsilon


def _bernoulli_words(flip: Fraction, words: int, rng: np.random.Generator) -> np.ndarray:
    """``words`` uint64 words whose bits are i.i.d. Bernoulli(``flip``), ``flip = j/2^K`` exactly.

    Bit-sliced comparison ``U < j`` of a ``K``-bit uniform ``U`` (one random word per bit of ``U``),
    from the most significant bit down: ``less`` collects decided positions, ``equal`` the rest.
    """
    bits = flip.denominator.bit_length() - 1
    numerator = flip.numerator
    less = np.zeros(words, dtype=np.uint64)
    equal = np.full(words, np.uint64(2**64 - 1))
    for position in range(bits - 1, -1, -1):
        if numerator & ((1 << (position + 1)) - 1) == 0:
            break
        uniform = rng.integers(0, 2**64, size=words, dtype=np.uint64)
        if (numerator >> position) & 1:
            less |= equal & ~uniform
            equal &= uniform
        else:
            equal &= ~uniform
    return less


def walk_estimate(bits: np.ndarray) -> np.ndarray:
    """Steps 1-3 of Alg. 2 on a ``(keys, m)`` array whose last bit (``& 1``) is ``z̃[h_b(i), b]``.

    ``f(n) = Σ_{b<n} (2·bit_b − 1)`` for ``n = 0..m``; returns the mean of the maximisers of ``f``
    (the unscaled ``ỹ``). Vectorized over keys: one cumulative sum per row.

    >>> walk_estimate(np.array([[1, 1, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=np.uint8)).tolist()
    [3.0, 0.0]
    """
    walk = bits.astype(np.int16)
    walk &= 1
    walk *= 2
    walk -= 1
    np.cumsum(walk, axis=1, out=walk)
    peak = walk.max(axis=1, initial=0)
    at_peak = walk == peak[:, None]
    total = at_peak @ np.arange(1, bits.shape[1] + 1, dtype=np.int32)
    count = at_peak.sum(axis=1) + (peak == 0)
    return total / count


def _value_array(values: object, size: int) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1 or array.size != size:
        raise ParameterError(f"counts must be one-dimensional with one entry per key ({size})")
    if array.dtype.kind not in "biuf":
        raise ParameterError(f"counts must be numeric, got dtype {array.dtype}")
    array = array.astype(np.float64)
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ParameterError("counts must be finite and non-negative")
    return array


def _check_unique(kind: KeyKind, keys: np.ndarray, key_hashes: np.ndarray) -> None:
    import pandas as pd
    if pd.Index(key_hashes).is_unique:
        return
    if kind == "int" or not pd.Index(keys).is_unique:
        raise ParameterError("keys must be distinct (aggregate counts per key first)")


@dataclass(frozen=True, eq=False)
class ALPSketch:
    """An ALP projection: parameters, the public hash seed and the flipped bits (Alg. 1 output).

    ``bits`` is ``np.packbits`` of the ``m × s`` array, column ``b`` (hash function ``b``) in bytes
    ``[b·s/8, (b+1)·s/8)``. ``epsilon`` is the whole cost, ``projection_epsilon`` the part used by
    the projection (the rest, if any, bought ``noisy_key_count``, which sized ``s``).
    """

    epsilon: float
    projection_epsilon: float
    alpha: Fraction
    flip_probability: Fraction
    beta: float
    max_groups_per_unit: int
    max_rows_per_group: int
    s: int
    m: int
    seed: int
    key_kind: KeyKind
    bits: np.ndarray
    noisy_key_count: int | None = None
    mechanism: str = "alp"
    max_rows_per_unit: int | None = None

    @property
    def sensitivity(self) -> int:
        """``Δ = min(max_groups_per_unit · max_rows_per_group, max_rows_per_unit)`` (L1
        sensitivity of the input)."""
        product = self.max_groups_per_unit * self.max_rows_per_group
        return min(product, self.max_rows_per_unit or product)

    @property
    def step(self) -> float:
        """The value of one unary step, ``α'·Δ/ε``: estimates are multiples of it over averages."""
        return float(self.alpha) * self.sensitivity / self.projection_epsilon

    def expected_error_bound(self, keys_per_row: float) -> float:
        """Upper bound on the expected per-entry error ``E|x_i - x̃_i|`` of :meth:`estimate`.

        The full version's bound (our reading, ``docs/sparse_histograms.md``):
        ``(1/2 + (4α+4)/α² + (4γ+4)/γ²) · α'Δ/ε`` with ``γ = (α+2)/(1 + α·k/s) − 2``, where
        ``keys_per_row`` is ``k/s`` (non-zero keys per sketch row; collisions grow with it).
        Infinite when ``γ <= 0`` (too many keys for the rows). It bounds an average over the
        randomness, not every answer; values above β are estimated as about β.

        >>> sketch = project(["a"], [3], epsilon=1.0, s=64, seed=1,
        ...                  rng=np.random.Generator(np.random.PCG64(1)))
        >>> round(sketch.expected_error_bound(0.1) / sketch.step, 2)
        5.06
        """
        return error_bound_factor(self.alpha, keys_per_row) * self.step

    @property
    def nbytes(self) -> int:
        """Bytes of the bit array (``s·m/8``)."""
        return int(self.bits.nbytes)

    @cached_property
    def _family(self) -> HashFamily:
        return HashFamily(self.seed, self.m, self.s)

    def bit_matrix(self) -> np.ndarray:
        """The released bits as a ``(m, s)`` uint8 array of 0/1 (for inspection and tests)."""
        return np.unpackbits(self.bits).reshape(self.m, self.s)

    def estimate(self, keys: object) -> np.ndarray:
        """Alg. 2 for every key in ``keys`` (same kind, str or int, as at projection): float64."""
        kind, array = as_key_array(keys)
        if array.size and kind != self.key_kind:
            raise ParameterError(
                f"keys must be {self.key_kind} keys like the projection's, got {kind}"
            )
        return self.estimate_hashes(hash_keys(array, self.seed))

    def estimate_hashes(self, key_hashes: np.ndarray) -> np.ndarray:
        """Alg. 2 for 64-bit key hashes (see :func:`dpsql.mechanisms.hashing.hash_keys`)."""
        key_hashes = np.asarray(key_hashes, dtype=np.uint64)
        out = np.empty(key_hashes.size, dtype=np.float64)
        offsets = np.arange(self.m, dtype=np.uint64) * np.uint64(self.s)
        chunk = max(1, _CHUNK_CELLS // self.m)
        for start in range(0, key_hashes.size, chunk):
            cells = self._family.all_rows(key_hashes[start : start + chunk])
            cells += offsets
            shifts = np.uint8(7) - (cells & np.uint64(7)).astype(np.uint8)
            out[start : start + cells.shape[0]] = walk_estimate(
                self.bits[cells >> np.uint64(3)] >> shifts
            )
        return out * self.step

    def to_bytes(self) -> bytes:
        """Parameters, seed and packed bits (never keys or values); see :meth:`from_bytes`."""
        header = {
            "format": "dpsql-alp",
            "version": _FORMAT_VERSION,
            "key_hash": KEY_HASH_SCHEME,
            "epsilon": self.epsilon,
            "projection_epsilon": self.projection_epsilon,
            "alpha": str(self.alpha),
            "flip_probability": str(self.flip_probability),
            "beta": self.beta,
            "max_groups_per_unit": self.max_groups_per_unit,
            "max_rows_per_group": self.max_rows_per_group,
            "s": self.s,
            "m": self.m,
            "seed": self.seed,
            "key_kind": self.key_kind,
            "noisy_key_count": self.noisy_key_count,
            "max_rows_per_unit": self.max_rows_per_unit,
        }
        return pack_header(_MAGIC, header) + self.bits.tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> ALPSketch:
        """Inverse of :meth:`to_bytes`; ParameterError on anything malformed."""
        data = bytes(data)
        try:
            header, body = unpack_header(data, _MAGIC, "ALP sketch")
            if header["format"] != "dpsql-alp" or header["version"] != _FORMAT_VERSION:
                raise ParameterError(f"unsupported ALP format {header['format']!r}")
            if header["key_hash"] != KEY_HASH_SCHEME:
                raise ParameterError(f"unsupported key hash scheme {header['key_hash']!r}")
            s, m = positive_int("s", header["s"]), positive_int("m", header["m"])
            kind = header["key_kind"]
            sketch = cls(
                epsilon=positive_finite("epsilon", header["epsilon"]),
                projection_epsilon=positive_finite(
                    "projection_epsilon", header["projection_epsilon"]
                ),
                alpha=Fraction(header["alpha"]),
                flip_probability=Fraction(header["flip_probability"]),
                beta=positive_finite("beta", header["beta"]),
                max_groups_per_unit=positive_int(
                    "max_groups_per_unit", header["max_groups_per_unit"]
                ),
                max_rows_per_group=positive_int("max_rows_per_group", header["max_rows_per_group"]),
                s=s,
                m=m,
                seed=check_seed(header["seed"]),
                key_kind=kind,
                bits=np.frombuffer(data, dtype=np.uint8, offset=body),
                noisy_key_count=header["noisy_key_count"],
                max_rows_per_unit=(
                    None
                    if header.get("max_rows_per_unit") is None
                    else positive_int("max_rows_per_unit", header["max_rows_per_unit"])
                ),
            )
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
            if isinstance(error, ParameterError):
                raise
            raise ParameterError(f"malformed ALP sketch header: {error}") from error
        if kind not in ("str", "int") or s % 64 or sketch.bits.size * 8 != s * m:
            raise ParameterError("malformed ALP sketch: key kind or bit array size does not match")
        return sketch


def _rows_for(
    key_count: int, rows_per_key: float, epsilon: float, groups: int, rng: np.random.Generator
) -> tuple[int, int]:
    """``(s, noisy_k)``: ``noisy_k = k + DLap(groups/epsilon)``, ``s = rows_per_key·noisy_k``."""
    noisy = key_count + int(sample_discrete_laplace(noise_scale(groups, epsilon), 1, rng)[0])
    wanted = math.ceil(rows_per_key * max(noisy, 1) / 64) * 64
    return int(min(max(wanted, MIN_ROWS), MAX_ROWS)), noisy


def project(
    keys: object,
    counts: object,
    *,
    epsilon: float,
    alpha: float | Fraction = DEFAULT_ALPHA,
    s: int | None = None,
    beta: float | None = None,
    rows_per_key: float = DEFAULT_ROWS_PER_KEY,
    size_fraction: float = DEFAULT_SIZE_FRACTION,
    max_groups_per_unit: int = 1,
    max_rows_per_group: int = 1,
    seed: int | None = None,
    rng: np.random.Generator | None = None,
    max_rows_per_unit: int | None = None,
) -> ALPSketch:
    """ALP projection (Alg. 1) of ``{key: count}``: ε-DP for the given contribution bounds.

    ``keys`` are distinct str or integer keys, ``counts`` non-negative numbers (already bounded:
    each privacy unit changes at most ``max_groups_per_unit`` entries by at most
    ``max_rows_per_group`` each, and by at most ``max_rows_per_unit`` in all when given). ``beta``
    (default :func:`default_beta`) is the largest value the sketch represents; larger values are
    estimated as about ``beta``. ``s`` is the number of rows (public; see the module docstring for
    ``s=None``). ``seed`` (public; fresh from ``rng`` if None) fixes the key hashes and the hash
    functions.

    >>> rng = np.random.Generator(np.random.PCG64(3))
    >>> sketch = project(["a", "b"], [40, 0], epsilon=1.0, s=64, seed=7, rng=rng)
    >>> sketch.m, sketch.s, sketch.flip_probability, len(sketch.to_bytes()) > sketch.nbytes
    (27, 64, Fraction(3, 16), True)
    """
    kind, key_array = as_key_array(keys)
    values = _value_array(counts, key_array.size)
    rng = resolve_rng(rng)
    seed = new_seed(rng) if seed is None else check_seed(seed)
    key_hashes = hash_keys(key_array, seed)
    _check_unique(kind, key_array, key_hashes)
    return project_hashes(
        key_hashes,
        values,
        key_kind=kind,
        epsilon=epsilon,
        alpha=alpha,
        s=s,
        beta=beta,
        rows_per_key=rows_per_key,
        size_fraction=size_fraction,
        max_groups_per_unit=max_groups_per_unit,
        max_rows_per_group=max_rows_per_group,
        max_rows_per_unit=max_rows_per_unit,
        seed=seed,
        rng=rng,
    )


def project_hashes(
    key_hashes: np.ndarray,
    counts: object,
    *,
    key_kind: KeyKind,
    epsilon: float,
    seed: int,
    alpha: float | Fraction = DEFAULT_ALPHA,
    s: int | None = None,
    beta: float | None = None,
    rows_per_key: float = DEFAULT_ROWS_PER_KEY,
    size_fraction: float = DEFAULT_SIZE_FRACTION,
    max_groups_per_unit: int = 1,
    max_rows_per_group: int = 1,
    max_rows_per_unit: int | None = None,
    rng: np.random.Generator | None = None,
) -> ALPSketch:
    """:func:`project` for keys already hashed by ``hash_keys(keys, seed)`` (kind ``key_kind``)."""
    epsilon = positive_finite("epsilon", epsilon)
    alpha_value = positive_finite("alpha", alpha)
    if not _MIN_ALPHA <= alpha_value <= _MAX_ALPHA:
        raise ParameterError(f"alpha must be in [{_MIN_ALPHA}, {_MAX_ALPHA}], got {alpha!r}")
    groups = positive_int("max_groups_per_unit", max_groups_per_unit)
    rows_per_group = positive_int("max_rows_per_group", max_rows_per_group)
    per_unit = (
        None
        if max_rows_per_unit is None
        else positive_int("max_rows_per_unit", max_rows_per_unit)
    )
    sensitivity = min(groups * rows_per_group, per_unit or groups * rows_per_group)
    rows_per_key = positive_finite("rows_per_key", rows_per_key)
    if s is not None:
        s = positive_int("s", s)
        if s > MAX_ROWS:
            raise ParameterError(f"s must be at most {MAX_ROWS}, got {s!r}")
        s = -(-s // 64) * 64
    if key_kind not in ("str", "int"):
        raise ParameterError(f"key_kind must be 'str' or 'int', got {key_kind!r}")
    seed = check_seed(seed)
    key_hashes = np.asarray(key_hashes, dtype=np.uint64)
    values = _value_array(counts, key_hashes.size)
    rng = resolve_rng(rng)
    beta_value = (
        default_beta(epsilon, sensitivity) if beta is None else positive_finite("beta", beta)
    )

    noisy_key_count = None
    projection_epsilon = epsilon
    if s is None:
        size_epsilon = epsilon * fraction_in_open_unit("size_fraction", size_fraction)
        projection_epsilon = epsilon - size_epsilon
        s, noisy_key_count = _rows_for(
            int(np.count_nonzero(values)),
            rows_per_key,
            size_epsilon,
            min(groups, per_unit or groups),
            rng,
        )
    flip = flip_probability(exact_fraction(alpha))
    alpha_eff = effective_alpha(flip)
    scale = projection_epsilon / (float(alpha_eff) * sensitivity)
    m = max(1, math.ceil(beta_value * scale))
    if m > MAX_FUNCTIONS or s * m > MAX_CELLS:
        raise ParameterError(
            f"sketch too large: m={m} hash functions (at most {MAX_FUNCTIONS}) and s*m={s * m} "
            f"bits (at most {MAX_CELLS}); lower beta or s, or raise alpha"
        )
    return ALPSketch(
        epsilon=epsilon,
        projection_epsilon=projection_epsilon,
        alpha=alpha_eff,
        flip_probability=flip,
        beta=beta_value,
        max_groups_per_unit=groups,
        max_rows_per_group=rows_per_group,
        s=s,
        m=m,
        seed=seed,
        key_kind=key_kind,
        bits=_embed_and_flip(key_hashes, values * scale, HashFamily(seed, m, s), flip, rng),
        noisy_key_count=noisy_key_count,
        max_rows_per_unit=per_unit,
    )


def _embed_and_flip(
    key_hashes: np.ndarray,
    scaled: np.ndarray,
    family: HashFamily,
    flip: Fraction,
    rng: np.random.Generator,
) -> np.ndarray:
    """Alg. 1 steps 1-3: random rounding, unary codes spread by ``family``, randomized response."""
    m, s = family.m, family.s
    whole = np.floor(scaled)
    unary = np.minimum(whole + (rng.random(scaled.size) < scaled - whole), m).astype(np.int64)
    present = unary > 0
    order = np.argsort(-unary[present].astype(np.int16), kind="stable")
    sorted_hashes = key_hashes[present][order]
    at_least = np.cumsum(np.bincount(unary[present], minlength=m + 1)[::-1])[::-1][1:]

    bits = np.empty(s * m // 8, dtype=np.uint8)
    columns_per_group = max(1, _GROUP_CELLS // s)
    buffer = np.empty((min(m, columns_per_group), s), dtype=bool)
    for first in range(0, m, columns_per_group):
        last = min(m, first + columns_per_group)
        embedding = buffer[: last - first]
        embedding.fill(False)
        for column in range(first, last):
            holders = sorted_hashes[: at_least[column]]
            embedding[column - first, family.rows(holders, column)] = True
        packed = np.packbits(embedding)
        flips = _bernoulli_words(flip, packed.size // 8, rng).view(np.uint8)
        np.bitwise_xor(packed, flips, out=bits[first * s // 8 : last * s // 8])
    bits.flags.writeable = False
    return bits
