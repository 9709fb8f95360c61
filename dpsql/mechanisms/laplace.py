"""The discrete Laplace (two-sided geometric) mechanism: the noise behind every COUNT and SUM.

Guarantee
---------
Adding independent noise ``X`` with ``P(X = x) ∝ exp(-|x| / b)`` to each entry of an integer vector
whose L1 sensitivity is ``Δ`` is ε-differentially private (pure, δ = 0) whenever ``b >= Δ / ε``:
for neighbouring inputs the output densities differ pointwise by a factor of at most
``exp(|c - c'|_1 / b) <= exp(ε)``. This is the geometric mechanism of Ghosh, Roughgarden and
Sundararajan (STOC'09, "Universally utility-maximizing privacy mechanisms") and its staircase-family
analysis by Geng and Viswanath; every scale used here is rounded *up* from ``Δ / ε``
(:func:`noise_scale`), so rounding only adds noise and the claimed ε always holds.

Exact sampling
--------------
Samples come from Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential Privacy"
(NeurIPS 2020): Algorithm 1 (Bernoulli(exp(-γ)) for rational γ) and Algorithm 2 (discrete Laplace
with rational scale ``t/s``). Every step draws uniform integers with ``rng.integers`` and compares
integers, so no floating-point number is ever involved and the output distribution is exactly the
discrete Laplace distribution (up to the quality of the generator). The rejection loops run on whole
arrays: each round handles every still-pending element at once, and rounds repeat until all are
accepted; the expected number of rounds is logarithmic in the sample size.

Why discrete noise on a fixed grid
----------------------------------
Mironov ("On Significance of the Least Significant Bits for Differential Privacy", CCS 2012) showed
that the textbook ``value + Laplace(b)`` computed in floating point is not private: the set of
doubles the sum can produce depends on ``value``, so an attacker who sees the low-order bits of the
release can often tell neighbouring inputs apart outright. Here no released number is ever the sum
of data and a floating-point sample. Counts are integers and get integer noise. Sums are computed
by the engine in units of a power-of-two ``grid`` (each clamped value rounded to a multiple of the
grid inside the database, :func:`choose_grid`), integer discrete Laplace noise is added to the
integer sum in grid units, and only then is the result multiplied by the grid. Because the grid
is a power of two and the noisy integer is clipped to ``|n| <= 2**53``, ``n * grid`` is an exact
double: the possible outputs form the same lattice for every input, and the release is the ε-DP
discrete Laplace output mapped through one fixed function (post-processing).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from numbers import Real

import numpy as np

from dpsql.errors import ParameterError
from dpsql.mechanisms.random import resolve_rng

__all__ = [
    "MAX_GRID",
    "MAX_SCALE",
    "NoisyRelease",
    "choose_grid",
    "expected_abs",
    "interval_half_width",
    "noise_scale",
    "release_counts",
    "release_grid_sums",
    "sample_discrete_laplace",
]

MAX_SCALE = 2**48
"""Largest noise scale (in noise units) the exact sampler accepts; keeps all arithmetic in int64."""

_PRECISION_BITS = 30
""":func:`noise_scale` keeps about this many significant bits: it over-states scales by < 2**-29."""

_MAX_DENOMINATOR_BITS = 32
"""Smallest representable scale is ``2**-32``: any smaller scale is rounded up to it."""

_GRID_SCALE_BITS = 10
""":func:`choose_grid` puts the noise scale in grid units in ``[2**10, 2**11)``."""

_EXACT_FLOAT_LIMIT = 2**53
"""Integers of magnitude at most this are exact doubles; noisy values are clipped to this range."""

_INT64_LIMIT = 2**63 - 1

_FEW = 16
"""Up to this many draws, :func:`sample_discrete_laplace` runs its rounds on Python lists."""


def _positive_finite(name: str, value: object) -> Fraction:
    """``value`` as an exact Fraction, or ParameterError naming ``name`` unless finite and > 0."""
    if isinstance(value, bool) or not isinstance(value, Real | np.integer | np.floating):
        raise ParameterError(f"{name} must be a finite positive number, got {value!r}")
    if isinstance(value, int | np.integer | Fraction):
        exact = Fraction(int(value)) if isinstance(value, int | np.integer) else value
    else:
        as_float = float(value)
        if not math.isfinite(as_float):
            raise ParameterError(f"{name} must be a finite positive number, got {value!r}")
        exact = Fraction(as_float)
    if exact <= 0:
        raise ParameterError(f"{name} must be a finite positive number, got {value!r}")
    return exact


def _positive_float(name: str, value: object) -> float:
    """``value`` as a float, or ParameterError naming ``name`` unless finite and > 0 (what
    ``float(_positive_finite(name, value))`` gives, without the exact Fraction)."""
    if isinstance(value, float) and math.isfinite(value) and value > 0:
        return value
    return float(_positive_finite(name, value))


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise ParameterError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _confidence(confidence: float) -> float:
    if not isinstance(confidence, Real) or not 0.0 < float(confidence) < 1.0:
        raise ParameterError(f"confidence must be strictly between 0 and 1, got {confidence!r}")
    return float(confidence)


@functools.lru_cache(maxsize=1024, typed=True)
def noise_scale(sensitivity: float, epsilon: float) -> Fraction:
    """The smallest multiple of ``2**-k`` that is ``>= sensitivity / epsilon`` (exact rationals).

    ``k`` keeps about 30 significant bits (at most 32 fractional bits, none for scales above
    ``2**30``), so the scale is over-stated by a relative ``< 2**-29`` and the sampler's integer
    arithmetic stays within int64. Rounding up only adds noise: the ε-DP claim for
    ``sensitivity`` holds (Ghosh et al. 2009; the mechanism needs ``scale >= Δ/ε``).

    >>> noise_scale(1, 0.1)
    Fraction(10, 1)
    >>> noise_scale(3, 0.5)
    Fraction(6, 1)
    >>> noise_scale(1, 3) >= Fraction(1, 3)
    True
    """
    ratio = _positive_finite("sensitivity", sensitivity) / _positive_finite("epsilon", epsilon)
    if ratio > MAX_SCALE:
        raise ParameterError(
            f"sensitivity/epsilon must be at most 2**48, got sensitivity={sensitivity!r}, "
            f"epsilon={epsilon!r}"
        )
    exponent = ratio.numerator.bit_length() - ratio.denominator.bit_length()
    bits = min(max(_PRECISION_BITS - exponent, 0), _MAX_DENOMINATOR_BITS)
    scaled = ratio * 2**bits
    return Fraction(-(-scaled.numerator // scaled.denominator), 2**bits)


def _bernoulli_exp_neg_fraction(
    numerators: np.ndarray, denominator: int, rng: np.random.Generator
) -> np.ndarray:
    """Bernoulli(exp(-γ)) per element, ``γ = numerators / denominator`` in [0, 1] (CKS Alg. 1).

    Draw ``A_K ~ Bernoulli(γ / K)`` for ``K = 1, 2, ...`` until the first ``A_K = 0``; the result is
    1 iff that ``K`` is odd. ``Bernoulli(n / (d K))`` is ``integers(0, d K) < n``. All still-running
    elements share the same ``K``, so each round is one vectorized draw.
    """
    result = np.empty(numerators.size, dtype=bool)
    active = np.arange(numerators.size)
    pending_numerators = numerators
    k = 1
    while active.size:
        if denominator * k <= _INT64_LIMIT:
            draws = rng.integers(0, denominator * k, size=active.size, dtype=np.int64)
            keep_going = draws < pending_numerators
        else:
            # Bernoulli(γ/K) = Bernoulli(γ) AND Bernoulli(1/K), independent; avoids int64 overflow.
            first = rng.integers(0, denominator, size=active.size, dtype=np.int64)
            second = rng.integers(0, k, size=active.size, dtype=np.int64)
            keep_going = (first < pending_numerators) & (second == 0)
        result[active[~keep_going]] = k % 2 == 1
        active = active[keep_going]
        pending_numerators = pending_numerators[keep_going]
        k += 1
    return result


def _bernoulli_exp_neg_one(size: int, rng: np.random.Generator) -> np.ndarray:
    """Bernoulli(exp(-1)) (CKS Alg. 1 with γ = 1: ``A_K ~ Bernoulli(1/K)``; ``A_1 = 1`` surely)."""
    result = np.empty(size, dtype=bool)
    active = np.arange(size)
    k = 2
    while active.size:
        keep_going = rng.integers(0, k, size=active.size, dtype=np.int64) == 0
        result[active[~keep_going]] = k % 2 == 1
        active = active[keep_going]
        k += 1
    return result


def _geometric_exp_neg_one(size: int, rng: np.random.Generator) -> np.ndarray:
    """Successes of Bernoulli(exp(-1)) before the first failure: ``P(V = v) = e^-v (1 - e^-1)``."""
    counts = np.zeros(size, dtype=np.int64)
    active = np.arange(size)
    while active.size:
        active = active[_bernoulli_exp_neg_one(active.size, rng)]
        counts[active] += 1
    return counts


def sample_discrete_laplace(
    scale: Fraction,
    size: int | tuple[int, ...],
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Exact int64 samples with ``P(X = x) ∝ exp(-|x| / scale)`` (CKS 2020, Algorithm 2).

    With ``scale = t/s`` in lowest terms, each round draws ``U ~ Uniform{0..t-1}``, keeps it with
    probability ``exp(-U/t)`` (Alg. 1), draws ``V`` geometric with parameter ``exp(-1)``, sets
    ``Y = (U + tV) // s`` (geometric with parameter ``exp(-1/scale)``) and a sign ``B``; it rejects
    ``B = 1, Y = 0`` (so zero is not counted twice) and returns ``(1 - 2B) Y``. Integer-only.

    >>> rng = np.random.Generator(np.random.PCG64(7))
    >>> sample_discrete_laplace(Fraction(5, 2), (2, 3), rng).dtype
    dtype('int64')
    """
    scale = _positive_finite("scale", scale)
    if scale.numerator > MAX_SCALE or scale.denominator > MAX_SCALE:
        raise ParameterError(
            f"scale must have numerator and denominator at most 2**48 (see noise_scale), "
            f"got {scale}"
        )
    shape = (size,) if isinstance(size, int | np.integer) else tuple(size)
    if any(isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 0 for d in shape):
        raise ParameterError(f"size must be a non-negative int or tuple of them, got {size!r}")
    rng = resolve_rng(rng)
    t, s = scale.numerator, scale.denominator
    total = math.prod(int(d) for d in shape)
    if total == 1:
        return np.array([_one_discrete_laplace(t, s, rng)], dtype=np.int64).reshape(shape)
    if total <= _FEW:
        return np.array(_few_discrete_laplace(t, s, total, rng), dtype=np.int64).reshape(shape)
    return _many_discrete_laplace(t, s, total, rng).reshape(shape)


