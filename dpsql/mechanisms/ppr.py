"""Poisson private representation (PPR): exact, private compression of one draw from ``P``.

PPR (Liu, Chen, Özgür, Li, "Universal Exact Compression of Differentially Private Mechanisms",
NeurIPS 2024) is how Hillebrand, Suppakitpaisarn and Shibuya ("Communication-Efficient
Publication of Sparse Vectors under Differential Privacy", Sec. 2.4, Thms 5 and 6) compress each
chunk of a randomized-response vector. The terminating procedures are this module's own; the
argument for each is given below.

**Conceptual definition** (PPR, as restated in the seed paper's Sec. 2.4). Candidates
``Z_1, Z_2, …`` are i.i.d. from a public proposal ``Q`` (shared randomness); ``r = dP/dQ``. The
encoder privately draws a unit-rate Poisson process ``T_1 < T_2 < …`` and i.i.d. ``V_k ~ Exp(1)``
and sends ``K = argmin_k V_k (T_k/r(Z_k))^α`` (:func:`conceptual_index`); the decoder outputs
``Z_K``. Then ``Z_K ~ P`` exactly (PPR Prop. 4.2),
``E[log2 K] <= D(P‖Q) + log2(3.56)/min((α-1)/2, 1)`` (PPR Thm 4.3), and if ``r_x / r_x'`` lies in
``[e^-ε, e^ε]`` for neighbouring inputs the index is ``2αε``-DP, even given all candidates (PPR Thms
4.5/4.7; the seed paper's Thm 5).

**Terminating procedures** (:func:`encode`). The private pairs ``(T, V)`` are generated in
increasing order of ``B = T^α min(V, 1)``, which bounds the ``W = V(T/r)^α`` of every point not yet
generated from below by ``B/r*^α`` (``r* >= sup r``), and fixes the T-rank of every point with
``T <= B^(1/α)`` (because ``min(V, 1) <= 1``, so ``B <= T^α``). ``method="enumerate"`` keeps
generating until every contender is ranked: it returns the conceptual argmin of the realised
process, but for ``α <= 2`` its running time has infinite mean (for ``P = Q``,
``Pr[K >= k] ≈ C k^(1-α)``: any procedure that enumerates up to the winner has this tail, whatever
the seed paper's Thm 4 says for ``α = 2``). ``method="complete"`` (the default) stops as soon as no
ungenerated point can win and draws the T-ranks of the remaining contenders from the exact Poisson
law of the ungenerated points, so ``K`` has the same conditional law given the candidates (exactness
and privacy unchanged) while the work no longer follows the tail of ``K``. Both run many independent
PPR instances at once, in NumPy blocks whose size doubles.

Decoding is evaluating the shared candidate sampler at ``K``; :mod:`.compressed_rr` does that.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from dpsql.errors import ExecutionError, ParameterError
from dpsql.mechanisms.random import resolve_rng

__all__ = ["LogRatio", "PPRIndices", "conceptual_index", "encode"]

LogRatio = Callable[[npt.NDArray[np.int64], npt.NDArray[np.int64]], npt.NDArray[np.float64]]
"""``log_ratio(instances, ranks)``: ``log r(Z_rank)`` of each instance's candidate (ranks >= 1)."""

Method = Literal["complete", "enumerate"]

_LOG_RANK_LIMIT = 60 * math.log(2.0)  # ranks stay below 2**61: int64 and Philox counters are safe
_RATIO_SLACK = 1e-9


@dataclass(frozen=True)
class PPRIndices:
    """The chosen candidate index ``K >= 1`` per instance, and how many points each generated."""

    indices: npt.NDArray[np.int64]
    points: npt.NDArray[np.int64]


@dataclass(frozen=True)
class _Shape:
    """Constants of the B-ordered point process for one ``α`` (see the module docstring)."""

    alpha: float
    a: float  # 1 - 1/α
    log_c: float  # log c_α, c_α = γ(a, 1) + e^-1: points with B <= b have mean c_α b^(1/α)
    tail: float  # Pr[V >= 1 | B] = e^-1 / c_α
    gamma_a: float  # Γ(a)
    h_one: float  # H(1) = e^-1 - Γ(a, 1)


