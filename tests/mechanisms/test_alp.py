"""Tests for dpsql.mechanisms.alp (ALP projection and estimator) and its hashing.

Accuracy is checked against the paper's Fig. 3 setting (ε = 1, α = 3, per-bit collision probability
0.1, x uniform in [0, β]: mean absolute error 6.4, std 11, 90th percentile 15.78; about 5 without
collisions), both in the paper's own simulation (independent collisions, our flips and estimator)
and end to end with real hashing. Privacy is checked per bit: cells are independent given the
input, so the likelihood ratio of any output is the product of per-cell ratios, estimated from
many seeded projections.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dpsql.errors import ParameterError
from dpsql.mechanisms import alp
from dpsql.mechanisms.hashing import HashFamily, hash_keys

Z = 4.0


def _rng(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


# --- building blocks ------------------------------------------------------------------------


def test_key_hashes_are_pinned() -> None:
    """The documented key hash must never change: stored synopses depend on it."""
    assert hash_keys(["example.com", ""], 1).tolist() == [568810749030592032, 15934838998881808459]
    assert hash_keys(np.array([0, -1, 2**62]), 1).tolist() == [
        15916886550466581944,
        8440349830928796964,
        13072686044078319555,
    ]
    assert hash_keys(np.array([7], dtype=np.int32), 5)[0] == hash_keys([7], 5)[0]


@pytest.mark.parametrize("alpha", [0.1, 0.5, 1, 2, 3, Fraction(10, 3), 5, 10, 50])
def test_flip_probability_is_dyadic_rounded_up(alpha: float) -> None:
    flip = alp.flip_probability(alpha)
    exact = 1 / (Fraction(alpha) + 2)
    assert flip >= exact and flip.denominator <= 2**16
    assert flip.denominator & (flip.denominator - 1) == 0
    assert Fraction(alpha) * Fraction(995, 1000) <= alp.effective_alpha(flip) <= Fraction(alpha)
    assert alp.flip_probability(Fraction(10, 3)) == Fraction(3, 16)


@pytest.mark.parametrize("flip", [Fraction(3, 16), Fraction(205, 1024), Fraction(1, 2)])
def test_bernoulli_words_have_the_exact_flip_probability(flip: Fraction) -> None:
    words = alp._bernoulli_words(flip, 1 << 15, _rng(1))
    frequency = np.unpackbits(words.view(np.uint8)).mean()
    p = float(flip)
    assert abs(frequency - p) < Z * math.sqrt(p * (1 - p) / (64 << 15))


def test_walk_estimate_is_the_mean_of_the_maximisers() -> None:
    bits = _rng(2).integers(0, 2, size=(300, 9)).astype(np.uint8)
    for row, estimate in zip(bits, alp.walk_estimate(bits), strict=True):
        walk = np.concatenate([[0], np.cumsum(2 * row.astype(int) - 1)])
        assert estimate == np.flatnonzero(walk == walk.max()).mean()


# --- accuracy (paper, Fig. 3) ----------------------------------------------------------------


def test_error_matches_fig3_in_the_papers_simulation() -> None:
    """ε = 1, α = 3 (α' = 2.995), β = 5000, every bit collides w.p. 0.1; 20 000 trials.

    Tolerances: mean abs. error 6.4 ± 0.4, std 11 ± 1 (we observe ≈ 10.7), 90th pct 15.78 ± 1.
    """
    trials, beta = 20_000, 5000.0
    flip = alp.flip_probability(3)
    alpha = float(alp.effective_alpha(flip))
    m = math.ceil(beta / alpha)
    rng = _rng(3)
    x = rng.uniform(0, beta, trials)
    scaled = x / alpha
    y = np.floor(scaled) + (rng.random(trials) < scaled - np.floor(scaled))
    errors = []
    for rows in np.array_split(np.arange(trials), 4):
        embedding = (np.arange(m) < y[rows, None]) | (rng.random((rows.size, m)) < 0.1)
        flips = alp._bernoulli_words(flip, math.ceil(rows.size * m / 64), rng)
        flips = np.unpackbits(flips.view(np.uint8))[: rows.size * m].reshape(rows.size, m)
        estimate = alp.walk_estimate(embedding.astype(np.uint8) ^ flips) * alpha
        errors.append(estimate - x[rows])
    error = np.concatenate(errors)
    assert abs(np.abs(error).mean() - 6.4) < 0.4
    assert abs(error.std() - 11.0) < 1.0
    assert abs(np.percentile(np.abs(error), 90) - 15.78) < 1.0


def _end_to_end_errors(collision: float, seed: int) -> np.ndarray:
    """Real hashing: 2000 probes uniform in [0, β], background keys at β filling each column."""
    beta, probes, s = 2000.0, 2000, 2**17
    background = max(0, round(s * -math.log1p(-collision) - probes / 2))
    rng = _rng(seed)
    truth = rng.uniform(0, beta, probes)
    keys = np.arange(probes + background)
    values = np.concatenate([truth, np.full(background, beta)])
    sketch = alp.project(keys, values, epsilon=1.0, alpha=3, s=s, beta=beta, seed=seed, rng=rng)
    return sketch.estimate(keys[:probes]) - truth


def test_end_to_end_error_with_collisions_matches_fig3() -> None:
    """β = 2000, s = 2^17, per-column collision ≈ 0.1: mean abs. error 6.4 within [5.7, 7.3]."""
    error = _end_to_end_errors(0.1, seed=4)
    assert 5.7 < np.abs(error).mean() < 7.3
    assert 13.5 < np.percentile(np.abs(error), 90) < 18.0


def test_end_to_end_error_without_collisions_is_about_five() -> None:
    """The paper's "s >= 100k" regime (collisions < 1 %): mean abs. error in [4.1, 5.3]."""
    error = _end_to_end_errors(0.0, seed=5)
    assert 4.1 < np.abs(error).mean() < 5.3


# --- privacy --------------------------------------------------------------------------------


def _bit_frequencies(value: float, *, runs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per column: frequency of 1 at the copies' own cells (cells shared by copies excluded)."""
    copies, s = 20_000, 2**20
    keys = np.arange(copies)
    ones = None
    rng = _rng(seed)
    for _ in range(runs):
        sketch = alp.project(
            keys, np.full(copies, value), epsilon=0.25, s=s, beta=100.0, seed=77, rng=rng
        )
        matrix = sketch.bit_matrix()
        family = HashFamily(77, sketch.m, s)
        hashes = hash_keys(keys, 77)
        counts = np.zeros(sketch.m)
        samples = np.zeros(sketch.m)
        for column in range(sketch.m):
            rows = family.rows(hashes, column)
            unique = np.bincount(rows, minlength=s)[rows] == 1
            counts[column] += matrix[column, rows[unique]].sum()
            samples[column] += np.count_nonzero(unique)
        ones = counts if ones is None else ones + counts
    scaled = value * sketch.projection_epsilon / float(sketch.alpha)
    prior = np.clip(scaled - np.arange(sketch.m), 0.0, 1.0)  # P(unary bit b is 1)
    return ones / (samples * runs), prior


def _wrong_flips(flip: Fraction, words: int, rng: np.random.Generator) -> np.ndarray:
    """Twin: flips with probability 15/128 ≈ 1/(2α+2) instead of 1/(α+2) = 3/16."""
    return _real_bernoulli_words(Fraction(15, 128), words, rng)


_real_bernoulli_words = alp._bernoulli_words


@pytest.mark.parametrize("values", [(40.0, 41.0), (0.0, 1.0)])
@pytest.mark.parametrize(("twin", "private"), [(None, True), (_wrong_flips, False)])
def test_projection_bits_are_epsilon_private(monkeypatch, values, twin, private: bool) -> None:
    """Neighbours: one key's value v vs v + 1 (Δ = 1), ε = 0.25, α = 10/3.

    The output's worst-case log-likelihood ratio is the sum over cells of the larger of
    ``|log(q/q')|`` and ``|log((1-q)/(1-q'))|``; cells whose unary bit has the same law under both
    inputs are checked to agree and contribute 0. The lower Z·se bound must stay <= ε, and exceed
    it for the twin.
    """
    if twin is not None:
        monkeypatch.setattr(alp, "_bernoulli_words", twin)
    runs = 5
    q, prior = _bit_frequencies(values[0], runs=runs, seed=10)
    q_next, prior_next = _bit_frequencies(values[1], runs=runs, seed=11)
    samples = runs * 19_000
    se = np.sqrt(q * (1 - q) / samples + q_next * (1 - q_next) / samples)
    affected = prior != prior_next
    assert np.all(np.abs(q - q_next)[~affected] < Z * se[~affected])
    ratio_one = np.abs(np.log(q / q_next))
    ratio_zero = np.abs(np.log((1 - q) / (1 - q_next)))
    loss = np.maximum(ratio_one, ratio_zero)[affected].sum()
    se_loss = math.sqrt(np.sum((se / np.minimum(q, 1 - q))[affected] ** 2))
    assert (loss - Z * se_loss <= 0.25) == private


# --- sketch behaviour -----------------------------------------------------------------------


def _sketch(**changes: object) -> alp.ALPSketch:
    arguments: dict[str, object] = {"epsilon": 1.0, "seed": 3, "rng": _rng(6)}
    arguments.update(changes)
    keys = np.array([f"user-{i}@secret.example" for i in range(3000)], dtype=object)
    counts = np.arange(3000) % 50
    return alp.project(keys, counts, **arguments)


def test_round_trip_gives_identical_estimates_and_parameters() -> None:
    sketch = _sketch()
    back = alp.ALPSketch.from_bytes(sketch.to_bytes())
    queries = np.array([f"user-{i}@secret.example" for i in range(0, 6000, 7)], dtype=object)
    assert np.array_equal(back.estimate(queries), sketch.estimate(queries))
    for field in ("epsilon", "projection_epsilon", "alpha", "flip_probability", "beta", "s", "m"):
        assert getattr(back, field) == getattr(sketch, field)
    assert back.seed == sketch.seed and back.noisy_key_count == sketch.noisy_key_count
    with pytest.raises(ParameterError):
        alp.ALPSketch.from_bytes(sketch.to_bytes()[:-1])
    with pytest.raises(ParameterError):
        alp.ALPSketch.from_bytes(b"DPSQLTHR" + sketch.to_bytes()[8:])


def test_bytes_contain_no_input_keys_or_values() -> None:
    sketch = _sketch()
    data = sketch.to_bytes()
    assert all(f"user-{i}@secret.example".encode() not in data for i in range(3000))
    assert b"secret" not in data
    assert set(vars(sketch)) <= {f.name for f in sketch.__dataclass_fields__.values()} | {"_family"}
    ints = np.array([2**62 + 12345, 2**61 + 999], dtype=np.int64)
    int_sketch = alp.project(ints, [5, 7], epsilon=1.0, s=4096, seed=1, rng=_rng(7))
    assert all(int(k).to_bytes(8, "little") not in int_sketch.to_bytes() for k in ints)


def test_batched_estimates_equal_one_by_one_and_are_deterministic() -> None:
    sketch = _sketch(s=2048)
    keys = np.array([f"user-{i}@secret.example" for i in range(3000)], dtype=object)
    batched = sketch.estimate(keys)
    single = np.array([sketch.estimate(keys[i : i + 1])[0] for i in range(0, 3000, 97)])
    assert np.array_equal(batched[::97], single)
    assert np.array_equal(_sketch(s=2048).bits, sketch.bits)  # same seeds, same output
    assert np.all(batched >= 0) and np.all(batched <= sketch.m * sketch.step + 1e-9)


def test_rows_come_from_a_private_key_count_when_s_is_not_given() -> None:
    sketch = _sketch(rows_per_key=8.0)
    assert sketch.noisy_key_count is not None
    assert abs(sketch.noisy_key_count - 2940) < 400  # 3000 keys, 60 with count 0; scale 20
    assert sketch.s == max(64, math.ceil(8.0 * sketch.noisy_key_count / 64) * 64)
    assert sketch.projection_epsilon == pytest.approx(0.95)
    assert _sketch(s=1000).s == 1024 and _sketch(s=1000).projection_epsilon == 1.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"epsilon": -1.0}, "epsilon"),
        ({"epsilon": float("nan")}, "epsilon"),
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": 1000.0}, "alpha"),
        ({"s": 0}, "s"),
        ({"beta": float("inf")}, "beta"),
        ({"size_fraction": 1.0}, "size_fraction"),
        ({"max_groups_per_unit": 0}, "max_groups_per_unit"),
        ({"seed": -1}, "seed"),
        ({"beta": 1e9}, "too large"),
    ],
)
def test_invalid_arguments_raise_parameter_error(changes: dict, message: str) -> None:
    with pytest.raises(ParameterError, match=message):
        _sketch(**changes)


def test_invalid_keys_and_counts_raise_parameter_error() -> None:
    with pytest.raises(ParameterError, match="distinct"):
        alp.project(["a", "a"], [1, 2], epsilon=1.0, s=64, rng=_rng(0))
    with pytest.raises(ParameterError, match="counts"):
        alp.project(["a", "b"], [1, -2], epsilon=1.0, s=64, rng=_rng(0))
    with pytest.raises(ParameterError, match="counts"):
        alp.project(["a", "b"], [1], epsilon=1.0, s=64, rng=_rng(0))
    with pytest.raises(ParameterError, match="str"):
        alp.project(["a", 1], [1, 2], epsilon=1.0, s=64, rng=_rng(0))
    with pytest.raises(ParameterError, match="str keys"):
        _sketch(s=64).estimate([1, 2])