def _many_discrete_laplace(t: int, s: int, total: int, rng: np.random.Generator) -> np.ndarray:
    """``total`` draws of :func:`sample_discrete_laplace` at scale ``t/s``, each round one
    vectorized draw for every element still pending."""
    out = np.empty(total, dtype=np.int64)
    pending = np.arange(total)
    while pending.size:
        uniform = rng.integers(0, t, size=pending.size, dtype=np.int64)
        kept = np.flatnonzero(_bernoulli_exp_neg_fraction(uniform, t, rng))
        geometric = (uniform[kept] + t * _geometric_exp_neg_one(kept.size, rng)) // s
        negative = rng.integers(0, 2, size=kept.size, dtype=np.int64) == 1
        accepted = ~(negative & (geometric == 0))
        out[pending[kept[accepted]]] = np.where(
            negative[accepted], -geometric[accepted], geometric[accepted]
        )
        done = np.zeros(pending.size, dtype=bool)
        done[kept[accepted]] = True
        pending = pending[~done]
    return out


def _few_discrete_laplace(t: int, s: int, total: int, rng: np.random.Generator) -> list[int]:
    """:func:`_many_discrete_laplace` on Python lists, for a handful of elements.

    The same rounds, and in each round the same draws in the same order: an array draw of
    ``m`` bounded integers consumes the generator exactly as ``m`` scalar draws do (a test
    compares the two samplers draw for draw), so the values are identical for a given
    generator state; only NumPy's per-call overhead, which dominates for a few elements, is
    gone (a GROUP BY over a few public keys; one value takes :func:`_one_discrete_laplace`).
    """
    out = [0] * total
    pending = list(range(total))
    while pending:
        uniform = _draws(rng, t, len(pending))
        kept = [
            i for i, heads in enumerate(_few_bernoulli_exp_neg_fraction(uniform, t, rng)) if heads
        ]
        successes = _few_geometric_exp_neg_one(len(kept), rng)
        negative = _draws(rng, 2, len(kept))
        finished = set()
        for i, count, sign in zip(kept, successes, negative, strict=True):
            geometric = (uniform[i] + t * count) // s
            if not (sign == 1 and geometric == 0):
                out[pending[i]] = -geometric if sign == 1 else geometric
                finished.add(i)
        pending = [p for i, p in enumerate(pending) if i not in finished]
    return out


