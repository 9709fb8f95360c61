"""The sparse vector technique: AboveThreshold, Sparse and NumericSparse, batch and interactive.

Sources: G. Kamath, "Lecture 9 — Sparse Vector" (lecture notes after Dwork and Roth, *The
Algorithmic Foundations of Differential Privacy*, 2014, §3.6: Algorithm 1 AboveThreshold, Algorithm
2 Sparse, Theorems 1–4, NumericSparse; "Kamath" below) and the chapter "The Sparse Vector Technique"
of Near and Abuah, *Programming Differential Privacy*; the non-private variants to avoid are from
Lyu, Su and Li, "Understanding the Sparse Vector Technique for Differential Privacy" (VLDB 2017).

Algorithm (Sparse, cut-off ``c``; AboveThreshold is ``c = 1``)
----------------------------------------------------------------
The stream is cut into at most ``c`` epochs; each epoch is one AboveThreshold run with budget
``ε0``: a noisy threshold ``T̂ = T + Lap(σ)``, ``σ = 2Δ/ε0``, drawn **once per epoch**; **fresh**
noise ``ν_i = Lap(2σ)`` for every query; the first ``f_i + ν_i >= T̂`` is reported (⊤) and ends the
epoch; after the ``c``-th ⊤ the mechanism **halts**. Nothing but the ⊤/⊥ pattern leaves
(NumericSparse adds fresh, separately budgeted noise for the values of ⊤ queries). The batch
functions draw every query's noise in one call and all ``c`` epoch thresholds in another (the same
joint distribution as drawing them lazily) and find each epoch's first ⊤ with ``argmax`` over a
mask: the Python loop runs over epochs (at most ``c``), never over queries.

Privacy (what is proven, and how the paper was read)
----------------------------------------------------
* Each epoch is ``ε0``-DP (Theorem 1). Pure Sparse uses ``ε0 = ε/c`` (σ = 2cΔ/ε) and is ε-DP by
  basic composition (Theorem 3, δ = 0).
* With ``delta > 0`` Kamath's Algorithm 2 sets ``σ = Δ·sqrt(32 c ln(1/δ))/ε``, i.e.
  ``ε0 = ε/sqrt(8 c ln(1/δ))``, and invoke advanced composition (Dwork–Roth Thm 3.20), whose
  total is ``sqrt(2c ln(1/δ))·ε0 + c·ε0·(e^ε0 − 1) = ε/2 + c·ε0·(e^ε0 − 1)``. Theorem 3 claims
  (ε, δ) "for any ε", but the second term is ``<= ε/2`` only for moderate ε. :func:`plan`
  therefore evaluates the bound and uses the advanced-composition scale only when it is proven
  (≤ ε) *and* smaller than the pure scale (which needs ``c > 8 ln(1/δ)``); otherwise it uses the
  pure scale and reports δ = 0. :attr:`SparseVectorPlan.delta` is the δ the proof actually uses.
* NumericSparse (Dwork–Roth Alg. 3) splits the budget: ``(1 − value_share)·ε`` (and δ/2) for the
  comparisons, ``value_share·ε`` (and δ/2) for at most ``c`` released values, each with fresh noise
  ``Lap(cΔ/(value_share·ε))`` (basic composition; advanced composition only where proven smaller,
  as above). The default share 1/9 is Dwork–Roth's 8/9 : 1/9 split.
* ``monotone=True`` uses ``ν_i = Lap(σ)`` instead of ``Lap(2σ)`` (the monotonic-query case in
  Lyu–Su–Li). It is proven only when, for every pair of neighbours, all query answers move in the
  same direction (all ``f_i(D) <= f_i(D')`` or all ``>=``): then the two shifts in Theorem 1's
  change of variables have the same sign and ``|v̂ − v| <= Δ``. That holds for counts (and range
  counts) under add/remove-one-unit neighbours, and for the clipped-sum differences
  ``q_b = Σ clip(x, b) − Σ clip(x, b + 1)`` of automatic clipping. It does not hold under
  replace-one neighbours or for differences of counts. The caller asserts it; nothing checks it.

Noise: exact discrete Laplace wherever the sensitivity is an integer
--------------------------------------------------------------------
When ``sensitivity`` is a whole number (the default 1 and every count), all noise is exact discrete
Laplace (``laplace.sample_discrete_laplace``, scales rounded *up* by ``laplace.noise_scale``) and
every comparison is exact integer arithmetic: with integer noise, ``f + ν >= T + η`` holds iff
``floor(f − T) + ν >= η``, and ``floor(f − T)`` is computed exactly (error-free TwoSum for float
answers). ``z = floor(f − T)`` has sensitivity at most Δ for integer Δ (``floor`` is monotone and
commutes with integer shifts), so Theorem 1's proof goes through verbatim with sums over ℤ in
place of integrals: the changes of variables are integer shifts (bijections of ℤ) of size ≤ Δ and
≤ 2Δ, and the discrete Laplace mass function satisfies ``p(x) <= exp(|s|/b)·p(x + s)``, giving the
factor ``e^(ε0/2)·e^(ε0/2)``. No floating-point number ever decides an answer, so there is no
floating-point attack surface. Answers are clipped to ``±2**60`` first (a 1-Lipschitz, monotone
map: sensitivity and monotonicity are kept) so int64 cannot overflow.

For a non-integer ``sensitivity`` the comparisons use NumPy's continuous Laplace. Only one bit per
query leaves, so Mironov's attack on released low-order bits does not apply, but the float sampler's
output is not exactly Laplace (e.g. it never exceeds about 37 scales), so the guarantee there is
the textbook one up to that sampler error. NumericSparse *requires* an integer sensitivity and
integer-typed answers: released values are ``answer + discrete Laplace``, exact integers clipped to
``±2**53`` (post-processing).

Accuracy (Theorems 2 and 4)
---------------------------
With query-noise scale ``b`` and ``k`` queries seen, the union bound over all ``k`` query noises and
``c`` thresholds gives ``α = 2b·(ln k + ln(2c/β) + ln κ)``: for ``b = 4cΔ/ε`` this is Theorem 4's
``8cΔ(ln k + ln(2c/β))/ε`` (Theorem 2 at ``c = 1``), for ``b = 2Δ·sqrt(32c ln(1/δ))/ε`` its
``sqrt(512 c ln(1/δ))·Δ(ln k + ln(2c/β))/ε``, and for monotone noise the same proof with ``b = σ``.
``κ = 2/(1 + e^(−1/σ))`` (≤ 2) corrects for the discrete Laplace tail ``P(|X| > x) <= κ e^(−x/b)``
(``κ = 1`` for continuous noise). NumericSparse spends β/2 on each part: the values are within
``b_value·(ln(2c/β) + ln κ_value)`` and :meth:`SparseVectorPlan.alpha` reports the larger bound.

>>> sparse([3, 900, 5, 1000, 7], threshold=500, epsilon=1.0, c=2)
[1, 3]
>>> plan(epsilon=1.0, c=4).threshold_scale, plan(epsilon=1.0, c=4).query_scale
(Fraction(8, 1), Fraction(16, 1))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from numbers import Real

import numpy as np

from dpsql.errors import ParameterError, PrivacyError
from dpsql.mechanisms.laplace import noise_scale, sample_discrete_laplace
from dpsql.mechanisms.random import resolve_rng

__all__ = [
    "SparseResult",
    "SparseVector",
    "SparseVectorHaltedError",
    "SparseVectorPlan",
    "above_threshold",
    "above_threshold_release",
    "numeric_sparse",
    "numeric_sparse_release",
    "plan",
    "sparse",
    "sparse_release",
]

_ANSWER_CLIP = 2**60
"""Answers are clipped to ``±2**60`` before comparing (keeps sensitivity; no int64 overflow)."""

_EXACT_FLOAT_LIMIT = 2**53
"""Released values are clipped to ``±2**53`` so that every one is an exact double."""

_MAX_THRESHOLD = 2.0**52
"""Largest ``|threshold|`` accepted."""

_SAFETY = 1.0 + 1e-12
"""Relative margin that makes float evaluations of bounds err on the safe side."""


class SparseVectorHaltedError(PrivacyError):
    """The sparse vector has answered ``c`` queries with ⊤ and refuses any further query."""


# --- validation ---------------------------------------------------------------------------------


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real | np.integer | np.floating):
        raise ParameterError(f"{name} must be a finite real number, got {value!r}")
    as_float = float(value)
    if not math.isfinite(as_float):
        raise ParameterError(f"{name} must be a finite real number, got {value!r}")
    return as_float


def _positive(name: str, value: object) -> float:
    as_float = _real(name, value)
    if as_float <= 0.0:
        raise ParameterError(f"{name} must be a finite positive number, got {value!r}")
    return as_float


def _open_unit(name: str, value: object) -> float:
    as_float = _real(name, value)
    if not 0.0 < as_float < 1.0:
        raise ParameterError(f"{name} must be strictly between 0 and 1, got {value!r}")
    return as_float


MAX_CUTOFF = 1_000_000
"""The largest cut-off ``c`` (``max_answers``) accepted: the noise scale grows with ``c``
(σ = 2cΔ/ε), so a larger one answers nothing useful, and its bookkeeping would not be bounded."""


def _cutoff(c: object) -> int:
    if isinstance(c, bool) or not isinstance(c, int | np.integer) or c < 1:
        raise ParameterError(f"c must be a positive integer, got {c!r}")
    if c > MAX_CUTOFF:
        raise ParameterError(
            f"c (max_answers) must be at most {MAX_CUTOFF:,}, got {c!r}: with σ = 2cΔ/ε, so many "
            "answers would be noise"
        )
    return int(c)


def _threshold(threshold: object) -> float:
    value = _real("threshold", threshold)
    if abs(value) > _MAX_THRESHOLD:
        raise ParameterError(f"threshold must satisfy |threshold| <= 2**52, got {threshold!r}")
    return value


# --- analysis: scales, cost and accuracy from the parameters alone ------------------------------


def _advanced_step(total_epsilon: float, steps: int, delta: float) -> float | None:
    """Kamath's per-step ε (Alg. 2) for ``steps``-fold advanced composition, if the bound proves it.

    Returns ``total/sqrt(8·steps·ln(1/δ))`` when Dwork–Roth Thm 3.20 (``sqrt(2k ln(1/δ))·ε0 +
    k·ε0·(e^ε0 − 1)``) evaluates to at most ``total_epsilon`` (with a safety margin), else None.
    """
    log_term = math.log(1.0 / delta)
    step = total_epsilon / math.sqrt(8.0 * steps * log_term)
    composed = math.sqrt(2.0 * steps * log_term) * step + steps * step * math.expm1(step)
    return step if composed * _SAFETY <= total_epsilon else None


def _tail_factor(scale: Fraction, discrete: bool) -> float:
    """``κ`` with ``P(|X| > x) <= κ·exp(−x/scale)``: ``2/(1 + e^(−1/scale))`` for discrete noise."""
    return 2.0 / (1.0 + math.exp(-1.0 / float(scale))) if discrete else 1.0


@dataclass(frozen=True)
class SparseVectorPlan:
    """Noise scales, proven cost and accuracy of one SVT configuration, computed before any data.

    ``epsilon``/``delta`` are the (ε, δ) the proof establishes (``delta`` is 0 when the pure
    scale was used). Scales are in answer units; ``discrete`` says whether the noise is exact
    discrete Laplace (integer sensitivity) or NumPy's continuous Laplace (comparisons only).
    ``composition`` is ``"basic"`` or ``"advanced"`` for the ``c`` comparison epochs.
    """

    epsilon: float
    delta: float
    c: int
    sensitivity: float
    discrete: bool
    monotone: bool
    numeric: bool
    threshold_scale: Fraction
    query_scale: Fraction
    value_scale: Fraction | None
    composition: str

    def comparison_alpha(self, queries: int, beta: float) -> float:
        """Theorem 2/4 α for the ⊤/⊥ answers after ``queries`` queries, at failure probability β."""
        beta = _open_unit("beta", beta)
        if self.numeric:
            beta /= 2.0
        k = max(int(queries), 1)
        kappa = _tail_factor(self.threshold_scale, self.discrete)
        log_term = math.log(k) + math.log(2.0 * self.c / beta) + math.log(kappa)
        return 2.0 * float(self.query_scale) * log_term * _SAFETY

    def value_alpha(self, beta: float) -> float | None:
        """Bound on ``|released value − answer|`` over all values (NumericSparse), else None."""
        if self.value_scale is None:
            return None
        half_beta = _open_unit("beta", beta) / 2.0
        kappa = _tail_factor(self.value_scale, True)
        return float(self.value_scale) * math.log(2.0 * self.c * kappa / half_beta) * _SAFETY

    def alpha(self, queries: int, beta: float) -> float:
        """The (α, β)-accuracy bound for ``queries`` queries (NumericSparse: the larger of both)."""
        comparison = self.comparison_alpha(queries, beta)
        value = self.value_alpha(beta)
        return comparison if value is None else max(comparison, value)


def _is_integral(value: float) -> bool:
    return float(value).is_integer()


def plan(
    *,
    epsilon: float,
    c: int,
    delta: float = 0.0,
    sensitivity: float = 1.0,
    numeric: bool = False,
    monotone: bool = False,
    value_share: float = 1 / 9,
) -> SparseVectorPlan:
    """Scales and proven (ε, δ) of Sparse / NumericSparse (module docstring), without data.

    >>> p = plan(epsilon=1.0, c=1)
    >>> (p.threshold_scale, p.query_scale, p.delta, p.discrete)
    (Fraction(2, 1), Fraction(4, 1), 0.0, True)
    >>> plan(epsilon=1.0, c=1, monotone=True).query_scale
    Fraction(2, 1)
    >>> p = plan(epsilon=1.0, c=1000, delta=1e-6)
    >>> p.composition, p.delta, float(p.threshold_scale) < 2000
    ('advanced', 1e-06, True)
    """
    epsilon_value = _positive("epsilon", epsilon)
    c = _cutoff(c)
    delta_value = _real("delta", delta)
    if not 0.0 <= delta_value < 1.0:
        raise ParameterError(f"delta must be in [0, 1), got {delta!r}")
    sensitivity_value = _positive("sensitivity", sensitivity)
    discrete = _is_integral(sensitivity_value)
    if numeric:
        share = Fraction(_open_unit("value_share", value_share))
        if not discrete:
            raise ParameterError(
                "numeric release needs an integer sensitivity (integer answers get exact integer "
                f"noise), got sensitivity={sensitivity!r}"
            )
    else:
        share = Fraction(0)
    total = Fraction(epsilon_value)
    value_epsilon = total * share
    comparison_epsilon = total - value_epsilon
    part_delta = delta_value / 2.0 if numeric else delta_value
    delta_used = 0.0

    threshold_scale = noise_scale(2 * c * sensitivity_value, comparison_epsilon)
    composition = "basic"
    if part_delta > 0.0:
        step = _advanced_step(float(comparison_epsilon), c, part_delta)
        if step is not None and step > float(comparison_epsilon) / c:
            threshold_scale = noise_scale(2.0 * sensitivity_value * _SAFETY / step, 1)
            composition = "advanced"
            delta_used += part_delta
    query_scale = threshold_scale if monotone else noise_scale(2 * threshold_scale, 1)

    value_scale = None
    if numeric:
        value_scale = noise_scale(c * sensitivity_value, value_epsilon)
        if part_delta > 0.0:
            step = _advanced_step(float(value_epsilon), c, part_delta)
            if step is not None and step > float(value_epsilon) / c:
                value_scale = noise_scale(sensitivity_value * _SAFETY / step, 1)
                delta_used += part_delta
    return SparseVectorPlan(
        epsilon=epsilon_value,
        delta=delta_used,
        c=c,
        sensitivity=sensitivity_value,
        discrete=discrete,
        monotone=bool(monotone),
        numeric=bool(numeric),
        threshold_scale=threshold_scale,
        query_scale=query_scale,
        value_scale=value_scale,
        composition=composition,
    )


# --- the mechanism ------------------------------------------------------------------------------


def _noise(
    scale: Fraction, shape: tuple[int, ...], discrete: bool, rng: np.random.Generator
) -> np.ndarray:
    if discrete:
        return sample_discrete_laplace(scale, shape, rng)
    return rng.laplace(0.0, float(scale), shape)


def _answer_array(answers: object, numeric: bool) -> np.ndarray:
    """``answers`` as a 1-D int64 or float64 array (ParameterError on other types or non-finite)."""
    array = np.asarray(answers)
    if array.ndim != 1:
        raise ParameterError(f"answers must be one-dimensional, got shape {array.shape}")
    kind = array.dtype.kind
    if kind in "biu":
        if kind == "u":
            array = np.minimum(array, _ANSWER_CLIP)
        return np.clip(array.astype(np.int64), -_ANSWER_CLIP, _ANSWER_CLIP)
    if numeric:
        raise ParameterError(
            f"numeric release needs integer-typed answers (counts), got dtype {array.dtype}"
        )
    if kind != "f":
        raise ParameterError(f"answers must be numeric, got dtype {array.dtype}")
    array = array.astype(np.float64)
    if not np.all(np.isfinite(array)):
        raise ParameterError("answers must be finite (no NaN or infinity)")
    return np.clip(array, -float(_ANSWER_CLIP), float(_ANSWER_CLIP))


def _floor_difference(answers: np.ndarray, threshold: float) -> np.ndarray:
    """Exact ``floor(answers − threshold)`` as int64 (clipped answers, ``|threshold| <= 2**52``).

    Integers: ``a − ceil(T)``. Floats: TwoSum gives ``s + e = a − T`` exactly; ``floor(a − T)`` is
    ``floor(s)`` when ``s`` is not an integer (the true difference cannot cross an integer that is
    itself a double nearer than ``s``) and ``s + floor(e)`` when it is.
    """
    if answers.dtype.kind == "i":
        return answers - math.ceil(Fraction(threshold))
    negated = -threshold
    total = answers + negated
    virtual = total - answers
    error = (answers - (total - virtual)) + (negated - virtual)
    floored = np.floor(total)
    integral = floored == total
    return floored.astype(np.int64) + np.where(integral, np.floor(error), 0.0).astype(np.int64)


def _comparison_values(answers: np.ndarray, threshold: float, discrete: bool) -> np.ndarray:
    """What the noise is added to: ``floor(f − T)`` (exact, int64) or ``f − T`` (float)."""
    if discrete:
        return _floor_difference(answers, threshold)
    return answers.astype(np.float64) - threshold


def _first_crossings(noisy: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """Indices of the ⊤ answers of ``R`` independent runs: ``(R, k)`` noisy values, ``(R, c)`` T̂.

    Epoch ``j`` of run ``r`` reports the first column at or after the previous ⊤ whose noisy value
    reaches ``thresholds[r, j]``; runs that reach the end of the stream stop (their start moves
    past the end; finished rows are dropped once they are the majority). ``-1`` fills unused
    slots. One vectorized pass per epoch.
    """
    runs, k = noisy.shape
    epochs = thresholds.shape[1]
    indices = np.full((runs, epochs), -1, dtype=np.int64)
    if k == 0:
        return indices
    rows = np.arange(runs)
    active = noisy
    start = np.zeros(runs, dtype=np.int64)
    for epoch in range(epochs):
        offset = int(start.min())
        hits = active[:, offset:] >= thresholds[rows, epoch, None]
        if int(start.max()) > offset:
            hits &= np.arange(offset, k) >= start[:, None]
        first = hits.argmax(axis=1)
        found = hits[np.arange(rows.size), first]
        first += offset
        indices[rows[found], epoch] = first[found]
        start = np.where(found, first + 1, k)
        keep = start < k
        if 2 * int(np.count_nonzero(keep)) <= rows.size:
            rows, active, start = rows[keep], active[keep], start[keep]
            if rows.size == 0:
                break
    return indices


@dataclass(frozen=True, eq=False)
class _Noise:
    """All noise of ``runs`` independent runs: ``(runs, k)`` query noise, ``(runs, c)`` epoch
    thresholds (``T̂ − T``), ``(runs, c)`` value noise (NumericSparse, else None)."""

    queries: np.ndarray
    thresholds: np.ndarray
    values: np.ndarray | None


def _draw_noise(
    svt_plan: SparseVectorPlan, runs: int, queries: int, rng: np.random.Generator
) -> _Noise:
    """Draw everything a run can use at once, from the plan's scales (one sampler call each).

    A run over ``k`` queries has at most ``min(c, k)`` epochs (each ⊤ ends one and consumes a
    query; Kamath Alg. 2), so only that many epoch thresholds (and NumericSparse values) are
    drawn: the noise a run reads has the same joint distribution as with all ``c`` drawn, and
    memory is O(k), not O(c)."""
    discrete = svt_plan.discrete
    epochs = min(svt_plan.c, queries)
    query_noise = _noise(svt_plan.query_scale, (runs, queries), discrete, rng)
    threshold_noise = _noise(svt_plan.threshold_scale, (runs, epochs), discrete, rng)
    value_noise = None
    if svt_plan.value_scale is not None:
        value_noise = sample_discrete_laplace(svt_plan.value_scale, (runs, epochs), rng)
    return _Noise(queries=query_noise, thresholds=threshold_noise, values=value_noise)


def _prepare(
    answers: object, threshold: float, svt_plan: SparseVectorPlan
) -> tuple[np.ndarray, np.ndarray]:
    """Validated answers and the values the query noise is added to (see _comparison_values)."""
    array = _answer_array(answers, svt_plan.numeric)
    return array, _comparison_values(array, _threshold(threshold), svt_plan.discrete)


def _apply_noise(
    answers: np.ndarray, base: np.ndarray, noise: _Noise
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(indices, values)`` of every run: ⊤ indices per epoch (``-1`` unused) and, for
    NumericSparse, ``clip(answer + value noise)`` aligned with them (0 where unused)."""
    indices = _first_crossings(base + noise.queries, noise.thresholds)
    if noise.values is None:
        return indices, None
    exact = np.clip(answers, -_EXACT_FLOAT_LIMIT, _EXACT_FLOAT_LIMIT)
    chosen = exact[np.maximum(indices, 0)] if answers.size else np.zeros_like(indices)
    noisy = np.clip(chosen + noise.values, -_EXACT_FLOAT_LIMIT, _EXACT_FLOAT_LIMIT)
    return indices, np.where(indices >= 0, noisy, 0)


