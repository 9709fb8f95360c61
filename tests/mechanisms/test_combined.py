"""Tests for dpsql.mechanisms.combined: lookups, budget split, serialization, privacy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpsql.errors import ParameterError
from dpsql.mechanisms import alp, combined
from dpsql.mechanisms.hashing import HashFamily, hash_keys
from dpsql.mechanisms.threshold import HashDomain, IntegerDomain

Z = 4.0


def _rng(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


def _zipf_counts(size: int, seed: int) -> np.ndarray:
    return np.minimum(_rng(seed).zipf(1.6, size), 5000)


MODES = {
    "pure-integer": {"delta": 0.0, "domain": IntegerDomain(0, 10**9)},
    "pure-hash": {"delta": 0.0, "domain": HashDomain()},
    "approximate": {"delta": 1e-6},
}


def _keys(mode: str, size: int) -> np.ndarray:
    if mode == "pure-integer":
        return np.arange(size) * 1000 + 7
    return np.array([f"https://site-{i}.example/private-page" for i in range(size)], dtype=object)


@pytest.mark.parametrize("mode", list(MODES))
def test_lookup_is_threshold_value_when_released_else_alp_estimate(mode: str) -> None:
    keys, counts = _keys(mode, 5000), _zipf_counts(5000, 1)
    out = combined.release(keys, counts, epsilon=1.0, seed=5, rng=_rng(2), **MODES[mode])
    assert out.epsilon == 1.0 and out.split == 0.5
    assert out.threshold.epsilon + out.sketch.epsilon == pytest.approx(1.0)
    assert out.delta <= MODES[mode]["delta"]
    assert out.sketch.beta == out.threshold.tau
    answers = out.lookup(keys)
    released = out.released(keys)
    assert 0 < released.sum() < 5000
    from_threshold = dict(
        zip(out.threshold.keys.tolist(), out.threshold.values.tolist(), strict=True)
    )
    if out.threshold.key_kind == "hash":
        wanted = [from_threshold[h] for h in hash_keys(keys[released], 5).tolist()]
    else:
        wanted = [from_threshold[k] for k in keys[released].tolist()]
    assert answers[released].tolist() == wanted
    assert np.array_equal(answers[~released], out.sketch.estimate(keys[~released]))
    error = np.abs(answers - counts)
    assert np.mean(error[released]) < 4 * float(out.threshold.scale)
    assert np.mean(error[~released]) < 2 * 6.4 * 2  # paper's ALP error at ε/2 (6.4 at ε = 1), x2


@pytest.mark.parametrize("mode", list(MODES))
def test_round_trip_and_no_unreleased_keys_in_bytes(mode: str) -> None:
    keys, counts = _keys(mode, 3000), _zipf_counts(3000, 3)
    out = combined.release(keys, counts, epsilon=1.0, rng=_rng(4), **MODES[mode])
    data = out.to_bytes()
    back = combined.CombinedRelease.from_bytes(data)
    queries = _keys(mode, 6000)[::3]
    assert np.array_equal(back.lookup(queries), out.lookup(queries))
    assert back.epsilon == out.epsilon and back.delta == out.delta and back.seed == out.seed
    hidden = keys[~out.released(keys)]
    if mode == "pure-integer":
        assert all(int(k).to_bytes(8, "little") not in data for k in hidden[:200])
    else:
        assert all(k.encode() not in data for k in hidden)
    if mode != "approximate":
        assert b"private-page" not in data
    with pytest.raises(ParameterError):
        combined.CombinedRelease.from_bytes(data[:30])


def test_unknown_keys_get_small_nonnegative_estimates() -> None:
    keys, counts = _keys("approximate", 3000), _zipf_counts(3000, 5)
    out = combined.release(keys, counts, epsilon=1.0, delta=1e-6, rng=_rng(6))
    unknown = np.array([f"never-seen-{i}" for i in range(2000)], dtype=object)
    answers = out.lookup(unknown)
    assert not out.released(unknown).any()
    assert np.all(answers >= 0) and np.mean(answers) < 10


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"split": 1.0}, "split"),
        ({"split": 0.0}, "split"),
        ({"epsilon": 0.0}, "epsilon"),
        ({"delta": 0.0}, "domain"),
        ({"delta": 1e-6, "domain": HashDomain()}, "domain"),
        ({"counts": [1, 2, 3]}, "counts"),
    ],
)
def test_invalid_arguments_raise_parameter_error(changes: dict, message: str) -> None:
    arguments = {"keys": ["a", "b"], "counts": [1, 2], "epsilon": 1.0, "delta": 1e-6}
    arguments.update(changes)
    with pytest.raises(ParameterError, match=message):
        combined.release(arguments.pop("keys"), arguments.pop("counts"), rng=_rng(0), **arguments)


# --- privacy: the parts' empirical losses must add up to at most ε ---------------------------

ABSENT = np.iinfo(np.int64).min
T_COPIES, A_COPIES, RUNS, S = 8_000, 20_000, 5, 2**20


def _observe(count_t: int, count_a: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Threshold outcomes of T copies (count_t) and ALP bits at the A copies' own cells (count_a).

    Neighbours differ in one key by one row; copies give independent samples of one key's output
    (the sketch's cells of distinct copies are disjoint: cells shared by two keys are skipped).
    """
    t_keys = np.arange(T_COPIES)
    a_keys = np.arange(T_COPIES, T_COPIES + A_COPIES)
    keys = np.concatenate([t_keys, a_keys])
    counts = np.concatenate([np.full(T_COPIES, count_t), np.full(A_COPIES, count_a)])
    rng = _rng(seed)
    outcomes, bits = [], []
    for _ in range(RUNS):
        out = combined.release(keys, counts, epsilon=1.0, delta=1e-6, s=S, seed=9, rng=rng)
        values = dict(zip(out.threshold.keys.tolist(), out.threshold.values.tolist(), strict=True))
        outcomes.append([values.get(k, ABSENT) for k in t_keys.tolist()])
        family = HashFamily(9, out.sketch.m, S)
        rows = family.rows(hash_keys(keys, 9), 0)  # count 0 vs 1 moves only column 0
        own = (np.bincount(rows, minlength=S)[rows] == 1)[T_COPIES:]
        bits.append(out.sketch.bit_matrix()[0, rows[T_COPIES:][own]])
    return np.concatenate(outcomes), np.concatenate(bits)