def _lower_gamma(a: float, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The lower incomplete gamma function γ(a, x) for 0 < x <= 1, by its power series."""
    term = np.full(np.shape(x), 1.0 / a)
    total = term.copy()
    for k in range(1, 40):
        term = term * x / (a + k)
        total += term
    return np.exp(a * np.log(x) - x) * total


def _shape(alpha: float) -> _Shape:
    a = 1.0 - 1.0 / alpha
    lower_one = float(_lower_gamma(a, np.ones(1))[0])
    c = lower_one + math.exp(-1.0)
    gamma_a = math.gamma(a)
    return _Shape(
        alpha=alpha,
        a=a,
        log_c=math.log(c),
        tail=math.exp(-1.0) / c,
        gamma_a=gamma_a,
        h_one=math.exp(-1.0) - (gamma_a - lower_one),
    )


def _check_alpha(alpha: float) -> float:
    value = float(alpha)
    if not math.isfinite(value) or value <= 1.0:
        raise ParameterError(f"alpha must be a finite number > 1, got {alpha!r}")
    return value


def conceptual_index(
    log_ratios: npt.ArrayLike, times: npt.ArrayLike, exponentials: npt.ArrayLike, *, alpha: float
) -> int:
    """PPR's selection rule (seed paper Sec. 2.4) on given points: ``1 + argmin V_k (T_k/r_k)^α``.

    ``times`` must be the increasing points of a unit-rate Poisson process and ``exponentials``
    i.i.d. Exp(1); on an infinite sequence this is the PPR index, on a prefix it is the reference
    the terminating procedures are tested against.
    """
    alpha = _check_alpha(alpha)
    log_w = np.log(exponentials) + alpha * (np.log(times) - np.asarray(log_ratios, dtype=float))
    return int(np.argmin(log_w)) + 1


def _sample_log_v(
    rng: np.random.Generator, size: int, shape: _Shape
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``log min(V, 1)`` and ``log max(V, 1)`` for ``V`` with density ∝ e^-v min(v, 1)^(-1/α).

    That is the law of ``V`` given ``B`` (the pairs ``(T, V)`` are a Poisson process of intensity
    ``dt e^-v dv``, and ``B = T^α min(V, 1)``): with probability ``e^-1/c_α`` it is
    ``1 + Exp(1)``, else Gamma(a, 1) truncated to (0, 1], drawn by rejection from the density
    ∝ v^(a-1) (accepting with probability e^-v >= e^-1).
    """
    log_min = np.zeros(size)
    log_max = np.zeros(size)
    in_tail = rng.random(size) < shape.tail
    log_max[in_tail] = np.log1p(rng.standard_exponential(int(in_tail.sum())))
    needed = size - int(in_tail.sum())
    body = np.empty(needed)
    filled = 0
    while filled < needed:
        missing = needed - filled
        draws = int(missing * 1.7) + 16
        log_v = np.log1p(-rng.random(draws)) / shape.a
        accepted = log_v[rng.random(draws) < np.exp(-np.exp(log_v))][:missing]
        body[filled : filled + accepted.size] = accepted
        filled += accepted.size
    log_min[~in_tail] = body
    return log_min, log_max


def _mean_count(
    log_t: npt.NDArray[np.float64], log_f: npt.NDArray[np.float64], shape: _Shape
) -> npt.NDArray[np.float64]:
    """Mean number of ungenerated points with ``F < T <= t`` (the mapping theorem):
    ``μ(t) = ∫_F^t exp(-(F/s)^α) ds = t e^-x - F (Γ(a, x) + H(1))`` with ``x = (F/t)^α``."""
    x = np.exp(shape.alpha * (log_f - log_t))
    upper = shape.gamma_a - _lower_gamma(shape.a, x)
    return np.exp(log_t - x) - np.exp(log_f) * (upper + shape.h_one)


def _grouped_order(
    groups: npt.NDArray[np.int64], values: npt.NDArray[np.float64]
) -> npt.NDArray[np.int64]:
    """The permutation sorting by ``(groups, values)``; two integer sorts beat ``np.lexsort``."""
    size = values.size
    value_rank = np.empty(size, dtype=np.int64)
    value_rank[np.argsort(values)] = np.arange(size)
    return np.argsort(groups * size + value_rank)


def _group_first(groups: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Marks the first element of each run of equal values in a grouped (sorted) array."""
    first = np.ones(groups.size, dtype=bool)
    first[1:] = groups[1:] != groups[:-1]
    return first


def _position_in_group(groups: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """0-based position of each element within its run, for a grouped (sorted) array."""
    index = np.arange(groups.size)
    starts = np.maximum.accumulate(np.where(_group_first(groups), index, 0))
    return index - starts


class _Search:
    """The running state of many PPR instances: best candidate so far and bookkeeping."""

    def __init__(self, log_ratio: LogRatio, bounds: npt.NDArray[np.float64], shape: _Shape):
        size = bounds.size
        self.log_ratio = log_ratio
        self.bounds = bounds
        self.shape = shape
        self.best = np.full(size, np.inf)
        self.best_rank = np.zeros(size, dtype=np.int64)

    def evaluate(
        self,
        instances: npt.NDArray[np.int64],
        ranks: npt.NDArray[np.int64],
        scores: npt.NDArray[np.float64],
    ) -> None:
        """Computes ``log W = score - α log r(Z_rank)`` and keeps each instance's minimum."""
        if instances.size == 0:
            return
        log_r = np.asarray(self.log_ratio(instances, ranks), dtype=float)
        if log_r.shape != instances.shape or np.any(
            ~(log_r <= self.bounds[instances] + _RATIO_SLACK)
        ):
            raise ParameterError("log_ratio returned a value above log_ratio_bounds (or NaN)")
        log_w = scores - self.shape.alpha * log_r
        order = _grouped_order(instances, log_w)
        first = order[_group_first(instances[order])]
        owner = instances[first]
        better = log_w[first] < self.best[owner]
        self.best[owner[better]] = log_w[first][better]
        self.best_rank[owner[better]] = ranks[first][better]


def encode(
    log_ratio: LogRatio,
    log_ratio_bounds: npt.ArrayLike,
    *,
    alpha: float,
    rng: np.random.Generator | None = None,
    method: Method = "complete",
    max_points: int = 1 << 22,
) -> PPRIndices:
    """PPR indices for independent instances ``i = 0, …, len(log_ratio_bounds) - 1``.

    ``log_ratio(instances, ranks)`` returns ``log (dP_i/dQ_i)(Z_{i,rank})`` for the shared
    candidates; ``log_ratio_bounds[i] >= sup log r_i`` (``>= 0``). The private point processes
    come from ``rng`` (None: a fresh CSPRNG). ``method`` selects the procedure (module docstring);
    both return the conceptual PPR index in law. Raises :class:`~dpsql.errors.ExecutionError` if
    an instance needs more than ``max_points`` points, or (probability about ``2**(-60(α-1))``
    per instance, times a factor polynomial in ``r*``) if the winning index would pass ``2**60``.
    """
    alpha = _check_alpha(alpha)
    if method not in ("complete", "enumerate"):
        raise ParameterError(f"method must be 'complete' or 'enumerate', got {method!r}")
    if int(max_points) < 1:
        raise ParameterError(f"max_points must be >= 1, got {max_points!r}")
    bounds = np.atleast_1d(np.asarray(log_ratio_bounds, dtype=float))
    if bounds.ndim != 1 or not np.all(np.isfinite(bounds)) or np.any(bounds < 0):
        raise ParameterError("log_ratio_bounds must be finite numbers >= 0")
    rng = resolve_rng(rng)
    shape = _shape(alpha)
    size = bounds.size
    search = _Search(log_ratio, bounds, shape)
    generated = np.zeros(size, dtype=np.int64)
    total_u = np.zeros(size)
    ranked = np.zeros(size, dtype=np.int64)
    # A small first block (most instances finish in it), then doubling: the points needed grow
    # like r*/r(winner), far below r* for typical targets.
    first_block = np.minimum(3.0 + np.ceil(0.05 * np.exp(shape.log_c + bounds)), max_points + 1.0)
    first_block = first_block.astype(np.int64)
    # Points generated but not yet ranked (T above the frontier), over all active instances.
    pool_instance = np.zeros(0, dtype=np.int64)
    pool_log_t = np.zeros(0)
    pool_score = np.zeros(0)
    active = np.arange(size, dtype=np.int64)
    while active.size:
        want = np.where(generated[active] == 0, first_block[active], generated[active])
        if np.any(generated[active] + want > max_points):
            raise ExecutionError(
                f"PPR needed more than max_points={max_points} points for an instance; "
                "the target is too far from the proposal (use smaller chunks)"
            )
        new_instance = np.repeat(active, want)
        steps = np.cumsum(rng.standard_exponential(new_instance.size))
        ends = np.cumsum(want)
        before = np.concatenate([[0.0], steps[ends[:-1] - 1]])
        u = total_u[new_instance] + steps - np.repeat(before, want)
        total_u[active] = u[ends - 1]
        generated[active] += want
        log_b = shape.alpha * (np.log(u) - shape.log_c)
        log_min, log_max = _sample_log_v(rng, new_instance.size, shape)
        pool_instance = np.concatenate([pool_instance, new_instance])
        pool_log_t = np.concatenate([pool_log_t, (log_b - log_min) / shape.alpha])
        pool_score = np.concatenate([pool_score, log_b + log_max])

        # Rank every point below the frontier F = B_last^(1/α) = U_last / c_α.
        log_f = np.log(total_u) - shape.log_c
        now_ranked = pool_log_t <= log_f[pool_instance]
        order = np.flatnonzero(now_ranked)
        order = order[_grouped_order(pool_instance[order], pool_log_t[order])]
        rank_instance = pool_instance[order]
        ranks = ranked[rank_instance] + _position_in_group(rank_instance) + 1
        np.add.at(ranked, rank_instance, 1)
        rank_score = pool_score[order]
        lower = rank_score - shape.alpha * bounds[rank_instance]
        # Evaluate the most promising point of each instance first, then every point that
        # can still beat the best (most points never need their candidate drawn).
        by_lower = _grouped_order(rank_instance, lower)
        head = by_lower[_group_first(rank_instance[by_lower])]
        head = head[lower[head] < search.best[rank_instance[head]]]
        search.evaluate(rank_instance[head], ranks[head], rank_score[head])
        rest = np.ones(order.size, dtype=bool)
        rest[head] = False
        rest &= lower < search.best[rank_instance]
        search.evaluate(rank_instance[rest], ranks[rest], rank_score[rest])
        keep = ~now_ranked
        pool_instance, pool_log_t, pool_score = (
            pool_instance[keep],
            pool_log_t[keep],
            pool_score[keep],
        )

        # No ungenerated point can win once B_last / r*^α >= best (B <= T^α bounds W below).
        sealed = shape.alpha * (log_f - bounds) >= search.best
        pool_lower = pool_score - shape.alpha * bounds[pool_instance]
        contender = pool_lower < search.best[pool_instance]
        if method == "enumerate":
            waiting = np.zeros(size, dtype=bool)
            waiting[pool_instance[contender]] = True
            done = sealed[active] & ~waiting[active]
        else:
            done = sealed[active]
            finishing = np.zeros(size, dtype=bool)
            finishing[active[done]] = True
            _complete(
                search,
                pool_instance,
                pool_log_t,
                pool_score,
                contender & finishing[pool_instance],
                finishing[pool_instance],
                log_f,
                ranked,
                rng,
            )
        finished = np.zeros(size, dtype=bool)
        finished[active[done]] = True
        keep = ~finished[pool_instance]
        pool_instance, pool_log_t, pool_score = (
            pool_instance[keep],
            pool_log_t[keep],
            pool_score[keep],
        )
        active = active[~done]
    return PPRIndices(indices=search.best_rank.copy(), points=generated)


def _complete(
    search: _Search,
    pool_instance: npt.NDArray[np.int64],
    pool_log_t: npt.NDArray[np.float64],
    pool_score: npt.NDArray[np.float64],
    contender: npt.NDArray[np.bool_],
    finishing: npt.NDArray[np.bool_],
    log_f: npt.NDArray[np.float64],
    ranked: npt.NDArray[np.int64],
    rng: np.random.Generator,
) -> None:
    """Ranks the unranked contenders of finishing instances with Poisson counts.

    The rank of a point at ``t > F`` is ``#ranked + #(generated, unranked, T <= t) + N(t)`` with
    ``N`` the count of ungenerated points in ``(F, t]``: an inhomogeneous Poisson process of mean
    :func:`_mean_count`, independent of everything generated (generation in B order stopped at
    a stopping time).
    """
    shape = search.shape
    order = np.flatnonzero(finishing)
    order = order[_grouped_order(pool_instance[order], pool_log_t[order])]
    instance = pool_instance[order]
    count_below = _position_in_group(instance) + 1
    pick = contender[order]
    order, instance, count_below = order[pick], instance[pick], count_below[pick]
    if order.size == 0:
        return
    log_t = pool_log_t[order]
    overflow = log_t > _LOG_RANK_LIMIT
    fine = ~overflow
    mean = np.zeros(order.size)
    mean[fine] = _mean_count(log_t[fine], log_f[instance[fine]], shape)
    first = _group_first(instance)
    step = np.where(first, mean, mean - np.concatenate([[0.0], mean[:-1]]))
    step = np.where(fine, np.maximum(step, 0.0), 0.0)
    draws = rng.poisson(step)
    running = np.cumsum(draws)
    counts = running - np.maximum.accumulate(np.where(first, running - draws, 0))
    ranks = ranked[instance] + count_below + counts
    search.evaluate(instance[fine], ranks[fine], pool_score[order][fine])
    lower = pool_score[order] - shape.alpha * search.bounds[instance]
    if np.any(overflow & (lower < search.best[instance])):
        raise ExecutionError(
            "PPR index would exceed 2**60, an event of probability about 2**(-60 * (alpha - 1)) "
            "per instance (see docs/compressed_rr.md); use alpha >= 2"
        )