@dataclass(frozen=True)
class SparseResult:
    """One SVT release: the ⊤ indices (and values), what it cost and how accurate it is.

    ``values`` (NumericSparse only) are integer-noised answers aligned with ``indices``.
    ``alpha`` is the Theorem 2/4 bound at failure probability ``beta`` for ``queries_scanned``
    queries; ``halted`` says the cut-off ``c`` was reached (later queries were not examined).
    """

    indices: tuple[int, ...]
    values: tuple[int, ...] | None
    epsilon: float
    delta: float
    alpha: float
    beta: float
    queries_scanned: int
    halted: bool
    plan: SparseVectorPlan


def _release(
    answers: object,
    threshold: float,
    svt_plan: SparseVectorPlan,
    beta: float,
    rng: np.random.Generator | None,
) -> SparseResult:
    beta = _open_unit("beta", beta)
    array, base = _prepare(answers, threshold, svt_plan)
    noise = _draw_noise(svt_plan, 1, array.size, resolve_rng(rng))
    indices, values = _apply_noise(array, base, noise)
    found = indices[0][indices[0] >= 0]
    halted = found.size == svt_plan.c
    scanned = int(found[-1]) + 1 if halted else int(array.size)
    released = None if values is None else tuple(int(v) for v in values[0][: found.size])
    return SparseResult(
        indices=tuple(int(i) for i in found),
        values=released,
        epsilon=svt_plan.epsilon,
        delta=svt_plan.delta,
        alpha=svt_plan.alpha(scanned, beta),
        beta=beta,
        queries_scanned=scanned,
        halted=halted,
        plan=svt_plan,
    )