def _one_discrete_laplace(t: int, s: int, rng: np.random.Generator) -> int:
    """One draw of :func:`sample_discrete_laplace` at scale ``t/s``: :func:`_few_discrete_laplace`
    for one element (the same draws in the same order, a test compares them), as scalar steps
    (an ungrouped COUNT or SUM releases one value)."""
    while True:
        uniform = int(rng.integers(0, t, dtype=np.int64))
        if not _one_bernoulli_exp_neg_fraction(uniform, t, rng):
            continue
        successes = 0
        while _one_bernoulli_exp_neg_one(rng):
            successes += 1
        negative = int(rng.integers(0, 2, dtype=np.int64)) == 1
        geometric = (uniform + t * successes) // s
        if not (negative and geometric == 0):
            return -geometric if negative else geometric


def _one_bernoulli_exp_neg_fraction(
    numerator: int, denominator: int, rng: np.random.Generator
) -> bool:
    """:func:`_bernoulli_exp_neg_fraction` for one element, with the same draws."""
    k = 1
    while True:
        if denominator * k <= _INT64_LIMIT:
            going = int(rng.integers(0, denominator * k, dtype=np.int64)) < numerator
        else:
            first = int(rng.integers(0, denominator, dtype=np.int64))
            second = int(rng.integers(0, k, dtype=np.int64))  # drawn whatever ``first`` is
            going = first < numerator and second == 0
        if not going:
            return k % 2 == 1
        k += 1


