"""Thresholded noisy histograms over keys nobody can list: approximate DP, or pure DP on a domain.

Noise is discrete Laplace (two-sided geometric) with scale ``t = noise_scale(Δ, ε)`` and ``Δ =
min(max_groups_per_unit · max_rows_per_group, max_rows_per_unit)`` (:class:`Contribution`;
:mod:`dpsql.mechanisms.laplace`, exact CKS sampler); with ``a = exp(-1/t)``, ``P(Z = z) =
(1-a)/(1+a) · a^|z|`` and, for integers ``n``, ``P(Z >= n) = a^n/(1+a)`` if ``n >= 1`` and ``1 -
a^(1-n)/(1+a)`` otherwise. A key is released iff its noisy count is **at least** ``τ``
(:class:`ThresholdRule`; the mass at exactly ``τ`` counts as released everywhere, in the rule and in
every probability computed from it).

Approximate DP (Korolova et al. 2009; Alg. 9 of the full version of Aumüller, Lebeda, Pagh, CCS'21).
Only keys present in the data get noise. Neighbours differ by one privacy unit, which adds at most
``Δ`` in L1 to keys present in both (the noisy counts are ε-DP for those; thresholding them is
post-processing) and creates at most ``L0 = min(max_groups_per_unit, max_rows_per_unit)`` new keys,
each with count at most ``L∞ = min(max_rows_per_group, max_rows_per_unit)`` (a unit adds at most
``max_rows_per_unit`` rows in all; without it, the first terms). The only extra event is that a new
key is released, with probability at most ``δ = 1 - (1 - P(L∞ + Z >= τ))^{L0}`` (independent noise
per key); by basic composition of the ε-DP part with this (0, δ) part the release is (ε, δ)-DP.
:func:`delta_for_tau` computes this δ and :func:`tau_for_delta` the smallest integer τ whose δ is at
most the target. Alg. 9's random rounding of entries below 1 is the identity here: counts are
integers. Released keys come in a uniformly random order, never input order.

Pure DP (Alg. 3; Cormode, Procopiuc, Srivastava, Tran, ICDT'12). Over a public domain of size ``d``
(:class:`IntegerDomain` or 64-bit key hashes, :class:`HashDomain`), noise every one of the ``d``
entries and keep those at least τ: ε-DP as post-processing of the discrete Laplace mechanism. It is
simulated exactly without touching ``d`` entries: non-zero keys get their own noise; for the zero
keys, which are released independently with probability ``p0 = P(Z >= τ)`` each, a set of positions
is drawn from the *whole* domain with ``F ~ Binomial(d, p0)`` (a data-independent draw) and a
uniformly random choice of ``F`` distinct positions, positions that hold non-zero keys are dropped
(they already had their own trial), and each remaining one gets ``Z | Z >= τ``, which is ``τ + G``
with ``G`` distributed as ``Z | Z >= 0`` (memorylessness; sampled exactly by rejection from the
exact sampler). Hence every zero key is released independently with probability ``p0`` and the
output has the same distribution as noising all ``d`` entries. Released hashes are never mapped back
to strings (that would reveal which released keys are real); :func:`hash_keys` lets an analyst hash
candidate keys to match them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from dpsql.errors import ParameterError
from dpsql.mechanisms.hashing import (
    KEY_HASH_SCHEME,
    as_key_array,
    check_seed,
    fraction_in_open_unit,
    hash_keys,
    new_seed,
    pack_header,
    positive_finite,
    positive_int,
    unpack_header,
)
from dpsql.mechanisms.laplace import interval_half_width, noise_scale, sample_discrete_laplace
from dpsql.mechanisms.random import resolve_rng

if TYPE_CHECKING:
    pass

__all__ = [
    "MAX_EXPECTED_FALSE_POSITIVES",
    "Contribution",
    "HashDomain",
    "IntegerDomain",
    "ThresholdRelease",
    "ThresholdRule",
    "count_released_with_probability",
    "delta_for_tau",
    "expected_false_positives_for_tau",
    "noise_at_least",
    "noise_scale_for",
    "release",
    "tau_for_delta",
    "tau_for_false_positives",
]

MAX_EXPECTED_FALSE_POSITIVES = 10**6
"""Pure DP refuses thresholds expecting more released zero keys (``d·p0``) than this."""

_EXACT_LIMIT = 2**53
_ROUND_UP = 1.0 + 1e-12
"""Relative margin by which computed δ's are over-stated (float error is ~1e-15)."""
_MAGIC = b"DPSQLTHR"
_FORMAT_VERSION = 1