def sparse_release(
    answers: object,
    *,
    threshold: float,
    epsilon: float,
    c: int,
    delta: float = 0.0,
    sensitivity: float = 1.0,
    monotone: bool = False,
    beta: float = 0.05,
    rng: np.random.Generator | None = None,
) -> SparseResult:
    """Sparse (Kamath Alg. 2, Thm 3): indices of the first ≤ c answers above ``threshold``.

    ``answers[i]`` is ``f_i(D)`` for sensitivity-``sensitivity`` queries chosen without looking at
    earlier outputs (use :class:`SparseVector` for adaptive streams). Cost ``(plan.epsilon,
    plan.delta)``, independent of ``len(answers)``.

    >>> r = sparse_release([0, 2000, 0], threshold=1000, epsilon=1.0, c=3)
    >>> r.indices, r.halted, r.queries_scanned, r.epsilon, r.delta
    ((1,), False, 3, 1.0, 0.0)
    """
    svt_plan = plan(epsilon=epsilon, c=c, delta=delta, sensitivity=sensitivity, monotone=monotone)
    return _release(answers, threshold, svt_plan, beta, rng)


def numeric_sparse_release(
    answers: object,
    *,
    threshold: float,
    epsilon: float,
    c: int,
    delta: float = 0.0,
    sensitivity: int = 1,
    value_share: float = 1 / 9,
    monotone: bool = False,
    beta: float = 0.05,
    rng: np.random.Generator | None = None,
) -> SparseResult:
    """NumericSparse (Kamath, "Sparse Vector"; Dwork–Roth Alg. 3): Sparse plus a fresh noisy value.

    Integer-typed ``answers`` and an integer ``sensitivity`` are required; each ⊤ answer is
    released as ``answer + discrete Laplace(c·Δ/(value_share·ε))`` (an exact integer).

    >>> r = numeric_sparse_release([0, 50_000], threshold=10_000, epsilon=1.0, c=1)
    >>> r.indices, round(float(r.plan.value_scale), 6)  # c·Δ/(ε/9)
    ((1,), 9.0)
    >>> abs(r.values[0] - 50_000) < 20 * r.plan.value_scale
    True
    """
    svt_plan = plan(
        epsilon=epsilon,
        c=c,
        delta=delta,
        sensitivity=sensitivity,
        numeric=True,
        monotone=monotone,
        value_share=value_share,
    )
    return _release(answers, threshold, svt_plan, beta, rng)