def _one_bernoulli_exp_neg_one(rng: np.random.Generator) -> bool:
    """:func:`_bernoulli_exp_neg_one` for one element, with the same draws."""
    k = 2
    while int(rng.integers(0, k, dtype=np.int64)) == 0:
        k += 1
    return k % 2 == 1


def _draws(rng: np.random.Generator, high: int, count: int) -> list[int]:
    """``count`` draws from ``Uniform{0..high-1}``: what ``rng.integers(0, high, size=count,
    dtype=np.int64)`` draws, and what as many scalar draws draw (one array call costs about
    four scalar ones)."""
    if count >= 4:
        return rng.integers(0, high, size=count, dtype=np.int64).tolist()  # type: ignore[no-any-return]
    return [int(rng.integers(0, high, dtype=np.int64)) for _ in range(count)]


def _few_bernoulli_exp_neg_fraction(
    numerators: list[int], denominator: int, rng: np.random.Generator
) -> list[bool]:
    """:func:`_bernoulli_exp_neg_fraction` on lists, with the same draws."""
    result = [False] * len(numerators)
    active = list(range(len(numerators)))
    k = 1
    while active:
        if denominator * k <= _INT64_LIMIT:
            draws = _draws(rng, denominator * k, len(active))
            going = [draw < numerators[i] for i, draw in zip(active, draws, strict=True)]
        else:
            first = _draws(rng, denominator, len(active))
            second = _draws(rng, k, len(active))
            going = [
                a < numerators[i] and b == 0 for i, a, b in zip(active, first, second, strict=True)
            ]
        active = _settle_round(result, active, going, k)
        k += 1
    return result


def _few_bernoulli_exp_neg_one(size: int, rng: np.random.Generator) -> list[bool]:
    """:func:`_bernoulli_exp_neg_one` on lists, with the same draws."""
    result = [False] * size
    active = list(range(size))
    k = 2
    while active:
        going = [draw == 0 for draw in _draws(rng, k, len(active))]
        active = _settle_round(result, active, going, k)
        k += 1
    return result


def _settle_round(result: list[bool], active: list[int], going: list[bool], k: int) -> list[int]:
    """One round of CKS Algorithm 1 on lists: each active element that stopped at ``K = k``
    gets its result (``k`` odd); those still going are returned, in order."""
    for i, keep_going in zip(active, going, strict=True):
        if not keep_going:
            result[i] = k % 2 == 1
    return [i for i, keep_going in zip(active, going, strict=True) if keep_going]


def _few_geometric_exp_neg_one(size: int, rng: np.random.Generator) -> list[int]:
    """:func:`_geometric_exp_neg_one` on lists, with the same draws."""
    counts = [0] * size
    active = list(range(size))
    while active:
        heads = _few_bernoulli_exp_neg_one(len(active), rng)
        active = [i for i, h in zip(active, heads, strict=True) if h]
        for i in active:
            counts[i] += 1
    return counts


