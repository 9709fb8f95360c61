"""Tests of compressed randomized response: exact RR output law, privacy on neighbouring item sets
(with broken twins that must fail), message size, decoding, estimators, Philox and Elias codes.
Fixed seeds throughout; every statistical bound is stated where it is checked."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

from dpsql.errors import ParameterError
from dpsql.mechanisms import elias
from dpsql.mechanisms.compressed_rr import (
    CompressedRR,
    common_items,
    common_items_matrix,
    item_popularity,
    rr_probabilities,
    suggest_chunks,
)
from dpsql.mechanisms.philox import philox4x64
from tests.mechanisms.privacy_loss import max_log_ratio_lower_bound


def _rng(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


# --- broken twins --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class SharedStreamTwin(CompressedRR):
    """Alg. 2 read literally: one candidate stream for all chunks of a user (noise repeats)."""

    def _candidate_bits(self, key0, key1, chunk, rank, offset):  # type: ignore[override]
        return super()._candidate_bits(key0, key1, np.zeros_like(chunk), rank, offset)


def _leaky_messages(items: list[int], count: int, *, epsilon: float, seed: int) -> list[bytes]:
    """The paper's parameter choice m = ⌈β ε_RR d⌉ from the person's own d (β = 2), with m sent
    in front of the indices so that a decoder can read the message (it reveals d; Thm 1 assumes
    a fixed partition)."""
    epsilon_rr = epsilon / 4.0
    chunks = max(1, math.ceil(2.0 * epsilon_rr * len(items)))
    codec = CompressedRR(n=4, epsilon=epsilon, chunks=chunks, public_seed=3)
    body = codec.encode_many([items] * count, user_ids=[0] * count, rng=_rng(seed))
    return [elias.encode([chunks]) + message for message in body]


# --- the decoded row is exactly randomized response ----------------------------------------------


def _outcome_codes(rows: np.ndarray) -> np.ndarray:
    return rows.astype(np.int64) @ (1 << np.arange(rows.shape[1]))


def _rr_outcome_probabilities(n: int, items: list[int], flip: float) -> np.ndarray:
    outcomes = (np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1
    truth = np.zeros(n, dtype=np.int64)
    truth[items] = 1
    return np.prod(np.where(outcomes == truth, 1.0 - flip, flip), axis=1)


def _chi_square_p_value(rows: np.ndarray, items: list[int], flip: float) -> float:
    """Goodness of fit of whole decoded rows to product RR; cells expecting < 5 are pooled."""
    expected = _rr_outcome_probabilities(rows.shape[1], items, flip) * rows.shape[0]
    observed = np.bincount(_outcome_codes(rows), minlength=expected.size)
    small = expected < 5
    observed = np.append(observed[~small], observed[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
    return float(stats.chisquare(observed, expected).pvalue)


def test_decoded_rows_are_exactly_randomized_response() -> None:
    """n = 8, d = 2, 4 chunks, ε_RR = 1, 40k persons with distinct ids:
    - chi-square of the 256 whole-row outcomes against product RR: p > 1e-3;
    - per-coordinate frequency of ones within 4.5 standard errors of keep / flip;
    - a twin sharing one candidate stream across chunks fails the same chi-square (p < 1e-6)."""
    persons, items = 40_000, [0, 5]
    codec = CompressedRR(n=8, epsilon=4.0, chunks=4, public_seed=11)
    keep, flip = 1.0 - codec.flip_probability, codec.flip_probability
    assert math.isclose(codec.epsilon_rr, 1.0, rel_tol=1e-12)
    ids = list(range(persons))
    rows = codec.decode_many(
        codec.encode_many([items] * persons, user_ids=ids, rng=_rng(1)), user_ids=ids
    )
    assert _chi_square_p_value(rows, items, flip) > 1e-3
    expected = np.full(8, flip)
    expected[items] = keep
    error = np.sqrt(expected * (1 - expected) / persons)
    assert np.all(np.abs(rows.mean(axis=0) - expected) < 4.5 * error), rows.mean(axis=0)

    twin = SharedStreamTwin(n=8, epsilon=4.0, chunks=4, public_seed=11)
    twin_rows = twin.decode_many(
        twin.encode_many([items] * persons, user_ids=ids, rng=_rng(1)), user_ids=ids
    )
    assert _chi_square_p_value(twin_rows, items, flip) < 1e-6


def test_larger_rows_keep_the_randomized_response_marginals() -> None:
    """n = 3000, d = 60, 30 chunks, ε_RR = 0.25, 200 persons: the frequency of ones over the
    persons' items and over their non-items are within 4.5 standard errors of keep / flip, and
    the number of ones per row has the binomial-sum variance within 25%."""
    n, d, persons = 3000, 60, 200
    codec = CompressedRR(
        n=n, epsilon=1.0, chunks=suggest_chunks(n=n, epsilon=1.0, public_d=d), public_seed=5
    )
    assert codec.chunks == 30
    rng = _rng(2)
    item_sets = [rng.choice(n, d, replace=False) for _ in range(persons)]
    ids = [f"person-{i}" for i in range(persons)]
    rows = codec.decode_many(codec.encode_many(item_sets, user_ids=ids, rng=rng), user_ids=ids)
    truth = np.zeros((persons, n), dtype=bool)
    for row, chosen in zip(truth, item_sets, strict=True):
        row[chosen] = True
    keep, flip = 1.0 - codec.flip_probability, codec.flip_probability
    for value, target in ((True, keep), (False, flip)):
        sample = rows[truth == value]
        error = math.sqrt(target * (1 - target) / sample.size)
        assert abs(sample.mean() - target) < 4.5 * error, (value, sample.mean(), target)
    variance = d * keep * (1 - keep) + (n - d) * flip * (1 - flip)
    assert 0.75 < rows.sum(axis=1).var(ddof=1) / variance < 1.25


def test_users_get_independent_noise_and_decoding_is_deterministic() -> None:
    codec = CompressedRR(n=2000, epsilon=1.0, chunks=10, public_seed=9)
    items = list(range(0, 2000, 50))
    first = codec.encode(items, user_id=1, rng=_rng(0))
    second = codec.encode(items, user_id=2, rng=_rng(0))
    a, b = codec.decode(first, user_id=1), codec.decode(second, user_id=2)
    assert np.array_equal(a, codec.decode(first, user_id=1))
    correlation = np.corrcoef(a, b)[0, 1]
    assert abs(correlation) < 4.5 / math.sqrt(2000), correlation


# --- privacy on neighbouring item sets ---------------------------------------------------------


def _message_samples(codec: CompressedRR, items: list[int], count: int, seed: int) -> list[bytes]:
    """Messages of one person (fixed user id, so fixed public candidates) over private seeds."""
    return codec.encode_many([items] * count, user_ids=[0] * count, rng=_rng(seed))


def test_whole_messages_respect_the_privacy_bound() -> None:
    """n = 4, ε = 2 (ε_RR = 0.5, α = 2), item sets {0, 1} and {1}, user id fixed (the adversary
    knows every candidate): 60k messages each; the lower confidence bound of the worst log ratio
    over all messages is <= 2αε_RR = 2.

    Broken twins on the same neighbours must exceed 2:
    - chunks from the person's own d (the paper's m = ⌈β ε d⌉), which reveals d;
    - RR run at the final ε instead of ε/(2α) (the ratio computed with the wrong ε)."""
    bound = 2.0
    x, neighbour = [0, 1], [1]
    codec = CompressedRR(n=4, epsilon=bound, chunks=1, public_seed=3)
    assert math.isclose(2 * codec.alpha * codec.epsilon_rr, bound, rel_tol=1e-12)
    first = _message_samples(codec, x, 60_000, seed=1)
    second = _message_samples(codec, neighbour, 60_000, seed=2)
    assert max_log_ratio_lower_bound(first, second) <= bound

    leaky = max_log_ratio_lower_bound(
        _leaky_messages(x, 5000, epsilon=bound, seed=3),
        _leaky_messages(neighbour, 5000, epsilon=bound, seed=4),
    )
    assert leaky > bound, leaky

    wrong_epsilon = dataclasses.replace(codec, epsilon=2 * codec.alpha * bound)
    twin = max_log_ratio_lower_bound(
        _message_samples(wrong_epsilon, x, 15_000, seed=5),
        _message_samples(wrong_epsilon, neighbour, 15_000, seed=6),
    )
    assert twin > bound, twin


def test_decoded_bit_of_the_changed_item_is_epsilon_rr_private() -> None:
    """Post-processing check at the differing coordinate: Pr[y_0 = 1 | 0 ∈ x] / Pr[y_0 = 1 | 0 ∉ x]
    estimates e^{ε_RR}, within 4.5 standard errors on the log scale (20k persons each)."""
    codec = CompressedRR(n=50, epsilon=2.0, chunks=5, public_seed=4)
    persons = 20_000
    ids = list(range(persons))
    with_item = codec.decode_many(
        codec.encode_many([[0, 7]] * persons, user_ids=ids, rng=_rng(1)), user_ids=ids
    )[:, 0].mean()
    without = codec.decode_many(
        codec.encode_many([[7]] * persons, user_ids=ids, rng=_rng(2)), user_ids=ids
    )[:, 0].mean()
    error = math.sqrt((1 - with_item) / (with_item * persons) + (1 - without) / (without * persons))
    assert abs(math.log(with_item / without) - codec.epsilon_rr) < 4.5 * error


def test_a_crowded_chunk_is_refused_before_any_randomness() -> None:
    codec = CompressedRR(n=1000, epsilon=1.0, chunks=1, public_seed=1, max_chunk_log_ratio=5.0)
    codec.encode(range(20), user_id=0, rng=_rng(0))  # 0.25 * 20 = 5 is allowed
    with pytest.raises(ParameterError, match="chunk"):
        codec.encode(range(21), user_id=0, rng=_rng(0))


# --- decoding ------------------------------------------------------------------------------------


def test_decode_entries_agree_with_decode() -> None:
    codec = CompressedRR(n=5000, epsilon=2.0, chunks=37, public_seed=123, code="delta")
    rng = _rng(4)
    items = [rng.choice(5000, 80, replace=False) for _ in range(3)]
    ids = [10, "ten", b"10"]
    messages = codec.encode_many(items, user_ids=ids, rng=rng)
    rows = codec.decode_many(messages, user_ids=ids)
    for message, user, row in zip(messages, ids, rows, strict=True):
        assert np.array_equal(codec.decode(message, user_id=user), row)
        wanted = rng.integers(0, 5000, size=(40, 3))
        assert np.array_equal(codec.decode_entries(message, wanted, user_id=user), row[wanted])
    assert np.array_equal(codec.noisy_counts(messages, user_ids=ids), rows.sum(axis=0))
    assert len({bytes(r) for r in rows}) == 3


def test_public_layout_is_a_balanced_deterministic_partition() -> None:
    codec = CompressedRR(n=1003, epsilon=1.0, chunks=10, public_seed=8)
    again = CompressedRR(n=1003, epsilon=1.0, chunks=10, public_seed=8)
    other = CompressedRR(n=1003, epsilon=1.0, chunks=10, public_seed=9)
    assert np.array_equal(np.sort(codec._position), np.arange(1003))
    assert np.array_equal(codec._position, again._position)
    assert not np.array_equal(codec._position, other._position)
    sizes = np.diff(codec._starts)
    assert sizes.sum() == 1003 and sizes.max() - sizes.min() <= 1


def test_encode_pairs_matches_encode_many() -> None:
    codec = CompressedRR(n=300, epsilon=1.0, chunks=4, public_seed=2)
    persons = np.array([2, 0, 2, 2, 0])
    items = np.array([5, 7, 9, 5, 100])
    from_pairs = codec.encode_pairs(persons, items, user_ids=["a", "b", "c"], rng=_rng(3))
    from_sets = codec.encode_many([[7, 100], [], [5, 9]], user_ids=["a", "b", "c"], rng=_rng(3))
    assert from_pairs == from_sets


# --- message size: O(ε d) bits, far below n ------------------------------------------------------


def test_message_size_grows_like_epsilon_times_d() -> None:
    """n = 20000, chunks from the public d (β = 2): mean bits per item (whole padded bytes) lie
    in [0.9, 1.8] at ε = 1 and [2.2, 3.4] at ε = 2 (reference implementation: 1.28 and 2.68);
    16× more items cost between 12× and 20× more bits; every message is far below n bits."""
    n = 20_000
    rng = _rng(6)
    sizes: dict[tuple[float, int], float] = {}
    for epsilon in (1.0, 2.0):
        for d in (25, 400):
            codec = CompressedRR(
                n=n,
                epsilon=epsilon,
                chunks=suggest_chunks(n=n, epsilon=epsilon, public_d=d),
                public_seed=1,
            )
            persons = 12 if d == 25 else 4
            item_sets = [rng.choice(n, d, replace=False) for _ in range(persons)]
            messages = codec.encode_many(item_sets, user_ids=list(range(persons)), rng=rng)
            sizes[epsilon, d] = float(np.mean([8 * len(m) for m in messages]))
            assert max(8 * len(m) for m in messages) < n / 10
    for epsilon, (low, high) in ((1.0, (0.9, 1.8)), (2.0, (2.2, 3.4))):
        per_item = sizes[epsilon, 400] / 400
        assert low <= per_item <= high, (epsilon, per_item)
        assert 12 <= sizes[epsilon, 400] / sizes[epsilon, 25] <= 20, sizes
    assert sizes[2.0, 400] > 1.6 * sizes[1.0, 400]


# --- estimators -----------------------------------------------------------------------------------


def test_item_popularity_is_unbiased_with_calibrated_intervals() -> None:
    """2000 persons, 40 items with true counts 0..1950, ε_RR = 0.5, 400 replications of exact RR:
    the mean estimate is within 4.5 standard errors of the truth for every item, the stated
    standard error matches the empirical one within 10%, and 95% intervals cover 93-97%."""
    persons, replications, epsilon_rr = 2000, 400, 0.5
    keep, flip = rr_probabilities(epsilon_rr)
    truth = np.arange(0, 2000, 50)
    rng = _rng(7)
    noisy = rng.binomial(truth, keep, size=(replications, truth.size)) + rng.binomial(
        persons - truth, flip, size=(replications, truth.size)
    )
    estimates = item_popularity(noisy, persons, epsilon_rr=epsilon_rr)
    error = estimates.std_error / math.sqrt(replications)
    assert np.all(np.abs(estimates.estimate.mean(axis=0) - truth) < 4.5 * error)
    assert 0.9 < estimates.estimate.std(axis=0, ddof=1).mean() / estimates.std_error < 1.1
    covered = (estimates.lower <= truth) & (truth <= estimates.upper)
    assert 0.93 <= covered.mean() <= 0.97, covered.mean()


def test_common_items_is_unbiased_with_the_stated_variance() -> None:
    """n = 300, |A| = 30, |B| = 40, |A ∩ B| = 10, ε_RR = 1, 3000 replications: mean within 4.5
    standard errors of 10, stated standard error within 10% of the empirical one, and the
    pairwise matrix equals the pairwise function."""
    n, replications, epsilon_rr = 300, 3000, 1.0
    keep, flip = rr_probabilities(epsilon_rr)
    a, b = np.zeros(n, bool), np.zeros(n, bool)
    a[:30], b[20:60] = True, True
    rng = _rng(8)
    noisy_a = rng.random((replications, n)) < np.where(a, keep, flip)
    noisy_b = rng.random((replications, n)) < np.where(b, keep, flip)
    results = [
        common_items(x, y, epsilon_rr=epsilon_rr) for x, y in zip(noisy_a, noisy_b, strict=True)
    ]
    values = np.array([r.estimate for r in results])
    stated = np.mean([r.std_error for r in results])
    assert abs(values.mean() - 10) < 4.5 * values.std(ddof=1) / math.sqrt(replications)
    assert 0.9 < values.std(ddof=1) / stated < 1.1
    matrix = common_items_matrix(np.stack([noisy_a[0], noisy_b[0]]), epsilon_rr=epsilon_rr)
    assert math.isclose(matrix[0, 1], results[0].estimate, rel_tol=1e-9, abs_tol=1e-9)


def test_estimators_on_decoded_messages() -> None:
    """End to end: 3000 persons, n = 60, item j held by the first 50·j persons; every item's
    popularity estimate is within 4.5 standard errors of the truth."""
    n, persons = 60, 3000
    codec = CompressedRR(n=n, epsilon=2.0, chunks=15, public_seed=21)
    holders = 50 * np.arange(n)
    item_sets = [np.flatnonzero(holders > p) for p in range(persons)]
    ids = list(range(persons))
    messages = codec.encode_many(item_sets, user_ids=ids, rng=_rng(9))
    estimate = codec.item_popularity(codec.noisy_counts(messages, user_ids=ids), persons)
    assert np.all(np.abs(estimate.estimate - holders) < 4.5 * estimate.std_error)


# --- shared randomness and codes -----------------------------------------------------------------


def test_philox_matches_numpy_word_for_word() -> None:
    rng = _rng(10)
    counters = rng.integers(0, 2**64, size=(4, 64), dtype=np.uint64)
    keys = rng.integers(0, 2**64, size=(2, 64), dtype=np.uint64)
    ours = np.array(philox4x64(tuple(counters), tuple(keys)))
    for column in range(64):
        value = sum(int(w) << (64 * i) for i, w in enumerate(counters[:, column])) - 1
        previous = np.array(
            [(value % 2**256 >> (64 * i)) & (2**64 - 1) for i in range(4)], dtype=np.uint64
        )
        reference = np.random.Philox(counter=previous, key=keys[:, column].copy()).random_raw(4)
        assert np.array_equal(reference, ours[:, column])


@pytest.mark.parametrize("code", ["gamma", "delta"])
def test_elias_codes_round_trip_and_reject_malformed_messages(code: elias.Code) -> None:
    rng = _rng(11)
    for _ in range(50):
        count = int(rng.integers(1, 200))
        width = rng.integers(1, 65, size=count).astype(np.uint64)
        values = rng.integers(0, 2**64, size=count, dtype=np.uint64) >> (np.uint64(64) - width)
        values |= np.uint64(1) << (width - np.uint64(1))
        data = elias.encode(values, code=code)
        assert 0 <= 8 * len(data) - int(elias.code_lengths(values, code=code).sum()) < 8
        assert np.array_equal(elias.decode(data, count, code=code), values)
        for bad, expected_count in ((data + b"\x00", count), (data[:-1], count), (data, count + 1)):
            with pytest.raises(ParameterError):
                elias.decode(bad, expected_count, code=code)
    assert elias.code_lengths([1, 2, 3, 4, 2**64 - 1], code=code).tolist() == (
        [1, 3, 3, 5, 127] if code == "gamma" else [1, 4, 4, 5, 76]
    )
    rows = rng.geometric(0.2, size=(30, 7))
    assert elias.encode_rows(rows, code=code) == [elias.encode(row, code=code) for row in rows]
    for bad_values in ([0], [-3], [1.5]):
        with pytest.raises(ParameterError):
            elias.encode(bad_values, code=code)
    with pytest.raises(ParameterError):
        elias.decode(b"\x80\x01", 1, code=code)


# --- parameters -----------------------------------------------------------------------------------


def test_invalid_parameters_are_rejected() -> None:
    good = {"n": 100, "epsilon": 1.0, "chunks": 5, "public_seed": 1}
    for name, value in [
        ("n", 0),
        ("n", 2.5),
        ("epsilon", 0.0),
        ("epsilon", -1.0),
        ("epsilon", math.nan),
        ("epsilon", math.inf),
        ("chunks", 0),
        ("chunks", 101),
        ("public_seed", -1),
        ("public_seed", 2**256),
        ("alpha", 1.0),
        ("alpha", math.inf),
        ("code", "huffman"),
        ("method", "heap"),
        ("max_chunk_log_ratio", 0.0),
    ]:
        with pytest.raises(ParameterError, match=name):
            CompressedRR(**{**good, name: value})
    codec = CompressedRR(**good)
    for items in ([100], [-1], [1.5]):
        with pytest.raises(ParameterError, match="items"):
            codec.encode(items, user_id=1, rng=_rng(0))
    with pytest.raises(ParameterError, match="user_id"):
        codec.encode([1], user_id=1.5, rng=_rng(0))  # type: ignore[arg-type]
    message = codec.encode([1], user_id=1, rng=_rng(0))
    with pytest.raises(ParameterError, match="message"):
        codec.decode(message + b"\x01", user_id=1)
    with pytest.raises(ParameterError, match="indices"):
        codec.decode_entries(message, [100], user_id=1)
    with pytest.raises(ParameterError, match="user_ids"):
        codec.encode_many([[1], [2]], user_ids=[1])
    with pytest.raises(ParameterError, match="public_d"):
        suggest_chunks(n=100, epsilon=1.0, public_d=-1)
    with pytest.raises(ParameterError, match="confidence"):
        item_popularity([1, 2], 10, epsilon_rr=1.0, confidence=1.0)


def test_parameter_helpers() -> None:
    assert suggest_chunks(n=87_585, epsilon=1.0, public_d=1000) == 500
    assert suggest_chunks(n=10, epsilon=8.0, public_d=1000) == 10
    assert suggest_chunks(n=10, epsilon=1.0, public_d=0) == 1
    keep, flip = rr_probabilities(math.log(3.0))
    assert math.isclose(keep, 0.75) and math.isclose(flip, 0.25)
    codec = CompressedRR(n=10, epsilon=1.0, chunks=1, public_seed=0, alpha=1.5)
    assert codec.epsilon_rr <= 1.0 / 3.0 and math.isclose(
        codec.epsilon_rr, 1.0 / 3.0, rel_tol=1e-12
    )


def test_default_randomness_is_secure_and_decodable() -> None:
    codec = CompressedRR(n=500, epsilon=1.0, chunks=3, public_seed=5)
    first = codec.encode([1, 2, 3], user_id="u")
    assert codec.decode(first, user_id="u").shape == (500,)


def test_encoding_no_persons_returns_no_messages() -> None:
    codec = CompressedRR(n=100, epsilon=1.0, chunks=2, public_seed=1)
    assert codec.encode_many([], user_ids=[]) == []