def above_threshold_release(
    answers: object,
    *,
    threshold: float,
    epsilon: float,
    sensitivity: float = 1.0,
    monotone: bool = False,
    beta: float = 0.05,
    rng: np.random.Generator | None = None,
) -> SparseResult:
    """AboveThreshold (Kamath Alg. 1, Thm 1 and 2): Sparse with ``c = 1``; ε-DP."""
    return sparse_release(
        answers,
        threshold=threshold,
        epsilon=epsilon,
        c=1,
        sensitivity=sensitivity,
        monotone=monotone,
        beta=beta,
        rng=rng,
    )


def above_threshold(
    answers: object,
    *,
    threshold: float,
    epsilon: float,
    sensitivity: float = 1.0,
    monotone: bool = False,
    rng: np.random.Generator | None = None,
) -> int | None:
    """Index of the first answer reported above ``threshold`` (AboveThreshold), or None; ε-DP.

    >>> above_threshold([1, 2, 5_000, 3], threshold=1_000, epsilon=1.0)
    2
    """
    result = above_threshold_release(
        answers,
        threshold=threshold,
        epsilon=epsilon,
        sensitivity=sensitivity,
        monotone=monotone,
        rng=rng,
    )
    return result.indices[0] if result.indices else None


def sparse(
    answers: object,
    *,
    threshold: float,
    epsilon: float,
    c: int,
    delta: float = 0.0,
    sensitivity: float = 1.0,
    monotone: bool = False,
    rng: np.random.Generator | None = None,
) -> list[int]:
    """Indices of the first ≤ c answers reported above ``threshold`` (Sparse); (ε, δ)-DP."""
    result = sparse_release(
        answers,
        threshold=threshold,
        epsilon=epsilon,
        c=c,
        delta=delta,
        sensitivity=sensitivity,
        monotone=monotone,
        rng=rng,
    )
    return list(result.indices)