def interval_half_width(scale: Fraction, confidence: float = 0.95) -> int:
    """Smallest integer ``k`` with ``P(|X| <= k) >= confidence`` for discrete Laplace(``scale``).

    Uses ``P(|X| >= j) = 2 a^j / (1 + a)`` for ``j >= 1``, ``a = exp(-1/scale)``: ``k + 1`` must
    be at least ``scale * (ln 2 - ln(1 + a) - ln(1 - confidence))``. That bound is inflated by a
    relative ``1e-12`` (far above float rounding error) before rounding, so ``k`` is never too
    small; it may exceed the minimum by one only when the bound is within ``1e-12`` of an integer.

    >>> interval_half_width(Fraction(1, 2**32))
    0
    >>> interval_half_width(Fraction(10))
    30
    """
    scale_value = _positive_float("scale", scale)
    confidence = _confidence(confidence)
    a = math.exp(-1.0 / scale_value)
    bound = scale_value * (math.log(2.0) - math.log1p(a) - math.log1p(-confidence))
    return max(0, math.ceil(bound * (1.0 + 1e-12)) - 1)


def expected_abs(scale: Fraction) -> float:
    """``E|X|`` for discrete Laplace(``scale``): ``2a / (1 - a²)``, ``a = exp(-1/scale)`` (the
    mean absolute error a noisy count carries).

    >>> round(expected_abs(Fraction(10)), 2), expected_abs(Fraction(1, 2**20))
    (9.98, 0.0)
    """
    x = 1.0 / _positive_float("scale", scale)
    # 2a / (1 - a²) with a = exp(-x), so that a tiny scale (a = 0) gives 0, not log(0)
    return 2.0 * math.exp(-x) / -math.expm1(-2.0 * x)


MAX_GRID = 2.0**970
"""The coarsest grid of a released sum: noisy values times the grid stay finite floats."""


def choose_grid(sensitivity: float, epsilon: float) -> float:
    """A power of two ``g`` with ``sensitivity / (g * epsilon)`` in ``[2**10, 2**11)``.

    The engine rounds each clamped SUM input to a multiple of ``g`` inside the database; with the
    noise scale around 1000 grid units, that rounding (at most ``g/2`` per value) is negligible
    next to the noise. Any power of two keeps the release exact (module docstring).

    >>> choose_grid(1.0, 1.0) == 2.0**-10
    True
    >>> choose_grid(100.0, 0.5)
    0.125
    """
    ratio = float(
        _positive_finite("sensitivity", sensitivity) / _positive_finite("epsilon", epsilon)
    )
    if not math.isfinite(ratio) or ratio == 0.0:
        raise ParameterError(
            f"sensitivity/epsilon is outside the float range, got sensitivity={sensitivity!r}, "
            f"epsilon={epsilon!r}"
        )
    _, exponent = math.frexp(ratio)
    grid = math.ldexp(1.0, exponent - 1 - _GRID_SCALE_BITS)
    if grid == 0.0 or not math.isfinite(grid):
        raise ParameterError(
            f"no float power-of-two grid for sensitivity={sensitivity!r}, epsilon={epsilon!r}"
        )
    return grid


@dataclass(frozen=True, eq=False)
class NoisyRelease:
    """Noisy aggregates with what they cost and how accurate they are.

    ``scale`` and ``half_width`` are in output units (grid units times ``grid`` for sums);
    ``[lower, upper]`` covers each true value with probability at least ``confidence``.
    """

    values: np.ndarray
    epsilon: float
    delta: float
    sensitivity: float
    scale: float
    half_width: float
    confidence: float
    mechanism: str = "discrete_laplace"

    @property
    def lower(self) -> np.ndarray:
        """Per-entry lower ends of the confidence intervals."""
        return self.values - self.half_width

    @property
    def upper(self) -> np.ndarray:
        """Per-entry upper ends of the confidence intervals."""
        return self.values + self.half_width


def _integer_array(name: str, values: object) -> np.ndarray:
    """``values`` as int64; integral floats (e.g. DuckDB HUGEINT sums) are accepted exactly."""
    array = np.asarray(values)
    if array.dtype.kind in "biu":
        if array.dtype.kind == "u" and array.size and array.max() > _INT64_LIMIT:
            raise ParameterError(f"{name} must fit in int64")
        return array.astype(np.int64)
    if array.dtype.kind == "f":
        if not np.all(np.isfinite(array)) or not np.all(array == np.round(array)):
            raise ParameterError(f"{name} must hold integers, got non-integral floats")
        return np.clip(array, -(2.0**62), 2.0**62).astype(np.int64)
    raise ParameterError(f"{name} must be an integer array, got dtype {array.dtype}")