def _threshold_loss_lower_bound(a: np.ndarray, b: np.ndarray) -> float:
    bins = np.union1d(a, b)
    ca = np.array([np.count_nonzero(a == v) for v in bins]) + 0.5
    cb = np.array([np.count_nonzero(b == v) for v in bins]) + 0.5
    keep = np.maximum(ca, cb) >= 300
    ratio = np.abs(np.log(ca[keep] / a.size) - np.log(cb[keep] / b.size))
    return float(np.max(ratio - Z * np.sqrt(1 / ca[keep] + 1 / cb[keep])))


def _bit_loss_lower_bound(a: np.ndarray, b: np.ndarray) -> float:
    q, r = a.mean(), b.mean()
    loss = max(abs(math.log(q / r)), abs(math.log((1 - q) / (1 - r))))
    se = math.sqrt(q * (1 - q) / a.size + r * (1 - r) / b.size) / min(q, r, 1 - q, 1 - r)
    return loss - Z * se


def _sketch_gets_the_whole_budget(monkeypatch) -> None:
    """Twin: the ALP part is projected with the full ε instead of (1 - split)·ε."""
    real = alp.project_hashes

    def broken(*args, epsilon, **kwargs):
        return real(*args, epsilon=2 * epsilon, **kwargs)

    monkeypatch.setattr(alp, "project_hashes", broken)


@pytest.mark.parametrize(
    ("twin", "private"), [(None, True), (_sketch_gets_the_whole_budget, False)]
)
def test_combined_release_is_epsilon_private_on_neighbours(monkeypatch, twin, private) -> None:
    """ε = 1, split 1/2: threshold values at count 33 vs 34 (τ = 28), sketch bits at 0 vs 1.

    Expected losses: threshold 0.5 (tight for discrete Laplace), sketch ≈ 0.405 (< 0.5); the twin's
    sketch ≈ 0.69. The sum of the two lower Z·se bounds must stay <= ε, and exceed it for the twin.
    """
    if twin is not None:
        twin(monkeypatch)
    outcomes, bits = _observe(33, 0, seed=20)
    outcomes_next, bits_next = _observe(34, 1, seed=21)
    total = _threshold_loss_lower_bound(outcomes, outcomes_next)
    total += _bit_loss_lower_bound(bits, bits_next)
    assert (total <= 1.0) == private


# --- answers with their error bound -------------------------------------------------------------


def test_answers_cover_the_truth_and_the_sketch_meets_its_error_bound() -> None:
    """3,000 keys with counts 0..59 (uniform) and 20 heavy keys of 500, ε = 1, δ = 1e-12 and
    s = 10·k rows: every 95% interval covers its key's count at least 93% of the time (binomial
    sd 0.4%), no answer leaves [0, c* - 1] unless released, and the sketch's mean absolute error
    over unreleased keys stays below its expected-error bound."""
    rng = np.random.Generator(np.random.PCG64(17))
    counts = np.concatenate([rng.integers(0, 60, 3000), np.full(20, 500)])
    keys = np.array([f"k{i}" for i in range(counts.size)], dtype=object)
    out = combined.release(keys, counts, epsilon=1.0, delta=1e-12, s=10 * counts.size, rng=rng)
    answers = [out.answer([k], confidence=0.95, keys_per_row=0.1) for k in keys]
    covered = np.array([a.lower <= c <= a.upper for a, c in zip(answers, counts, strict=True)])
    assert covered.mean() >= 0.93
    unreleased = np.array([not a.released[0] for a in answers])
    values = np.array([a.value for a in answers])
    assert np.all(values[unreleased] <= answers[0].unreleased_ceiling)
    error = np.abs(values[unreleased] - counts[unreleased]).mean()
    assert error <= answers[0].sketch_error_bound
    # ln(1/δ) = 27.6 > the bound's 5.06·α = 16.9: the sketch provably beats answering 0.
    assert answers[0].sketch_beats_zero
    # An IN list sums the keys' answers; its interval covers their total.
    pair = out.answer(keys[:2], confidence=0.95, keys_per_row=0.1)
    assert pair.lower <= counts[:2].sum() <= pair.upper


def test_a_sketch_coarser_than_its_threshold_says_it_cannot_beat_zero() -> None:
    """Δ = 64 at ε = 0.3 and δ = 1e-3: τ is about 9 noise scales, while the sketch's expected
    error bound is 5.06·α' ≈ 17 of its (twice as coarse) steps; an absent key's answer is
    clamped to [0, c* - 1] and the answer says the sketch cannot be shown to beat 0."""
    rng = np.random.Generator(np.random.PCG64(2))
    keys = np.array([f"k{i}" for i in range(200)], dtype=object)
    out = combined.release(
        keys,
        np.full(200, 30),
        epsilon=0.3,
        delta=1e-3,
        max_groups_per_unit=8,
        max_rows_per_group=8,
        s=2000,
        rng=rng,
    )
    absent = out.answer(["Astronaut"], confidence=0.95, keys_per_row=0.1)
    assert not absent.sketch_beats_zero
    assert 0 <= absent.value <= absent.unreleased_ceiling == absent.upper
    assert absent.lower == 0