def numeric_sparse(
    answers: object,
    *,
    threshold: float,
    epsilon: float,
    c: int,
    delta: float = 0.0,
    sensitivity: int = 1,
    value_share: float = 1 / 9,
    monotone: bool = False,
    rng: np.random.Generator | None = None,
) -> list[tuple[int, int]]:
    """``(index, noisy value)`` of the first ≤ c answers above ``threshold`` (NumericSparse).

    Values are exact integers (integer answers plus discrete Laplace), usable wherever a float is.
    """
    result = numeric_sparse_release(
        answers,
        threshold=threshold,
        epsilon=epsilon,
        c=c,
        delta=delta,
        sensitivity=sensitivity,
        value_share=value_share,
        monotone=monotone,
        rng=rng,
    )
    return list(zip(result.indices, result.values or (), strict=True))


# --- interactive form ---------------------------------------------------------------------------


class _NoiseStream:
    """Independent draws at one scale, fetched from the sampler in growing blocks.

    The draws are i.i.d. and independent of the data, so drawing them ahead of use gives the same
    joint distribution as drawing each when needed, at a fraction of the per-call overhead.
    """

    _MAX_BLOCK = 4096

    def __init__(self, scale: Fraction, discrete: bool, rng: np.random.Generator) -> None:
        self._scale = scale
        self._discrete = discrete
        self._rng = rng
        self._block = np.empty(0)
        self._next = 0
        self._size = 8

    def draw(self) -> int | float:
        if self._next == self._block.size:
            self._block = _noise(self._scale, (self._size,), self._discrete, self._rng)
            self._next = 0
            self._size = min(2 * self._size, self._MAX_BLOCK)
        value = self._block[self._next]
        self._next += 1
        return int(value) if self._discrete else float(value)