def _add_noise(exact: np.ndarray, scale: Fraction, rng: np.random.Generator | None) -> np.ndarray:
    """``clip(clip(exact) + noise)`` within ``±2**53``.

    Clipping the input is a contraction (L1 sensitivity cannot grow) and clipping the output is
    post-processing, so neither affects privacy; together they rule out int64 overflow and keep
    every value an exact double.
    """
    clipped = np.minimum(np.maximum(exact, -_EXACT_FLOAT_LIMIT), _EXACT_FLOAT_LIMIT)
    noisy = clipped + sample_discrete_laplace(scale, clipped.shape, rng)
    return np.minimum(np.maximum(noisy, -_EXACT_FLOAT_LIMIT), _EXACT_FLOAT_LIMIT)


def release_counts(
    counts: np.ndarray,
    *,
    epsilon: float,
    sensitivity: int,
    rng: np.random.Generator | None = None,
    confidence: float = 0.95,
) -> NoisyRelease:
    """``counts + discrete Laplace(noise_scale(sensitivity, epsilon))``, elementwise, int64.

    ε-DP (δ = 0) when ``sensitivity`` bounds the L1 distance of the whole ``counts`` vector between
    neighbouring databases (geometric mechanism, Ghosh et al. 2009; exact CKS 2020 sampling).

    >>> rng = np.random.Generator(np.random.PCG64(1))
    >>> release = release_counts(np.array([10, 20]), epsilon=1.0, sensitivity=1, rng=rng)
    >>> release.values.dtype, release.scale, release.half_width
    (dtype('int64'), 1.0, 3.0)
    """
    epsilon_value = _positive_float("epsilon", epsilon)
    sensitivity = _positive_int("sensitivity", sensitivity)
    confidence = _confidence(confidence)
    exact = _integer_array("counts", counts)
    scale = noise_scale(sensitivity, epsilon)
    return NoisyRelease(
        values=_add_noise(exact, scale, rng),
        epsilon=epsilon_value,
        delta=0.0,
        sensitivity=float(sensitivity),
        scale=float(scale),
        half_width=float(interval_half_width(scale, confidence)),
        confidence=confidence,
    )


def release_grid_sums(
    grid_sums: np.ndarray,
    *,
    epsilon: float,
    sensitivity_units: int,
    grid: float,
    rng: np.random.Generator | None = None,
    confidence: float = 0.95,
) -> NoisyRelease:
    """``(grid_sums + discrete Laplace(sensitivity_units / epsilon)) * grid`` as float64.

    ``grid_sums`` are exact integer sums, in grid units, of values already rounded to multiples
    of the power-of-two ``grid``; ``sensitivity_units`` is their L1 sensitivity in grid units.
    ε-DP (δ = 0) as for :func:`release_counts`; multiplying by ``grid`` is exact post-processing,
    which is the defence against Mironov's floating-point attack (module docstring).

    >>> rng = np.random.Generator(np.random.PCG64(1))
    >>> release = release_grid_sums(
    ...     np.array([4096]), epsilon=1.0, sensitivity_units=1024, grid=2.0**-10, rng=rng
    ... )
    >>> release.sensitivity, release.scale
    (1.0, 1.0)
    """
    epsilon_value = _positive_float("epsilon", epsilon)
    sensitivity_units = _positive_int("sensitivity_units", sensitivity_units)
    grid_value = _positive_float("grid", grid)
    if math.frexp(grid_value)[0] != 0.5 or grid_value > MAX_GRID:
        raise ParameterError(f"grid must be a power of two at most 2**970, got {grid!r}")
    confidence = _confidence(confidence)
    exact = _integer_array("grid_sums", grid_sums)
    scale = noise_scale(sensitivity_units, epsilon)
    noisy = _add_noise(exact, scale, rng)
    return NoisyRelease(
        values=noisy.astype(np.float64) * grid_value,
        epsilon=epsilon_value,
        delta=0.0,
        sensitivity=sensitivity_units * grid_value,
        scale=float(scale) * grid_value,
        half_width=interval_half_width(scale, confidence) * grid_value,
        confidence=confidence,
    )
