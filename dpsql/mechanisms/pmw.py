"""Online private multiplicative weights: many linear queries answered from one budget.

Source: G. Kamath, "Lecture 9 — Sparse Vector" (lecture notes), section "Online Private
Multiplicative Weights" and Theorem 5 (after Hardt and Rothblum, FOCS 2010, and Dwork–Roth 2014
§4.2); the update rule is the multiplicative-weights step of MWEM (Hardt, Ligett, McSherry, NeurIPS
2012).

Algorithm
---------
The data is a histogram ``h`` over a public finite domain ``X`` (``n = Σh`` rows); a query is a
0/1 vector ``f`` over ``X`` (a count: ``⟨f, h⟩``). The mechanism keeps a distribution ``p̂`` over
``X`` (uniform at first) and a noisy total ``n̂``:

1. at construction, ``n̂ = n + DLap(Δ/ε_n)`` with ``ε_n = count_share·ε``;
2. each query gets the synthetic answer ``s = n̂·⟨f, p̂⟩``; NumericSparse
   (:class:`dpsql.mechanisms.svt.SparseVector`, budget ``ε − ε_n``) compares the error
   ``|⟨f, h⟩ − s|`` with the public threshold ``T``;
3. ⊥: the answer is ``s`` (the synthetic distribution is close enough);
4. ⊤: the answer is the fresh noisy count ``v = ⟨f, h⟩ + DLap(b_value)`` and ``p̂`` takes a
   multiplicative-weights step **on the noisy value**: ``p̂(x) ∝ p̂(x)·exp(η f(x))`` with
   ``η = clip((v − s)/(2n̂), −1, 1)``;
5. after ``c = updates`` ⊤ answers the mechanism halts (:class:`StreamExhaustedError`).

**Warm start** (``warm_share > 0``; our addition, private by composition): before the first query
a share ``ε_w = warm_share·ε`` releases the hierarchical histogram of the data over the (flattened)
domain (:func:`dpsql.mechanisms.hierarchical.release_hierarchical`, ε_w-DP). Instead of the
uniform distribution, ``p̂`` starts from its consistent leaves made non-negative top-down
(:func:`warm_prior`: at every level the children's estimates below one noise standard deviation
are set to 0 and the rest rescaled to their parent's value), and ``n̂`` is the sum of those
leaves (no count share): post-processing of the tree. The online PMW then runs on the remaining
``ε − ε_w``; it is ``(ε − ε_w, δ)``-DP for *every* fixed starting distribution, so the whole
stream is ``(ε, δ)``-DP by (adaptive) sequential composition. Uniform is the worst start for a
concentrated distribution: the multiplicative-weights potential ``KL(h/n ‖ p̂)`` starts at up to
``ln|X|`` and each update removes only ``(γ² − ρ²)/4`` of it; a noisy histogram starts it near
0, so the sparse vector rarely fires and the answers have about the histogram's error.

Two practical options, both post-processing of released values (privacy unchanged):
``replays`` sweeps the same step over the (most recent 64) measurements after each update
(MWEM's practice), and ``update="project"`` replaces the damped step by the exact KL projection
onto the measured answer (``p̂`` inside the query is scaled so that ``n̂·⟨f, p̂⟩ = v``, the rest
so that ``p̂`` stays a distribution; iterative proportional fitting when replayed). The bound on the
number of updates below is proven for the default ``update="mw"`` without replays only.

Privacy
-------
``(ε, δ)``-DP for queries chosen adaptively, when ``sensitivity = Δ`` bounds ``‖h − h'‖₁`` over
neighbouring databases: ``n̂`` is the discrete Laplace mechanism (ε_n-DP); every compared value
``|⟨f, h⟩ − s|`` has sensitivity ``Δ`` because ``s`` is a function of earlier *outputs* only; the
comparisons and the ≤ c released values are exactly NumericSparse (Kamath Thm 3, Dwork–Roth Alg. 3;
the value of a ⊤ query is the count ``⟨f, h⟩``, which also has sensitivity Δ, with the same
fresh-noise scale), so the stream costs ``ε_n + plan.epsilon`` and ``plan.delta`` (basic
composition), plus ``ε_w`` for a warm start. Everything else (``s``, ``p̂``, the answers from
``p̂``) is post-processing of those outputs. This is why the update must use ``v``, never
``⟨f, h⟩``: an update on the true count would make ``p̂``, and so every later synthetic answer, a
function of the data (the broken twin in the tests). The noisy threshold of the current epoch is
secret state; :meth:`state` must be stored as the data is.

Accuracy (Kamath Theorems 2/4 and Theorem 5's argument)
-------------------------------------------------------
With probability at least ``1 − β`` over ``k`` queries (:meth:`OnlinePMW.alpha`): every answer
from ``p̂`` is within ``T + α_svt(k)`` of the true count, every ⊤ answer within ``α_value`` (the
SVT plan's bounds, ``β`` split between them). Under the same event an update only happens when
the error is at least ``g = T − α_svt``; writing ``γ = g/n̂`` and ``ρ = (α_value + α_n)/n̂`` for the
normalised gap and measurement error, the potential ``KL(h/n ‖ p̂)`` (at most ``ln |X|`` at the
start) falls by at least ``(γ² − ρ²)/4`` per update (``e^x ≤ 1 + x + x²`` for ``|x| ≤ 1``, with
``η`` the halved measured error), so at most ``4 ln|X| / (γ² − ρ²)`` updates can occur
(:meth:`OnlinePMW.updates_bound`; ``n̂`` stands in for ``n``, a relative error of ``α_n/n``). If
``updates`` is at least that bound, the stream does not halt on that event: this is Theorem 5,
``n = Õ(log|Q|·sqrt(log|X|·log(1/δ))/(α²ε))`` with advanced composition.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpsql.errors import ParameterError
from dpsql.mechanisms.hierarchical import HierarchicalHistogram, release_hierarchical
from dpsql.mechanisms.laplace import interval_half_width, noise_scale, sample_discrete_laplace
from dpsql.mechanisms.random import resolve_rng
from dpsql.mechanisms.svt import SparseVector, SparseVectorHaltedError, SparseVectorPlan, plan

__all__ = [
    "OnlinePMW",
    "PMWAnswer",
    "PMWState",
    "StreamExhaustedError",
    "stated_alpha",
    "warm_prior",
]

_EXACT_FLOAT_LIMIT = 2**53
_REPLAY_WINDOW = 64
"""Replay sweeps revisit the most recent 64 measurements (bounded work per update)."""
_TINY = 1e-9
"""Shares are kept in [1e-9, 1 − 1e-9] by the projection step (no infinite log-weights)."""


class StreamExhaustedError(SparseVectorHaltedError):
    """The stream spent its ``c`` updates and answers no further query."""


@dataclass(frozen=True)
class PMWAnswer:
    """One answer: ``value``, whether it spent an update (``updated``: a fresh noisy count) or
    came from the synthetic distribution, and how many updates are left."""

    value: float
    updated: bool
    updates_left: int


@dataclass(frozen=True, eq=False)
class PMWState:
    """What a stream must remember between queries (and processes): the log-weights of ``p̂``,
    ``n̂``, the SVT's secret ``(noisy threshold, positives, queries seen)`` and the released
    measurements (packed query mask, noisy count) that later sweeps replay."""

    log_weights: np.ndarray
    n_hat: int
    sparse: tuple[int | float, int, int]
    measurements: tuple[tuple[np.ndarray, float], ...] = ()
    tree: bytes = b""
    """The warm start's released tree (``HierarchicalHistogram.to_bytes``; empty without a
    warm start): its intervals hold for every query, whatever the updates."""

    def header(self) -> str:
        """The small part (JSON): ``n̂``, the SVT state, the measured values. It changes with
        every query; :meth:`arrays` only with an update."""
        return json.dumps(
            {
                "n_hat": self.n_hat,
                "sparse": list(self.sparse),
                "cells": int(self.log_weights.size),
                "values": [value for _, value in self.measurements],
                "tree": len(self.tree),
            }
        )

    def arrays(self) -> bytes:
        """The log-weights and the packed masks of the measurements."""
        buffer = io.BytesIO()
        buffer.write(np.ascontiguousarray(self.log_weights, dtype="<f8").tobytes())
        buffer.write(self.tree)
        for packed, _ in self.measurements:
            buffer.write(packed.tobytes())
        return buffer.getvalue()

    @classmethod
    def from_parts(cls, header_text: str, data: bytes) -> PMWState:
        header = json.loads(header_text)
        cells = header["cells"]
        weights = np.frombuffer(data[: 8 * cells], dtype="<f8").astype(np.float64)
        tree_end = 8 * cells + int(header.get("tree", 0))
        tree = bytes(data[8 * cells : tree_end])
        start, width = tree_end, (cells + 7) // 8
        measurements = []
        for value in header["values"]:
            packed = np.frombuffer(data[start : start + width], dtype=np.uint8).copy()
            measurements.append((packed, float(value)))
            start += width
        sparse = tuple(header["sparse"])
        return cls(weights, int(header["n_hat"]), sparse, tuple(measurements), tree)  # type: ignore[arg-type]

    def to_bytes(self) -> bytes:
        header = self.header().encode()
        return len(header).to_bytes(4, "little") + header + self.arrays()

    @classmethod
    def from_bytes(cls, data: bytes) -> PMWState:
        size = int.from_bytes(data[:4], "little")
        return cls.from_parts(data[4 : 4 + size].decode(), data[4 + size :])


def _histogram(histogram: object) -> np.ndarray:
    array = np.asarray(histogram)
    if array.ndim != 1 or array.size < 2:
        raise ParameterError(
            f"histogram must be one-dimensional with >= 2 cells, got {array.shape}"
        )
    if array.dtype.kind not in "iu" or (array.size and array.min() < 0):
        raise ParameterError("histogram must hold non-negative integer counts")
    return array.astype(np.int64)


def warm_prior(
    consistent: np.ndarray, branching: int, cells: int, cut: float = 0.0
) -> np.ndarray:
    """A non-negative distribution (sums to 1) from a tree's consistent leaf estimates
    (``consistent``: ``branching``-ary, padded leaves; the first ``cells`` are the domain):
    top-down, each node's children keep their estimates above ``cut`` rescaled to the node's
    value (uniform when none is). Post-processing of the released tree. A cut of one noise
    standard deviation keeps the noise of empty regions from becoming synthetic mass (on
    bench_streams' workloads it roughly halves the 2-D error of a cut at 0)."""
    leaves = np.asarray(consistent, dtype=np.float64)
    sums = [leaves]
    while sums[-1].size > 1:
        sums.append(sums[-1].reshape(-1, branching).sum(axis=1))
    value = np.array([max(float(sums[-1][0]), 1.0)])
    for level in sums[-2::-1]:
        children = np.where(level > cut, level, 0.0).reshape(-1, branching)
        total = children.sum(axis=1, keepdims=True)
        even = np.full_like(children, 1.0 / branching)
        shares = np.divide(children, total, out=even, where=total > 0)
        value = (shares * value[:, None]).ravel()
    prior = value[:cells]
    if prior.sum() <= 0:
        return np.full(cells, 1.0 / cells)
    return prior / prior.sum()


def _plans(
    sparse_epsilon: float, delta: float, updates: int, sensitivity: int, value_share: float
) -> tuple[SparseVectorPlan, SparseVectorPlan]:
    """NumericSparse's plan (its values' scale) and its comparisons' plan (what the stream's
    ``SparseVector`` runs with: the same ε split and δ/2)."""
    common = {"c": updates, "sensitivity": sensitivity}
    numeric = plan(epsilon=sparse_epsilon, delta=delta, numeric=True, value_share=value_share,
                   **common)  # fmt: skip
    compared = sparse_epsilon - sparse_epsilon * value_share
    return numeric, plan(epsilon=compared, delta=delta / 2.0, **common)


def stated_alpha(
    *,
    epsilon: float,
    delta: float,
    updates: int,
    threshold: float,
    sensitivity: int,
    count_share: float,
    value_share: float,
    warm_share: float,
    queries: int,
    beta: float,
) -> float:
    """``OnlinePMW.alpha(queries, beta)`` from a stream's public parameters alone (no data, no
    draw): what its answers will state after ``queries`` queries."""
    spent = epsilon * warm_share + (0.0 if warm_share else epsilon * count_share)
    numeric, comparisons = _plans(epsilon - spent, delta, updates, sensitivity, value_share)
    compared = threshold + comparisons.comparison_alpha(queries, beta / 2.0)
    return max(compared, numeric.value_alpha(beta) or 0.0)


class OnlinePMW:
    """Online private multiplicative weights over a histogram (module docstring).

    ``histogram`` is the data (true counts per domain cell); ``updates`` is the cut-off ``c``;
    ``threshold`` the public error threshold ``T`` in counts; ``sensitivity`` bounds the L1 change
    of the histogram between neighbours; ``warm_share`` of ε buys a warm start (module
    docstring). ``state`` resumes a stream (no new ``n̂`` or warm start is drawn).

    >>> rng = np.random.Generator(np.random.PCG64(3))
    >>> h = np.array([5000, 3000, 1000, 1000])
    >>> pmw = OnlinePMW(h, epsilon=1.0, updates=4, threshold=200, rng=rng)
    >>> first = pmw.ask(np.array([True, False, False, False]))
    >>> first.updated, abs(first.value - 5000) < 200
    (True, True)
    >>> pmw.cost
    (1.0, 0.0)
    """

    def __init__(
        self,
        histogram: object,
        *,
        epsilon: float,
        updates: int,
        threshold: float,
        delta: float = 0.0,
        sensitivity: int = 1,
        count_share: float = 0.05,
        value_share: float = 1 / 9,
        replays: int = 0,
        update: str = "mw",
        warm_share: float = 0.0,
        rng: np.random.Generator | None = None,
        state: PMWState | None = None,
    ) -> None:
        self._histogram = _histogram(histogram)
        if not 0.0 < count_share < 1.0:
            raise ParameterError(f"count_share must be strictly between 0 and 1, got {count_share}")
        if not isinstance(epsilon, int | float) or not math.isfinite(epsilon) or epsilon <= 0:
            raise ParameterError(f"epsilon must be a finite positive number, got {epsilon!r}")
        if isinstance(sensitivity, bool) or not isinstance(sensitivity, int) or sensitivity < 1:
            raise ParameterError(f"sensitivity must be a positive integer, got {sensitivity!r}")
        if isinstance(warm_share, bool) or not 0.0 <= warm_share < 1.0:
            raise ParameterError(f"warm_share must be in [0, 1), got {warm_share!r}")
        self.epsilon = float(epsilon)
        self.sensitivity = sensitivity
        self.warm_epsilon = self.epsilon * warm_share
        # A warm start's tree also gives n̂ (the sum of its consistent leaves): no count share.
        self.count_epsilon = 0.0 if warm_share else self.epsilon * count_share
        self.count_scale: Fraction | None = (
            None if warm_share else noise_scale(sensitivity, self.count_epsilon)
        )
        sparse_epsilon = self.epsilon - self.warm_epsilon - self.count_epsilon
        self.plan, _ = _plans(sparse_epsilon, delta, updates, sensitivity, value_share)
        self.threshold = float(threshold)
        if isinstance(replays, bool) or not isinstance(replays, int) or replays < 0:
            raise ParameterError(f"replays must be a non-negative integer, got {replays!r}")
        self.replays = replays
        if update not in ("mw", "project"):
            raise ParameterError(f"update must be 'mw' or 'project', got {update!r}")
        self.update = update
        self._rng = resolve_rng(rng)
        value_epsilon = sparse_epsilon * value_share
        # The comparisons are the plan's comparison half (same ε split and δ/2 as NumericSparse).
        self._sparse = SparseVector(
            threshold=self.threshold,
            epsilon=sparse_epsilon - value_epsilon,
            c=updates,
            delta=delta / 2.0,
            sensitivity=sensitivity,
            rng=self._rng,
        )
        self._tree: HierarchicalHistogram | None = None
        if state is None:
            self._log_weights, self._n_hat = self._start()
            self._measurements: list[tuple[np.ndarray, float]] = []
            self._distribution = self._normalised()
        else:
            self.load_state(state)

    # --- public analysis ------------------------------------------------------------------------
    @property
    def cost(self) -> tuple[float, float]:
        """``(ε, δ)`` of the whole stream, however many queries are asked."""
        return (self.warm_epsilon + self.count_epsilon + self.plan.epsilon, self.plan.delta)

    @property
    def halted(self) -> bool:
        """True once ``c`` updates were spent."""
        return self._sparse.halted

    @property
    def updates_left(self) -> int:
        return self.plan.c - self._sparse.positives

    @property
    def queries_seen(self) -> int:
        return self._sparse.queries_seen

    @property
    def n_hat(self) -> int:
        """The released noisy row count."""
        return self._n_hat

    @property
    def synthetic(self) -> np.ndarray:
        """The synthetic histogram ``n̂·p̂`` (released: post-processing)."""
        return self._n_hat * self._distribution

    def count_alpha(self, beta: float) -> float:
        """``|n̂ − n|`` bound at failure probability ``beta``."""
        if self.count_scale is None:
            cells = self._histogram.size
            shape = release_hierarchical(
                np.zeros(cells, dtype=np.int64),
                epsilon=self.warm_epsilon,
                sensitivity=self.sensitivity,
                rng=np.random.Generator(np.random.PCG64(0)),  # only the tree's shape is used
            )
            return shape.half_width(0, cells, 1.0 - beta)
        return float(interval_half_width(self.count_scale, 1.0 - beta))

    def alpha(self, queries: int, beta: float = 0.05) -> float:
        """Every answer of ``queries`` queries is within this many rows, w.p. ``>= 1 − β``."""
        value = self.plan.value_alpha(beta) or 0.0
        return max(self.threshold + self._comparison_alpha(queries, beta), value)

    def _comparison_alpha(self, queries: int, beta: float) -> float:
        return self._sparse.plan.comparison_alpha(queries, beta / 2.0)

    def updates_bound(self, queries: int, beta: float = 0.05) -> float:
        """Most updates that can occur on the accuracy event (``inf`` if the gap is too small)."""
        n_hat = max(self._n_hat, 1)
        gap = (self.threshold - self._comparison_alpha(queries, beta)) / n_hat
        error = ((self.plan.value_alpha(beta) or 0.0) + self.count_alpha(beta)) / n_hat
        if gap <= error:
            return math.inf
        return math.ceil(4.0 * math.log(self._histogram.size) / (gap * gap - error * error))

    def load_state(self, state: PMWState) -> None:
        """Continue from a stored state (e.g. written by another process): same p̂, n̂,
        measurements, SVT epoch and noisy threshold; this object's noise streams carry on."""
        if state.log_weights.shape != self._histogram.shape:
            raise ParameterError("stream state does not match the domain size")
        self._n_hat = int(state.n_hat)
        self._log_weights = state.log_weights.copy()
        self._measurements = list(state.measurements)
        self._sparse.restore(state.sparse)
        self._distribution = self._normalised()
        self._tree = HierarchicalHistogram.from_bytes(state.tree) if state.tree else None

    def state(self) -> PMWState:
        """The state to persist after each query (secret: see module docstring)."""
        return PMWState(
            self._log_weights.copy(),
            self._n_hat,
            self._sparse.snapshot(),
            tuple(self._measurements),
            b"" if self._tree is None else self._tree.to_bytes(),
        )

    @property
    def warm_tree(self) -> HierarchicalHistogram | None:
        """The warm start's released tree (None without one): post-processing of it, like its
        intervals, holds for every query, whatever the updates."""
        return self._tree

    # --- answering --------------------------------------------------------------------------------
    def _warm_start(self) -> tuple[np.ndarray, float]:
        """The starting distribution and row count bought with ``warm_epsilon``: a released
        noisy tree over the domain, made non-negative (post-processing)."""
        tree = release_hierarchical(
            self._histogram, epsilon=self.warm_epsilon, sensitivity=self.sensitivity, rng=self._rng
        )
        self._tree = tree
        cells = self._histogram.size
        consistent = tree.consistent()
        cut = math.sqrt(2.0) * float(tree.scale)  # one standard deviation of a node's noise
        prior = warm_prior(consistent, tree.branching, cells, cut)
        return prior, float(consistent[:cells].sum())

    def _start(self) -> tuple[np.ndarray, int]:
        """The first log-weights of ``p̂`` and ``n̂``: uniform and a noisy count, or a warm start."""
        cells = self._histogram.size
        if self.count_scale is not None:
            noise = int(sample_discrete_laplace(self.count_scale, 1, self._rng)[0])
            total = min(int(self._histogram.sum()), _EXACT_FLOAT_LIMIT) + noise
            return np.zeros(cells), max(-_EXACT_FLOAT_LIMIT, min(_EXACT_FLOAT_LIMIT, total))
        prior, total = self._warm_start()
        # Every cell keeps some weight (a multiplicative step can only move existing mass).
        weights = np.log(np.maximum(prior, 1e-6 / cells))
        return weights, max(-_EXACT_FLOAT_LIMIT, min(_EXACT_FLOAT_LIMIT, round(total)))

    def _normalised(self) -> np.ndarray:
        shifted = np.exp(self._log_weights - self._log_weights.max())
        return shifted / shifted.sum()

    def _mask(self, query: object) -> np.ndarray:
        mask = np.asarray(query)
        if mask.dtype != np.bool_ or mask.shape != self._histogram.shape:
            raise ParameterError(
                f"a query is a boolean mask over the {self._histogram.size} domain cells, got "
                f"dtype {mask.dtype} and shape {mask.shape}"
            )
        return mask

    def synthetic_answer(self, query: object) -> float:
        """``n̂·⟨f, p̂⟩``: the answer the synthetic distribution gives (reads no data)."""
        return self._n_hat * float(self._distribution[self._mask(query)].sum())

    def ask(self, query: object) -> PMWAnswer:
        """Answer one count query (a boolean mask over the domain); raises once halted."""
        mask = self._mask(query)
        if self.halted:
            raise StreamExhaustedError(
                f"the stream spent its {self.plan.c} updates; it answers no further queries"
            )
        synthetic = self._n_hat * float(self._distribution[mask].sum())
        true = int(self._histogram[mask].sum())
        if not self._sparse.ask(abs(true - synthetic)):
            return PMWAnswer(synthetic, False, self.updates_left)
        assert self.plan.value_scale is not None
        noise = int(sample_discrete_laplace(self.plan.value_scale, 1, self._rng)[0])
        noisy = max(-_EXACT_FLOAT_LIMIT, min(_EXACT_FLOAT_LIMIT, true + noise))
        self._update(mask, noisy, synthetic)
        return PMWAnswer(float(noisy), True, self.updates_left)

    def _update(self, mask: np.ndarray, measured: float, synthetic: float) -> None:
        """One multiplicative-weights step towards the *measured* (noisy) answer, then
        ``replays`` sweeps over the recent measurements (MWEM's practice; post-processing)."""
        self._step(mask, measured, synthetic)
        self._measurements.append((np.packbits(mask), float(measured)))
        for _sweep in range(self.replays):
            for packed, value in self._measurements[-_REPLAY_WINDOW:]:
                past = np.unpackbits(packed, count=mask.size).astype(bool)
                self._step(past, value, self._n_hat * float(self._distribution[past].sum()))

    def _step(self, mask: np.ndarray, measured: float, synthetic: float) -> None:
        n_hat = max(self._n_hat, 1)
        if self.update == "mw":
            step = max(-1.0, min(1.0, (measured - synthetic) / (2.0 * n_hat)))
            self._log_weights[mask] += step
        else:
            inside = min(max(synthetic / n_hat, _TINY), 1 - _TINY)
            target = min(max(measured / n_hat, _TINY), 1 - _TINY)
            self._log_weights[mask] += math.log(target / inside)
            self._log_weights[~mask] += math.log((1 - target) / (1 - inside))
        self._distribution = self._normalised()