class SparseVector:
    """Interactive Sparse / NumericSparse: queries arrive one at a time, each may depend on earlier
    answers (the adaptive setting of Kamath Alg. 1 and 2); refuses every query once halted.

    ``ask(answer)`` takes ``f_i(D)`` and returns ⊤/⊥ as a bool, or ``(bool, value)`` when
    ``numeric`` (value None for ⊥; an int, the answer plus fresh discrete Laplace noise, for ⊤).
    The whole object costs :attr:`cost` however many queries are asked.

    >>> sv = SparseVector(threshold=100, epsilon=1.0, c=1)
    >>> sv.ask(0), sv.ask(10_000), sv.halted, sv.queries_seen
    (False, True, True, 2)
    >>> sv.ask(5)  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    SparseVectorHaltedError: halted
    """

    def __init__(
        self,
        *,
        threshold: float,
        epsilon: float,
        c: int,
        delta: float = 0.0,
        sensitivity: float = 1.0,
        numeric: bool = False,
        monotone: bool = False,
        value_share: float = 1 / 9,
        rng: np.random.Generator | None = None,
    ) -> None:
        self.plan = plan(
            epsilon=epsilon,
            c=c,
            delta=delta,
            sensitivity=sensitivity,
            numeric=numeric,
            monotone=monotone,
            value_share=value_share,
        )
        self._threshold = _threshold(threshold)
        generator = resolve_rng(rng)
        discrete = self.plan.discrete
        self._query_noise = _NoiseStream(self.plan.query_scale, discrete, generator)
        self._threshold_noise = _NoiseStream(self.plan.threshold_scale, discrete, generator)
        self._value_noise = (
            None
            if self.plan.value_scale is None
            else _NoiseStream(self.plan.value_scale, True, generator)
        )
        self._positives = 0
        self._queries_seen = 0
        self._noisy_threshold = self._threshold_noise.draw()

    @property
    def halted(self) -> bool:
        """True once ``c`` queries were answered ⊤; every later :meth:`ask` raises."""
        return self._positives >= self.plan.c

    @property
    def positives(self) -> int:
        """How many queries were answered ⊤ so far."""
        return self._positives

    @property
    def queries_seen(self) -> int:
        """How many queries were answered so far."""
        return self._queries_seen

    @property
    def cost(self) -> tuple[float, float]:
        """``(ε, δ)`` of the whole interaction, (independent of the query count)."""
        return (self.plan.epsilon, self.plan.delta)

    def accuracy(self, beta: float = 0.05) -> float:
        """Theorem 2/4 α for the queries seen so far, at failure probability ``beta``."""
        return self.plan.alpha(self._queries_seen, beta)

    def snapshot(self) -> tuple[int | float, int, int]:
        """The secret state ``(noisy threshold, positives, queries seen)``, to persist a stream
        between processes; it must be kept as secret as the data (the noisy threshold is not
        released). Noise drawn ahead but unused is discarded, which changes no distribution."""
        return (self._noisy_threshold, self._positives, self._queries_seen)

    def restore(self, state: tuple[int | float, int, int]) -> None:
        """Continue from :meth:`snapshot`'s state: the same epoch, the same noisy threshold."""
        noisy_threshold, positives, queries_seen = state
        self._noisy_threshold = int(noisy_threshold) if self.plan.discrete else noisy_threshold
        self._positives = int(positives)
        self._queries_seen = int(queries_seen)

    def _comparison_value(self, answer: object) -> int | float:
        if isinstance(answer, bool) or not isinstance(answer, Real | np.integer | np.floating):
            raise ParameterError(f"answer must be a finite real number, got {answer!r}")
        if self.plan.numeric and not isinstance(answer, int | np.integer):
            raise ParameterError(
                "numeric release needs integer answers (counts), got "
                f"{type(answer).__name__}; pass int(answer) for integral values"
            )
        if not math.isfinite(float(answer)):
            raise ParameterError("answer must be finite (no NaN or infinity)")
        if isinstance(answer, int | np.integer):
            exact = Fraction(max(-_ANSWER_CLIP, min(_ANSWER_CLIP, int(answer))))
        else:
            exact = Fraction(max(-float(_ANSWER_CLIP), min(float(_ANSWER_CLIP), float(answer))))
        if self.plan.discrete:
            return math.floor(exact - Fraction(self._threshold))
        return float(exact) - self._threshold

    def ask(self, answer: float) -> bool | tuple[bool, int | None]:
        """Answer one query (⊤ = True); NumericSparse also returns the noisy value of a ⊤ query."""
        if self.halted:
            raise SparseVectorHaltedError(
                f"the sparse vector halted after c={self.plan.c} above-threshold answers; "
                "it answers no further queries"
            )
        base = self._comparison_value(answer)
        self._queries_seen += 1
        above = base + self._query_noise.draw() >= self._noisy_threshold
        value = None
        if above:
            self._positives += 1
            if self._value_noise is not None:
                clipped = max(-_EXACT_FLOAT_LIMIT, min(_EXACT_FLOAT_LIMIT, int(answer)))
                noisy = clipped + int(self._value_noise.draw())
                value = max(-_EXACT_FLOAT_LIMIT, min(_EXACT_FLOAT_LIMIT, noisy))
            if not self.halted:
                self._noisy_threshold = self._threshold_noise.draw()
        if self.plan.numeric:
            return (bool(above), value)
        return bool(above)