@dataclass(frozen=True)
class IntegerDomain:
    """The integer keys ``low..high`` (inclusive); ``size = high - low + 1 <= 2**64``."""

    low: int
    high: int

    def __post_init__(self) -> None:
        for name in ("low", "high"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise ParameterError(f"IntegerDomain.{name} must be an integer, got {value!r}")
        if not -(2**63) <= self.low <= self.high <= 2**63 - 1:
            raise ParameterError(
                f"IntegerDomain needs -2**63 <= low <= high < 2**63, got {self.low}, {self.high}"
            )

    @property
    def size(self) -> int:
        """Number of keys in the domain."""
        return int(self.high) - int(self.low) + 1


@dataclass(frozen=True)
class HashDomain:
    """All ``2**64`` key hashes (:func:`dpsql.mechanisms.hashing.hash_keys`), released as such."""

    @property
    def size(self) -> int:
        """Number of keys in the domain."""
        return 2**64


Domain = IntegerDomain | HashDomain


def noise_at_least(n: int, scale: Fraction) -> float:
    """``P(Z >= n)`` for discrete Laplace ``Z`` with ``scale`` (never rounded to 0 when positive).

    >>> round(noise_at_least(0, Fraction(1)), 6), round(noise_at_least(1, Fraction(1)), 6)
    (0.731059, 0.268941)
    """
    t = float(scale)
    log_tail_base = -math.log1p(math.exp(-1.0 / t))
    if n >= 1:
        return max(math.exp(-n / t + log_tail_base), math.ulp(0.0))
    return -math.expm1(-(1 - n) / t + log_tail_base)


@dataclass(frozen=True)
class ThresholdRule:
    """Release iff ``noisy >= tau``; the one place that decides, and its probability.

    >>> rule = ThresholdRule(tau=3, scale=Fraction(1))
    >>> rule.released(np.array([2, 3, 4])).tolist(), rule.release_probability(3) > 0.5
    ([False, True, True], True)
    """

    tau: int
    scale: Fraction

    def released(self, noisy: np.ndarray) -> np.ndarray:
        """The mask of released entries."""
        return noisy >= self.tau

    def release_probability(self, count: int) -> float:
        """``P(count + Z >= tau)``, the probability that :meth:`released` keeps ``count + Z``."""
        return noise_at_least(self.tau - count, self.scale)


@dataclass(frozen=True)
class Contribution:
    """What one privacy unit can change: ``new_keys`` keys of its own, each by at most
    ``per_key``, and the counts by at most ``l1`` in all (the noise's sensitivity).

    With ``max_rows_per_unit = R`` a unit adds at most R rows in all, so at most ``min(L0, R)``
    keys of its own, at most ``min(L∞, R)`` to one key and ``min(L0·L∞, R)`` in L1: the rule the
    planner uses for every GROUP BY. Without R it is ``L0``, ``L∞`` and ``L0·L∞``.

    >>> bounds = Contribution(8, 8, 8)
    >>> bounds.new_keys, bounds.per_key, bounds.l1
    (8, 8, 8)
    """

    max_groups_per_unit: int
    max_rows_per_group: int
    max_rows_per_unit: int | None = None

    @property
    def new_keys(self) -> int:
        return min(self.max_groups_per_unit, self.max_rows_per_unit or self.max_groups_per_unit)

    @property
    def per_key(self) -> int:
        return min(self.max_rows_per_group, self.max_rows_per_unit or self.max_rows_per_group)

    @property
    def l1(self) -> int:
        product = self.max_groups_per_unit * self.max_rows_per_group
        return min(product, self.max_rows_per_unit or product)


def _bounds(
    max_groups_per_unit: object, max_rows_per_group: object, max_rows_per_unit: object = None
) -> Contribution:
    return Contribution(
        positive_int("max_groups_per_unit", max_groups_per_unit),
        positive_int("max_rows_per_group", max_rows_per_group),
        None
        if max_rows_per_unit is None
        else positive_int("max_rows_per_unit", max_rows_per_unit),
    )


def _scale(epsilon: object, bounds: Contribution) -> Fraction:
    return noise_scale(bounds.l1, positive_finite("epsilon", epsilon))


def _delta(rule: ThresholdRule, bounds: Contribution) -> float:
    new_key = rule.release_probability(bounds.per_key)
    if new_key >= 1.0:
        return 1.0
    return min(1.0, -math.expm1(bounds.new_keys * math.log1p(-new_key)) * _ROUND_UP)


def noise_scale_for(
    *,
    epsilon: float,
    max_groups_per_unit: int,
    max_rows_per_group: int,
    max_rows_per_unit: int | None = None,
) -> Fraction:
    """The noise scale :func:`release` uses: ``noise_scale(min(L0·L∞, R), ε)``.

    >>> scale = noise_scale_for(epsilon=0.3, max_groups_per_unit=8, max_rows_per_group=8,
    ...                         max_rows_per_unit=8)
    >>> round(float(scale), 2)
    26.67
    """
    return _scale(epsilon, _bounds(max_groups_per_unit, max_rows_per_group, max_rows_per_unit))


def count_released_with_probability(tau: int, scale: Fraction, probability: float) -> int:
    """The smallest count ``c`` whose key is released with probability at least ``probability``
    (``P(c + Z >= tau)``); ``probability = 0.5`` gives ``tau`` itself.

    >>> count_released_with_probability(15, Fraction(1), 0.5), count_released_with_probability(
    ...     15, Fraction(1), 0.95)
    (15, 17)
    """
    count = tau
    while ThresholdRule(tau, scale).release_probability(count) < probability:
        count += 1
    while ThresholdRule(tau, scale).release_probability(count - 1) >= probability:
        count -= 1
    return count


def delta_for_tau(
    *,
    tau: int,
    epsilon: float,
    max_groups_per_unit: int,
    max_rows_per_group: int,
    max_rows_per_unit: int | None = None,
) -> float:
    """δ of the approximate-DP threshold ``tau``: ``1 - (1 - P(L∞ + Z >= tau))^{L0}``, rounded up
    (with ``max_rows_per_unit = R``, ``L0`` and ``L∞`` are capped at R; see :class:`Contribution`).

    >>> delta_for_tau(tau=20, epsilon=1.0, max_groups_per_unit=1, max_rows_per_group=1) < 1e-8
    True
    """
    if isinstance(tau, bool) or not isinstance(tau, int | np.integer):
        raise ParameterError(f"tau must be an integer, got {tau!r}")
    bounds = _bounds(max_groups_per_unit, max_rows_per_group, max_rows_per_unit)
    return _delta(ThresholdRule(int(tau), _scale(epsilon, bounds)), bounds)


def tau_for_delta(
    *,
    epsilon: float,
    delta: float,
    max_groups_per_unit: int,
    max_rows_per_group: int,
    max_rows_per_unit: int | None = None,
) -> int:
    """The smallest integer τ with ``delta_for_tau(tau=τ, ...) <= delta``.

    >>> tau_for_delta(epsilon=1.0, delta=1e-6, max_groups_per_unit=1, max_rows_per_group=1)
    15
    """
    delta = fraction_in_open_unit("delta", delta)
    bounds = _bounds(max_groups_per_unit, max_rows_per_group, max_rows_per_unit)
    scale = _scale(epsilon, bounds)
    rows = bounds.per_key
    per_key = -math.expm1(math.log1p(-delta) / bounds.new_keys)
    a = math.exp(-1.0 / float(scale))
    guess = rows + math.ceil(float(scale) * -math.log(max(per_key * (1.0 + a), 1e-300)))
    tau = max(guess, rows + 1)
    while _delta(ThresholdRule(tau, scale), bounds) > delta:
        tau += 1
    while _delta(ThresholdRule(tau - 1, scale), bounds) <= delta:
        tau -= 1
    return tau


def _domain_false_positive_rate(scale: Fraction, tau: int, size: int) -> float:
    return size * ThresholdRule(tau, scale).release_probability(0)


def expected_false_positives_for_tau(
    *,
    tau: int,
    epsilon: float,
    domain: Domain,
    max_groups_per_unit: int,
    max_rows_per_group: int,
    max_rows_per_unit: int | None = None,
) -> float:
    """``d · P(Z >= tau)``: the expected number of released zero keys (pure DP)."""
    bounds = _bounds(max_groups_per_unit, max_rows_per_group, max_rows_per_unit)
    return _domain_false_positive_rate(_scale(epsilon, bounds), int(tau), domain.size)


def tau_for_false_positives(
    *,
    epsilon: float,
    domain: Domain,
    max_groups_per_unit: int,
    max_rows_per_group: int,
    expected_false_positives: float = 1.0,
    max_rows_per_unit: int | None = None,
) -> int:
    """The smallest τ >= 1 with ``d · P(Z >= τ) <= expected_false_positives`` (pure DP).

    >>> tau_for_false_positives(
    ...     epsilon=0.5, domain=HashDomain(), max_groups_per_unit=1, max_rows_per_group=1
    ... )
    88
    """
    target = positive_finite("expected_false_positives", expected_false_positives)
    scale = _scale(epsilon, _bounds(max_groups_per_unit, max_rows_per_group, max_rows_per_unit))
    size = _check_domain(domain).size
    a = math.exp(-1.0 / float(scale))
    guess = math.ceil(float(scale) * (math.log(size) - math.log(target) - math.log1p(a)))
    tau = max(guess, 1)
    while _domain_false_positive_rate(scale, tau, size) > target:
        tau += 1
    while tau > 1 and _domain_false_positive_rate(scale, tau - 1, size) <= target:
        tau -= 1
    return tau


def _check_domain(domain: object) -> Domain:
    if not isinstance(domain, IntegerDomain | HashDomain):
        raise ParameterError(
            f"domain must be an IntegerDomain or HashDomain for pure DP (delta=0), got {domain!r}"
        )
    return domain


@dataclass(frozen=True, eq=False)
class ThresholdRelease:
    """Released keys (random order) with their noisy counts (all ``>= tau``) and the parameters.

    ``keys`` are str objects or int64 for approximate DP, int64 for an :class:`IntegerDomain`, and
    uint64 key hashes (under ``seed``) for a :class:`HashDomain`. ``half_width`` is the
    ``confidence`` interval half-width of the noise (selection at τ biases released values upward
    for keys whose true count is near τ).
    """

    keys: np.ndarray
    values: np.ndarray
    tau: int
    scale: Fraction
    epsilon: float
    delta: float
    max_groups_per_unit: int
    max_rows_per_group: int
    key_kind: str
    half_width: int
    confidence: float
    domain: Domain | None = None
    seed: int | None = None
    mechanism: str = "threshold"
    max_rows_per_unit: int | None = None

    @property
    def lower(self) -> np.ndarray:
        """Per-key lower ends of the noise intervals."""
        return self.values - self.half_width

    @property
    def upper(self) -> np.ndarray:
        """Per-key upper ends of the noise intervals."""
        return self.values + self.half_width

    def to_bytes(self) -> bytes:
        """Parameters, released keys and values (public outputs only)."""
        domain: list[object] | None = None
        if isinstance(self.domain, IntegerDomain):
            domain = ["integer", int(self.domain.low), int(self.domain.high)]
        elif isinstance(self.domain, HashDomain):
            domain = ["hash"]
        if self.key_kind == "str":
            encoded = [key.encode() for key in self.keys]
            offsets = np.cumsum([0, *map(len, encoded)], dtype=np.uint64)
            key_bytes = offsets.astype("<u8").tobytes() + b"".join(encoded)
        else:
            key_bytes = self.keys.astype("<u8" if self.key_kind == "hash" else "<i8").tobytes()
        header = {
            "format": "dpsql-threshold",
            "version": _FORMAT_VERSION,
            "key_hash": KEY_HASH_SCHEME,
            "count": int(self.keys.size),
            "tau": int(self.tau),
            "scale": str(self.scale),
            "epsilon": self.epsilon,
            "delta": self.delta,
            "max_groups_per_unit": self.max_groups_per_unit,
            "max_rows_per_group": self.max_rows_per_group,
            "key_kind": self.key_kind,
            "half_width": int(self.half_width),
            "confidence": self.confidence,
            "domain": domain,
            "seed": self.seed,
            "mechanism": self.mechanism,
            "max_rows_per_unit": self.max_rows_per_unit,
        }
        values = self.values.astype("<i8").tobytes()
        return pack_header(_MAGIC, header) + values + key_bytes

    @classmethod
    def from_bytes(cls, data: bytes) -> ThresholdRelease:
        """Inverse of :meth:`to_bytes`; ParameterError on anything malformed."""
        data = bytes(data)
        try:
            header, body = unpack_header(data, _MAGIC, "threshold release")
            if header["format"] != "dpsql-threshold" or header["version"] != _FORMAT_VERSION:
                raise ParameterError(f"unsupported threshold format {header['format']!r}")
            count, kind = int(header["count"]), header["key_kind"]
            values = np.frombuffer(data, dtype="<i8", count=count, offset=body).astype(np.int64)
            body += 8 * count
            if kind == "str":
                offsets = np.frombuffer(data, dtype="<u8", count=count + 1, offset=body)
                text = data[body + 8 * (count + 1) :]
                if int(offsets[-1]) != len(text):
                    raise ParameterError("malformed threshold release: string keys truncated")
                keys = np.array(
                    [text[int(offsets[i]) : int(offsets[i + 1])].decode() for i in range(count)],
                    dtype=object,
                )
            elif kind in ("int", "hash"):
                dtype = "<u8" if kind == "hash" else "<i8"
                if len(data) != body + 8 * count:
                    raise ParameterError("malformed threshold release: key array size")
                keys = np.frombuffer(data, dtype=dtype, count=count, offset=body)
                keys = keys.astype(np.uint64 if kind == "hash" else np.int64)
            else:
                raise ParameterError(f"malformed threshold release: key kind {kind!r}")
            domain_spec = header["domain"]
            domain: Domain | None = None
            if domain_spec is not None:
                domain = (
                    HashDomain()
                    if domain_spec[0] == "hash"
                    else IntegerDomain(int(domain_spec[1]), int(domain_spec[2]))
                )
            return cls(
                keys=keys,
                values=values,
                tau=int(header["tau"]),
                scale=Fraction(header["scale"]),
                epsilon=float(header["epsilon"]),
                delta=float(header["delta"]),
                max_groups_per_unit=int(header["max_groups_per_unit"]),
                max_rows_per_group=int(header["max_rows_per_group"]),
                key_kind=kind,
                half_width=int(header["half_width"]),
                confidence=float(header["confidence"]),
                domain=domain,
                seed=header["seed"],
                mechanism=header["mechanism"],
                max_rows_per_unit=header.get("max_rows_per_unit"),
            )
        except (KeyError, TypeError, ValueError, IndexError, UnicodeDecodeError) as error:
            if isinstance(error, ParameterError):
                raise
            raise ParameterError(f"malformed threshold release: {error}") from error


def _count_array(counts: object, size: int) -> np.ndarray:
    array = np.asarray(counts)
    if array.ndim != 1 or array.size != size:
        raise ParameterError(f"counts must be one-dimensional with one entry per key ({size})")
    if array.dtype.kind == "f":
        if not np.all(np.isfinite(array)) or not np.all(array == np.round(array)):
            raise ParameterError("counts must hold integers, got non-integral floats")
        array = np.clip(array, 0, _EXACT_LIMIT)
    elif array.dtype.kind not in "biu":
        raise ParameterError(f"counts must be integers, got dtype {array.dtype}")
    array = array.astype(np.int64)
    if np.any(array < 0):
        raise ParameterError("counts must be non-negative")
    return np.minimum(array, _EXACT_LIMIT)


def _noisy(counts: np.ndarray, scale: Fraction, rng: np.random.Generator) -> np.ndarray:
    noisy = counts + sample_discrete_laplace(scale, counts.size, rng)
    return np.clip(noisy, -_EXACT_LIMIT, _EXACT_LIMIT)


def _binomial(trials: int, probability: float, rng: np.random.Generator) -> int:
    """``Binomial(trials, probability)`` for any ``trials <= 2**64``, by counting geometric gaps.

    Successes are at the partial sums of i.i.d. ``Geometric(probability)`` gaps; a gap is
    ``floor(E/λ) + 1`` with ``E ~ Exp(1)``, ``λ = -ln(1 - probability)``. Works when
    ``probability`` is below the float resolution of ``1 - probability``, where
    ``numpy.random.binomial`` would return 0.
    """
    if trials == 0 or probability <= 0.0:
        return 0
    if probability >= 1.0:
        return trials
    rate = -math.log1p(-probability)
    mean = trials * probability
    successes, position = 0, 0.0
    while True:
        batch = int(min(mean * 1.05 + 6.0 * math.sqrt(mean) + 16.0, 1 << 22))
        gaps = np.floor(rng.standard_exponential(batch) / rate) + 1.0
        positions = position + np.cumsum(gaps)
        hits = int(np.searchsorted(positions, float(trials), side="right"))
        successes += hits
        if hits < batch:
            return successes
        position = float(positions[-1])


def _distinct_positions(size: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random set of ``count`` distinct positions in ``[0, size)``, as uint64."""
    if size <= 2**63 - 1:
        return rng.choice(size, size=count, replace=False, shuffle=False).astype(np.uint64)
    chosen = np.unique(rng.integers(0, size, size=count, dtype=np.uint64))
    while chosen.size < count:
        extra = rng.integers(0, size, size=count - chosen.size, dtype=np.uint64)
        chosen = np.unique(np.concatenate([chosen, extra]))
    return chosen


def _tail_values(tau: int, count: int, scale: Fraction, rng: np.random.Generator) -> np.ndarray:
    """``count`` draws of ``Z | Z >= tau`` (``tau >= 0``): ``tau + (Z | Z >= 0)``, by rejection."""
    out = np.empty(0, dtype=np.int64)
    while out.size < count:
        draws = sample_discrete_laplace(scale, 2 * (count - out.size) + 8, rng)
        out = np.concatenate([out, draws[draws >= 0]])
    return tau + out[:count]


def _release_approximate(
    kind: str,
    keys: np.ndarray,
    counts: np.ndarray,
    *,
    epsilon: float,
    delta: float,
    bounds: Contribution,
    confidence: float,
    rng: np.random.Generator,
) -> ThresholdRelease:
    scale = _scale(epsilon, bounds)
    limits = {
        "max_groups_per_unit": bounds.max_groups_per_unit,
        "max_rows_per_group": bounds.max_rows_per_group,
        "max_rows_per_unit": bounds.max_rows_per_unit,
    }
    tau = tau_for_delta(epsilon=epsilon, delta=delta, **limits)
    if not _unique(keys):
        raise ParameterError("keys must be distinct (aggregate counts per key first)")
    present = np.flatnonzero(counts > 0)
    noisy = _noisy(counts[present], scale, rng)
    kept = np.flatnonzero(ThresholdRule(tau, scale).released(noisy))
    kept = kept[rng.permutation(kept.size)]
    return ThresholdRelease(
        keys=keys[present[kept]],
        values=noisy[kept],
        tau=tau,
        scale=scale,
        epsilon=epsilon,
        delta=delta_for_tau(tau=tau, epsilon=epsilon, **limits),
        **limits,
        key_kind=kind,
        half_width=interval_half_width(scale, confidence),
        confidence=confidence,
    )


def _unique(values: np.ndarray) -> bool:
    # dtype=object keeps pandas from converting strings to its Arrow string type first (2x).
    dtype = object if values.dtype == object else None
    import pandas as pd
    return bool(pd.Index(values, dtype=dtype).is_unique)


def _domain_positions(
    kind: str,
    keys: np.ndarray,
    counts: np.ndarray,
    domain: Domain,
    seed: int | None,
    key_hashes: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(positions, counts)`` of the non-zero keys in ``[0, d)``; hash collisions add up."""
    if isinstance(domain, IntegerDomain):
        if kind != "int":
            raise ParameterError("an IntegerDomain needs integer keys")
        if keys.dtype == np.uint64:
            small = keys <= np.uint64(2**63 - 1)
            keys, counts = keys[small].view(np.int64), counts[small]
        inside = (keys >= domain.low) & (keys <= domain.high)
        positions = keys[inside].astype(np.uint64) - np.uint64(domain.low % 2**64)
        if not _unique(positions):
            raise ParameterError("keys must be distinct (aggregate counts per key first)")
        return positions, counts[inside]
    if key_hashes is None:
        positions = hash_keys(keys, check_seed(seed))
    else:
        positions = np.asarray(key_hashes, dtype=np.uint64)
        if positions.shape != keys.shape:
            raise ParameterError("key_hashes must have one hash per key")
    if _unique(positions):
        return positions, counts
    import pandas as pd
    if kind == "int" or not pd.Index(keys).is_unique:
        raise ParameterError("keys must be distinct (aggregate counts per key first)")
    positions, inverse = np.unique(positions, return_inverse=True)
    return positions, np.bincount(inverse, weights=counts).astype(np.int64)


def _release_pure(
    kind: str,
    keys: np.ndarray,
    counts: np.ndarray,
    *,
    epsilon: float,
    domain: Domain,
    bounds: Contribution,
    tau: int | None,
    expected_false_positives: float,
    seed: int | None,
    key_hashes: np.ndarray | None,
    confidence: float,
    rng: np.random.Generator,
) -> ThresholdRelease:
    scale = _scale(epsilon, bounds)
    if tau is None:
        tau = tau_for_false_positives(
            epsilon=epsilon,
            domain=domain,
            max_groups_per_unit=bounds.max_groups_per_unit,
            max_rows_per_group=bounds.max_rows_per_group,
            max_rows_per_unit=bounds.max_rows_per_unit,
            expected_false_positives=expected_false_positives,
        )
    elif isinstance(tau, bool) or not isinstance(tau, int | np.integer) or tau < 1:
        raise ParameterError(f"tau must be an integer >= 1, got {tau!r}")
    tau = int(tau)
    rule = ThresholdRule(tau, scale)
    expected = _domain_false_positive_rate(scale, tau, domain.size)
    if expected > MAX_EXPECTED_FALSE_POSITIVES:
        raise ParameterError(
            f"tau={tau} is too low for a domain of {domain.size} keys: about {expected:.3g} zero "
            f"keys would be released (at most {MAX_EXPECTED_FALSE_POSITIVES}); raise tau"
        )
    if isinstance(domain, HashDomain):
        seed = new_seed(rng) if seed is None else check_seed(seed)
    positions, counts = _domain_positions(kind, keys, counts, domain, seed, key_hashes)
    present = counts > 0
    positions, counts = positions[present], counts[present]

    noisy = _noisy(counts, scale, rng)
    kept = rule.released(noisy)
    candidates = _distinct_positions(
        domain.size, _binomial(domain.size, rule.release_probability(0), rng), rng
    )
    import pandas as pd
    candidates = candidates[~pd.Series(candidates, copy=False).isin(positions).to_numpy()]
    out_positions = np.concatenate([positions[kept], candidates])
    out_values = np.concatenate([noisy[kept], _tail_values(tau, candidates.size, scale, rng)])
    order = rng.permutation(out_positions.size)
    out_positions, out_values = out_positions[order], out_values[order]
    if isinstance(domain, IntegerDomain):
        out_keys = (out_positions + np.uint64(domain.low % 2**64)).view(np.int64)
        out_kind = "int"
    else:
        out_keys, out_kind = out_positions, "hash"
    return ThresholdRelease(
        keys=out_keys,
        values=out_values,
        tau=tau,
        scale=scale,
        epsilon=epsilon,
        delta=0.0,
        max_groups_per_unit=bounds.max_groups_per_unit,
        max_rows_per_group=bounds.max_rows_per_group,
        max_rows_per_unit=bounds.max_rows_per_unit,
        key_kind=out_kind,
        half_width=interval_half_width(scale, confidence),
        confidence=confidence,
        domain=domain,
        seed=seed if isinstance(domain, HashDomain) else None,
        mechanism="threshold_pure",
    )


def release(
    keys: object,
    counts: object,
    *,
    epsilon: float,
    delta: float,
    max_groups_per_unit: int,
    max_rows_per_group: int,
    max_rows_per_unit: int | None = None,
    domain: Domain | None = None,
    tau: int | None = None,
    expected_false_positives: float = 1.0,
    seed: int | None = None,
    key_hashes: np.ndarray | None = None,
    confidence: float = 0.95,
    rng: np.random.Generator | None = None,
) -> ThresholdRelease:
    """Noisy counts of the keys whose noisy count is at least τ; see the module docstring.

    ``delta > 0``: approximate DP (Korolova; full version Alg. 9) with ``τ = tau_for_delta(...)``;
    ``domain`` must be None. ``delta == 0``: pure ε-DP over ``domain`` (Alg. 3, Cormode et al.) with
    ``tau`` given or the smallest τ >= 1 expecting at most ``expected_false_positives`` released
    zero keys; keys outside an :class:`IntegerDomain` are dropped (they cannot be released), and for
    a :class:`HashDomain` keys are hashed under the public ``seed`` (fresh if None); callers that
    already hold ``hash_keys(keys, seed)`` may pass it as ``key_hashes`` to skip hashing again.

    >>> rng = np.random.Generator(np.random.PCG64(5))
    >>> out = release(["a", "b"], [1000, 1], epsilon=1.0, delta=1e-6,
    ...               max_groups_per_unit=1, max_rows_per_group=1, rng=rng)
    >>> out.keys.tolist(), out.tau
    (['a'], 15)
    """
    epsilon = positive_finite("epsilon", epsilon)
    bounds = _bounds(max_groups_per_unit, max_rows_per_group, max_rows_per_unit)
    if not isinstance(confidence, float | int) or not 0.0 < float(confidence) < 1.0:
        raise ParameterError(f"confidence must be strictly between 0 and 1, got {confidence!r}")
    kind, key_array = as_key_array(keys)
    count_array = _count_array(counts, key_array.size)
    rng = resolve_rng(rng)
    if isinstance(delta, bool) or not isinstance(delta, float | int) or delta != delta:
        raise ParameterError(f"delta must be a number in [0, 1), got {delta!r}")
    if delta == 0:
        return _release_pure(
            kind,
            key_array,
            count_array,
            epsilon=epsilon,
            domain=_check_domain(domain),
            bounds=bounds,
            tau=tau,
            expected_false_positives=positive_finite(
                "expected_false_positives", expected_false_positives
            ),
            seed=seed,
            key_hashes=key_hashes,
            confidence=float(confidence),
            rng=rng,
        )
    if domain is not None or tau is not None:
        raise ParameterError("domain and tau apply to pure DP only (delta=0); tau comes from delta")
    return _release_approximate(
        kind,
        key_array,
        count_array,
        epsilon=epsilon,
        delta=fraction_in_open_unit("delta", delta),
        bounds=bounds,
        confidence=float(confidence),
        rng=rng,
    )
