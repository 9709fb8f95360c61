"""The combined sparse-histogram synopsis: thresholded heavy keys plus an ALP sketch for the rest.

Sec. 4 of Aumüller, Lebeda and Pagh (CCS'21): release the threshold output (Alg. 3, pure DP over a
public domain, Thm 4.1; or Korolova's approximate-DP threshold, Alg. 9 of the full version, Thm 4.2)
and an ALP projection (Alg. 1) with ``β = τ``; ``lookup(i)`` returns the released noisy count of
``i`` if the threshold released it, else the ALP estimate (Alg. 2). Any key can be looked up later
at no privacy cost (post-processing).

Budget: the threshold gets ``split · ε`` and the sketch the rest (sequential composition, Dwork and
Roth Thm 3.16), so the structure is ε-DP (``delta = 0``) or (ε, δ)-DP. The sketch is computed after
the threshold and leaves out the keys the threshold released (their lookups never reach it), which
removes the longest unary codes and so most hash collisions. This is adaptive composition: given
the threshold's output, the sketch of the remaining keys is still ``(1 - split)·ε``-DP, because
removing the same public set of keys from neighbouring inputs keeps them neighbours.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from dpsql.errors import ParameterError
from dpsql.mechanisms import alp, threshold
from dpsql.mechanisms.hashing import (
    as_key_array,
    check_seed,
    fraction_in_open_unit,
    hash_keys,
    new_seed,
    positive_finite,
)
from dpsql.mechanisms.laplace import interval_half_width
from dpsql.mechanisms.random import resolve_rng

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["DEFAULT_SPLIT", "Answer", "CombinedRelease", "release"]

DEFAULT_SPLIT = 0.5
"""Share of ε for the threshold (the paper's ε/2 each)."""

_MAGIC = b"DPSQLCMB"
_FORMAT_VERSION = 1


@dataclass(frozen=True, eq=False)
class Answer:
    """A point or IN-list count from the structure, with its interval and accuracy facts."""

    value: float
    lower: float
    upper: float
    released: np.ndarray
    """Per key: answered by the threshold release (else by the sketch)."""
    sketch_error_bound: float
    """Expected per-entry error bound of a sketch answer (ALP, full version)."""
    unreleased_ceiling: int
    """A key the threshold did not release has a true count of at most this (at the level)."""
    sketch_beats_zero: bool


@dataclass(frozen=True, eq=False)
class CombinedRelease:
    """Threshold output + ALP sketch (Sec. 4); :meth:`lookup` answers any key."""

    threshold: threshold.ThresholdRelease
    sketch: alp.ALPSketch
    epsilon: float
    delta: float
    split: float
    mechanism: str = "combined"

    @property
    def seed(self) -> int:
        """The public seed of the key hashes (shared by the sketch and a hash-domain threshold)."""
        return self.sketch.seed

    @cached_property
    def _released_index(self) -> pd.Index:
        import pandas as pd
        return pd.Index(self.threshold.keys)

    def _positions(self, kind: str, keys: np.ndarray) -> np.ndarray:
        if kind != self.sketch.key_kind and keys.size:
            raise ParameterError(f"keys must be {self.sketch.key_kind} keys, got {kind}")
        if self.threshold.key_kind == "hash":
            return self._released_index.get_indexer(hash_keys(keys, self.seed))
        return self._released_index.get_indexer(keys)

    def released(self, keys: object) -> np.ndarray:
        """Mask of the keys whose answer comes from the threshold release."""
        return self._positions(*as_key_array(keys)) >= 0

    def lookup(self, keys: object) -> np.ndarray:
        """Released noisy count when the threshold released the key, else the ALP estimate."""
        kind, array = as_key_array(keys)
        positions = self._positions(kind, array)
        out = np.empty(array.size, dtype=np.float64)
        hit = positions >= 0
        out[hit] = self.threshold.values[positions[hit]]
        out[~hit] = self.sketch.estimate(array[~hit])
        return out

    def answer(self, keys: object, *, confidence: float, keys_per_row: float) -> Answer:
        """The sum of ``keys``' counts with a ``confidence`` interval (post-processing).

        Each key's share of the miss probability is ``(1 - confidence) / n`` (union bound). A key
        the threshold released is its noisy count ± the noise's half-width at that level. A key
        it did not release has a true count below ``c*``, the smallest count released with that
        probability (a count of ``c*`` or more goes unreleased less often than that), and at
        least 0: its interval is ``[0, c* - 1]`` and its ALP estimate is clamped into it, which
        only moves it towards the truth whenever the interval covers. The estimate's expected
        error is at most ``ALPSketch.expected_error_bound(keys_per_row)``; when that is at least
        ``c* - 1`` the sketch cannot be shown to beat answering 0 (whose error is at most ``c* - 1``
        in the same event), and ``sketch_beats_zero`` is false. The bound grows as ``α/ε`` and
        ``c*`` as ``ln(1/δ)/ε``: the sketch provably helps only for small δ (or a pure-DP
        domain's larger τ).
        """
        kind, array = as_key_array(keys)
        positions = self._positions(kind, array)
        hit = positions >= 0
        level = 1.0 - (1.0 - confidence) / max(1, array.size)
        rule = self.threshold
        half = interval_half_width(rule.scale, level)
        ceiling = threshold.count_released_with_probability(rule.tau, rule.scale, level) - 1
        values = np.empty(array.size, dtype=np.float64)
        values[hit] = rule.values[positions[hit]]
        values[~hit] = np.clip(self.sketch.estimate(array[~hit]), 0.0, ceiling)
        lower = np.where(hit, np.maximum(values - half, 0.0), 0.0)
        upper = np.where(hit, values + half, float(ceiling))
        error = self.sketch.expected_error_bound(keys_per_row)
        return Answer(
            value=float(values.sum()),
            lower=float(lower.sum()),
            upper=float(upper.sum()),
            released=hit,
            sketch_error_bound=error,
            unreleased_ceiling=ceiling,
            sketch_beats_zero=bool(error < ceiling),
        )

    def to_bytes(self) -> bytes:
        """Both parts (public outputs and parameters only), framed with a small header."""
        header = json.dumps(
            {
                "format": "dpsql-combined",
                "version": _FORMAT_VERSION,
                "epsilon": self.epsilon,
                "delta": self.delta,
                "split": self.split,
            },
            sort_keys=True,
        ).encode()
        first = self.threshold.to_bytes()
        return (
            _MAGIC
            + struct.pack("<IQ", len(header), len(first))
            + header
            + first
            + self.sketch.to_bytes()
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> CombinedRelease:
        """Inverse of :meth:`to_bytes`; ParameterError on anything malformed."""
        data = bytes(data)
        if len(data) < 20 or data[:8] != _MAGIC:
            raise ParameterError("data is not a serialized combined release (bad magic)")
        header_length, first_length = struct.unpack("<IQ", data[8:20])
        try:
            header = json.loads(data[20 : 20 + header_length])
            if header["format"] != "dpsql-combined" or header["version"] != _FORMAT_VERSION:
                raise ParameterError(f"unsupported combined format {header['format']!r}")
            start = 20 + header_length
            return cls(
                threshold=threshold.ThresholdRelease.from_bytes(data[start : start + first_length]),
                sketch=alp.ALPSketch.from_bytes(data[start + first_length :]),
                epsilon=float(header["epsilon"]),
                delta=float(header["delta"]),
                split=float(header["split"]),
            )
        except (KeyError, TypeError, ValueError) as error:
            if isinstance(error, ParameterError):
                raise
            raise ParameterError(f"malformed combined release: {error}") from error


def release(
    keys: object,
    counts: object,
    *,
    epsilon: float,
    delta: float = 0.0,
    split: float = DEFAULT_SPLIT,
    domain: threshold.Domain | None = None,
    max_groups_per_unit: int = 1,
    max_rows_per_group: int = 1,
    max_rows_per_unit: int | None = None,
    alpha: float | Fraction = alp.DEFAULT_ALPHA,
    s: int | None = None,
    rows_per_key: float = alp.DEFAULT_ROWS_PER_KEY,
    size_fraction: float = alp.DEFAULT_SIZE_FRACTION,
    expected_false_positives: float = 1.0,
    seed: int | None = None,
    confidence: float = 0.95,
    rng: np.random.Generator | None = None,
) -> CombinedRelease:
    """The Sec. 4 structure: ε-DP over ``domain`` if ``delta == 0`` (Thm 4.1), else (ε, δ)-DP (4.2).

    The threshold (:func:`dpsql.mechanisms.threshold.release`) gets ``split·ε`` (and ``delta``), the
    ALP sketch (:func:`dpsql.mechanisms.alp.project_hashes`, ``β = τ``) the rest; ``s``,
    ``rows_per_key``, ``size_fraction`` and ``alpha`` go to the sketch, ``expected_false_positives``
    to the pure threshold. ``seed`` (public, fresh if None) fixes all key hashes.

    >>> rng = np.random.Generator(np.random.PCG64(2))
    >>> out = release(np.arange(100), np.arange(100), epsilon=1.0,
    ...               domain=threshold.IntegerDomain(0, 10**6), rng=rng)
    >>> out.threshold.tau, out.sketch.m, out.lookup([99, 5]).shape
    (27, 4, (2,))
    """
    epsilon = positive_finite("epsilon", epsilon)
    split = fraction_in_open_unit("split", split)
    kind, key_array = as_key_array(keys)
    rng = resolve_rng(rng)
    seed = new_seed(rng) if seed is None else check_seed(seed)
    threshold_epsilon = split * epsilon
    key_hashes = hash_keys(key_array, seed)
    hashed_domain = isinstance(domain, threshold.HashDomain)
    heavy = threshold.release(
        key_array,
        counts,
        epsilon=threshold_epsilon,
        delta=delta,
        max_groups_per_unit=max_groups_per_unit,
        max_rows_per_group=max_rows_per_group,
        max_rows_per_unit=max_rows_per_unit,
        domain=domain,
        expected_false_positives=expected_false_positives,
        seed=seed if hashed_domain else None,
        key_hashes=key_hashes if hashed_domain and delta == 0 else None,
        confidence=confidence,
        rng=rng,
    )
    released = heavy.keys if heavy.key_kind == "hash" else hash_keys(heavy.keys, seed)
    import pandas as pd
    rest = ~pd.Series(key_hashes, copy=False).isin(released).to_numpy()
    values = np.asarray(counts)
    if values.ndim != 1 or values.size != key_array.size:
        raise ParameterError(
            f"counts must be one-dimensional with one entry per key ({key_array.size})"
        )
    sketch = alp.project_hashes(
        key_hashes[rest],
        values[rest],
        key_kind=kind,
        epsilon=epsilon - threshold_epsilon,
        seed=seed,
        alpha=alpha,
        s=s,
        beta=float(heavy.tau),
        rows_per_key=rows_per_key,
        size_fraction=size_fraction,
        max_groups_per_unit=max_groups_per_unit,
        max_rows_per_group=max_rows_per_group,
        max_rows_per_unit=max_rows_per_unit,
        rng=rng,
    )
    return CombinedRelease(
        threshold=heavy, sketch=sketch, epsilon=epsilon, delta=heavy.delta, split=split
    )
