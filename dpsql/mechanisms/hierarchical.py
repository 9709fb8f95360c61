"""The hierarchical histogram: a b-ary tree of noisy counts that answers every range count.

Sources: Hay, Rastogi, Miklau, Suciu, "Boosting the Accuracy of Differentially Private Histograms
Through Consistency" (VLDB 2010: the tree ``H``, Theorem 3 for the least-squares estimate);
Qardaji, Yang, Li, "Understanding Hierarchical Methods for Differentially Private Histograms"
(VLDB 2013: the branching factor).

Release
-------
The ``N`` cell counts of a bounded column are the leaves of a complete b-ary tree of height ``H``
(``b^H >= N`` leaves, the padding cells are empty); every node holds the count of its leaves, and
every node at every level (root included, ``H + 1`` levels) gets independent discrete Laplace
noise of scale ``(H + 1)·Δ/ε``.

Privacy: one person changes the leaves by at most ``Δ`` in L1 (``sensitivity``), so each level's
counts move by at most ``Δ`` in L1 and the whole vector of node counts by ``(H + 1)·Δ``: the
release is ε-DP (geometric mechanism, Ghosh et al. 2009; exact sampling as in
:mod:`dpsql.mechanisms.laplace`). Consistency, answers and intervals are post-processing. A tree
whose internal nodes were copied without noise from their noisy children would be fine; one whose
internal nodes are *exact* counts is not (broken twin in the tests).

Consistency (Hay et al. 2010, §4, Theorem 3): the minimum-variance unbiased estimate that is
consistent (each node equals the sum of its children), computed in two linear passes: bottom-up
``z[v] = (b^i − b^(i−1))/(b^i − 1)·ỹ[v] + (b^(i−1) − 1)/(b^i − 1)·Σ z[children]`` at height ``i``
(leaves ``i = 1``), then top-down ``h̄[v] = z[v] + (h̄[parent] − Σ z[siblings and v])/b``.

Branching (Qardaji et al. 2013, Equation 3): with constrained inference and ε split evenly over
the levels, the average error variance of a random range query is proportional to
``(b − 1)·h³ − 2(b + 1)·h²/3`` for a tree of height ``h = ⌈log_b N⌉`` (a range is covered by about
``(b − 1)·h`` nodes, each with noise variance ``∝ h²``; consistency takes off the second term).
:func:`choose_branching` minimises exactly this expression over ``b = 2..64``, as the authors'
procedure does (they search every ``b``; their analysis puts the optimum near 16 for large
domains); ties go to fewer padded leaves. Checked against the paper's formula as quoted by the
DPComp benchmark's implementation of their HB method (Hay et al., SIGMOD 2016).

Answers and exact intervals
---------------------------
A range ``[lo, hi)`` of cells is answered as the sum of its consistent leaves (a prefix-sum
difference, O(1)). Its error is ``Σ_v w_v·X_v`` over all noisy nodes, with ``w`` the range's
weights under the (linear) consistency map, computed by the adjoint of the two passes (O(nodes)).
The interval is the Chernoff bound with the exact moment generating function of discrete Laplace
noise, ``ln M(t) = 2 ln(1 − a) − ln(1 − a e^t) − ln(1 − a e^(−t))``, ``a = e^(−1/scale)``:
``P(|err| ≥ u) <= 2 exp(−λu + Σ ln M(λ w_v))`` for every admissible ``λ``; the weights are
rounded up in magnitude to a 0.1% geometric grid (``ln M`` is even and increasing in ``|t|``, so
this only widens the bound), and ``u`` is the smallest over a fixed grid of ``λ``. The interval
covers the true range count of the bounded data with probability at least ``confidence``, for
every range; it is not a union over ranges.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpsql.errors import ParameterError
from dpsql.mechanisms.laplace import noise_scale, sample_discrete_laplace
from dpsql.memo import Kept

__all__ = ["HierarchicalHistogram", "RangeAnswer", "choose_branching", "release_hierarchical"]

_MAX_BRANCHING = 64
_WEIGHT_GRID = math.log1p(1e-3)
_LAMBDA_GRID = np.geomspace(1e-3, 0.999, 48)
_SAFETY = 1.0 + 1e-9


def _height(cells: int, branching: int) -> int:
    height, size = 1, branching
    while size < cells:
        height, size = height + 1, size * branching
    return height


def choose_branching(cells: int) -> int:
    """The branching factor ``b`` minimising Qardaji et al.'s Equation 3, ``(b − 1)·h³ −
    2(b + 1)·h²/3`` with ``h = ⌈log_b cells⌉`` (ties: fewer padded leaves).

    >>> choose_branching(10_000), choose_branching(1_000_000), choose_branching(1000)
    (22, 16, 32)
    """
    if isinstance(cells, bool) or not isinstance(cells, int) or cells < 2:
        raise ParameterError(f"cells must be an integer >= 2, got {cells!r}")

    def proxy(b: int) -> tuple[Fraction, int]:
        height = _height(cells, b)
        variance = (b - 1) * height**3 - Fraction(2 * (b + 1) * height**2, 3)
        return (variance, b**height)

    return min(range(2, _MAX_BRANCHING + 1), key=proxy)


@dataclass(frozen=True)
class RangeAnswer:
    """A range count: the consistent estimate and an interval covering the true count."""

    value: float
    lower: float
    upper: float
    confidence: float


def _sums(values: np.ndarray, branching: int) -> np.ndarray:
    return values.reshape(-1, branching).sum(axis=1)


@dataclass(frozen=True, eq=False)
class HierarchicalHistogram:
    """A released tree: noisy counts per level (leaves first, root last), all public."""

    cells: int
    branching: int
    noisy: tuple[np.ndarray, ...]
    scale: Fraction
    epsilon: float
    sensitivity: int

    @property
    def height(self) -> int:
        return len(self.noisy) - 1

    def __post_init__(self) -> None:
        leaves = self.consistent()
        object.__setattr__(self, "_leaves", leaves)
        object.__setattr__(self, "_prefix", np.concatenate([[0.0], np.cumsum(leaves)]))
        # A stream states a width before it answers (routing compares them), then answers
        # with it: kept by selection, a pure function of public values.
        object.__setattr__(self, "_widths", Kept(size=256))

    # --- consistency (Hay et al. 2010) -----------------------------------------------------------
    def _coefficients(self, level: int) -> tuple[float, float]:
        """Bottom-up weights of the node's own count and of its children's sum at ``level``."""
        b, i = self.branching, level + 1
        whole = b**i - 1
        return (b**i - b ** (i - 1)) / whole, (b ** (i - 1) - 1) / whole

    def consistent(self) -> np.ndarray:
        """The least-squares consistent leaf counts (floats), one per padded leaf."""
        b = self.branching
        z = [self.noisy[0].astype(np.float64)]
        for level in range(1, self.height + 1):
            own, children = self._coefficients(level)
            z.append(own * self.noisy[level] + children * _sums(z[-1], b))
        estimate = z[-1]
        for level in range(self.height - 1, -1, -1):
            gap = (estimate - _sums(z[level], b)) / b
            estimate = z[level] + np.repeat(gap, b)
        return estimate

    def weights(self, lo: int, hi: int) -> list[np.ndarray]:
        """``∂ answer(lo, hi) / ∂ noisy[level]`` for each level: the adjoint of the two passes."""
        lo, hi = self._range(lo, hi)
        indicator = np.zeros(self.noisy[0].size)
        indicator[lo:hi] = 1.0
        return self._adjoint(indicator)

    def _adjoint(self, grad: np.ndarray) -> list[np.ndarray]:
        """Weights on every noisy count of the answer ``grad · consistent()``."""
        b = self.branching
        grad_z = []
        for _level in range(self.height):
            pooled = _sums(grad, b)
            grad_z.append(grad - np.repeat(pooled, b) / b)
            grad = pooled / b
        grad_z.append(grad)
        result: list[np.ndarray] = [np.empty(0)] * (self.height + 1)
        for level in range(self.height, 0, -1):
            own, children = self._coefficients(level)
            result[level] = own * grad_z[level]
            grad_z[level - 1] = grad_z[level - 1] + children * np.repeat(grad_z[level], b)
        result[0] = grad_z[0]
        return result

    # --- answers ----------------------------------------------------------------------------------
    def _range(self, lo: int, hi: int) -> tuple[int, int]:
        for name, value in (("lo", lo), ("hi", hi)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise ParameterError(f"{name} must be a cell index, got {value!r}")
        if not 0 <= lo <= hi <= self.cells:
            raise ParameterError(f"range [{lo}, {hi}) is not within the {self.cells} cells")
        return int(lo), int(hi)

    def estimate(self, lo: int, hi: int) -> float:
        """The consistent count of cells ``[lo, hi)`` (O(1))."""
        lo, hi = self._range(lo, hi)
        prefix = self._prefix  # type: ignore[attr-defined]
        return float(prefix[hi] - prefix[lo])

    def half_width(self, lo: int, hi: int, confidence: float = 0.95) -> float:
        """``u`` with ``P(|estimate − true| >= u) <= 1 − confidence`` (exact Chernoff bound)."""
        lo, hi = self._range(lo, hi)
        return self._half_width(self.weights(lo, hi), confidence)

    def answer_cells(self, selected: np.ndarray, confidence: float = 0.95) -> RangeAnswer:
        """The count of the cells where ``selected`` (a boolean vector over the cells) is true,
        e.g. a union of ranges, with its interval (the weights add up)."""
        width = self.cells_half_width(selected, confidence)
        value = float(self._leaves[: self.cells][selected].sum())  # type: ignore[attr-defined]
        return RangeAnswer(value, value - width, value + width, confidence)

    def cells_half_width(self, selected: np.ndarray, confidence: float = 0.95) -> float:
        """The half-width of ``answer_cells(selected)``'s interval: a function of the cells
        selected and the noise scale only (no released value), so it can be compared before
        answering."""
        mask = np.asarray(selected)
        if mask.dtype != np.bool_ or mask.shape != (self.cells,):
            raise ParameterError(f"selected must be a boolean vector over the {self.cells} cells")
        def computed() -> float:
            indicator = np.zeros(self.noisy[0].size)
            indicator[: self.cells] = mask
            return self._half_width(self._adjoint(indicator), confidence)

        widths: Kept[float] = self._widths  # type: ignore[attr-defined]
        return widths.get((np.packbits(mask).tobytes(), float(confidence)), computed)

    def _half_width(self, weights: list[np.ndarray], confidence: float) -> float:
        if not 0.0 < confidence < 1.0:
            raise ParameterError(f"confidence must be strictly between 0 and 1, got {confidence}")
        magnitudes = np.abs(np.concatenate(weights))
        magnitudes = magnitudes[magnitudes > 1e-300]
        if magnitudes.size == 0:
            return 0.0
        buckets = np.ceil(np.log(magnitudes) / _WEIGHT_GRID).astype(np.int64)
        low = int(buckets.min())
        counts = np.bincount(buckets - low)
        present = np.flatnonzero(counts)
        rounded = np.exp((present + low) * _WEIGHT_GRID)
        multiplicity = counts[present]
        scale = float(self.scale)
        a = math.exp(-1.0 / scale)
        lambdas = _LAMBDA_GRID / (scale * float(rounded.max()))
        t = np.outer(lambdas, rounded)
        log_mgf = 2.0 * math.log1p(-a) - np.log1p(-a * np.exp(t)) - np.log1p(-a * np.exp(-t))
        tail = math.log(2.0 / (1.0 - confidence))
        bounds = (log_mgf @ multiplicity + tail) / lambdas
        return float(bounds.min()) * _SAFETY

    def answer(self, lo: int, hi: int, confidence: float = 0.95) -> RangeAnswer:
        """The count of cells ``[lo, hi)`` with an interval at level ``confidence``."""
        value = self.estimate(lo, hi)
        width = self.half_width(lo, hi, confidence)
        return RangeAnswer(value, value - width, value + width, confidence)

    # --- storage ----------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        header = json.dumps(
            {
                "cells": self.cells,
                "branching": self.branching,
                "scale": [self.scale.numerator, self.scale.denominator],
                "epsilon": self.epsilon,
                "sensitivity": self.sensitivity,
            }
        ).encode()
        buffer = io.BytesIO()
        buffer.write(len(header).to_bytes(4, "little"))
        buffer.write(header)
        for level in self.noisy:
            buffer.write(np.ascontiguousarray(level, dtype="<i8").tobytes())
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> HierarchicalHistogram:
        size = int.from_bytes(data[:4], "little")
        header = json.loads(data[4 : 4 + size])
        values = np.frombuffer(data[4 + size :], dtype="<i8").astype(np.int64)
        b = header["branching"]
        height = _height(header["cells"], b)
        levels, start = [], 0
        for level in range(height + 1):
            count = b ** (height - level)
            levels.append(values[start : start + count])
            start += count
        return cls(
            cells=header["cells"],
            branching=b,
            noisy=tuple(levels),
            scale=Fraction(*header["scale"]),
            epsilon=header["epsilon"],
            sensitivity=header["sensitivity"],
        )


def release_hierarchical(
    counts: object,
    *,
    epsilon: float,
    sensitivity: int = 1,
    branching: int | None = None,
    rng: np.random.Generator | None = None,
) -> HierarchicalHistogram:
    """Release the noisy tree over ``counts`` (true cell counts, int); ε-DP (module docstring).

    >>> rng = np.random.Generator(np.random.PCG64(5))
    >>> tree = release_hierarchical(np.full(100, 50), epsilon=1.0, rng=rng)
    >>> tree.branching, tree.height, float(tree.scale)
    (10, 2, 3.0)
    >>> answer = tree.answer(10, 60)
    >>> answer.lower <= 2500 <= answer.upper
    True
    """
    array = np.asarray(counts)
    if array.ndim != 1 or array.size < 2 or array.dtype.kind not in "iu":
        raise ParameterError("counts must be a one-dimensional integer array with >= 2 cells")
    if isinstance(sensitivity, bool) or not isinstance(sensitivity, int) or sensitivity < 1:
        raise ParameterError(f"sensitivity must be a positive integer, got {sensitivity!r}")
    cells = int(array.size)
    b = choose_branching(cells) if branching is None else branching
    if isinstance(b, bool) or not isinstance(b, int) or not 2 <= b <= _MAX_BRANCHING:
        raise ParameterError(f"branching must be an integer in [2, 64], got {branching!r}")
    height = _height(cells, b)
    scale = noise_scale((height + 1) * sensitivity, epsilon)
    leaves = np.zeros(b**height, dtype=np.int64)
    leaves[:cells] = np.clip(array.astype(np.int64), -(2**53), 2**53)
    exact = [leaves]
    for _level in range(height):
        exact.append(_sums(exact[-1], b))
    total = sum(level.size for level in exact)
    noise = sample_discrete_laplace(scale, total, rng)
    noisy, start = [], 0
    for level in exact:
        noisy.append(level + noise[start : start + level.size])
        start += level.size
    return HierarchicalHistogram(
        cells=cells,
        branching=b,
        noisy=tuple(noisy),
        scale=scale,
        epsilon=float(epsilon),
        sensitivity=sensitivity,
    )
