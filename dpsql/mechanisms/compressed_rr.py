"""Locally private publication of sparse 0/1 vectors: randomized response compressed with PPR.

Hillebrand, Suppakitpaisarn, Shibuya, "Communication-Efficient Publication of Sparse Vectors under
Differential Privacy" (the seed paper), Algorithms 1-3 and Theorem 1, with PPR (Liu, Chen, Özgür,
Li, "Universal Exact Compression of Differentially Private Mechanisms", NeurIPS 2024).
A person's row is the set of items they have (the indices of the ones of a length-``n`` 0/1
vector; the public reference vector is all zeros). The message is what randomized response
``RR_{ε_RR}`` of the whole row would be, compressed to ``O(ε_RR · d)`` bits for ``d`` items:

* **Chunks** (Alg. 1). A public random permutation ``φ`` of the ``n`` items, drawn from the public
  seed, is cut into ``chunks`` consecutive, near-equal chunks. ``chunks`` is a public parameter and
  never depends on the person (the paper's ``m = βεd`` from a person's own ``d`` leaks ``d``, and
  Thm 1's parallel composition assumes a fixed partition): pick it from a public bound or population
  statistic (:func:`suggest_chunks`).
* **PPR per chunk** (Alg. 1 and 3, :mod:`.ppr`). Target ``P_q`` = RR of the chunk, proposal ``Q_q``
  = RR of the all-zero reference; ``dP_q/dQ_q(z) = Π_{items i in q} e^{±ε_RR}`` (``+`` where ``z_i =
  1``) depends only on the person's items in the chunk. Every chunk, empty or not, sends its PPR
  index ``K_q``: a fixed index for an empty chunk keeps the output law exact but breaks privacy,
  since for a neighbouring row the law of ``K_q`` would jump from a point mass to PPR's.
* **Shared randomness** (Alg. 2, with a counter-based generator, Salmon et al. 2011). Candidate
  ``k`` of chunk ``q`` at in-chunk offset ``r`` is one Philox4x64-10 word: key = SHA-256(public
  seed, user id), counter ``(r // 4, k, q, 0)``, word ``r % 4``; a coordinate is 1 iff its 53-bit
  uniform falls below the flip probability. Streams are independent per (user, chunk): Alg. 2 read
  literally (one stream for all chunks of a user) repeats noise across chunks. Decoding one entry is
  one permutation lookup and one Philox call, whatever ``K_q`` is.
* **Message**: the ``K_q`` in Elias gamma (or delta) code, padded to whole bytes.

**Privacy** (seed paper Thm 1 = PPR Thm 4.7 per chunk + parallel composition over the fixed
partition). The message is ``2·α·ε_RR``-metric-DP under Hamming distance: adding or
removing one item changes the probability of any message by at most ``e^{2αε_RR}``. The class
takes that final ``epsilon`` and runs RR at ``ε_RR = epsilon / (2α)`` (rounded down to the 2**-53
grid of the shared uniforms). The guarantee holds against anyone who knows the public seed and the
user ids; it needs the encoder's ``rng`` to stay secret, ``chunks``, the seed and user ids to be
fixed without looking at the data, and distinct user ids. It is per item: a person with at most
``D`` items is ``epsilon·D``-DP against removal of their whole row. Encoder running time depends on
the data (a timing channel outside the model), and a row whose items crowd one chunk is refused
before any randomness is drawn.

**Output law** (seed paper Alg. 2, PPR Prop. 4.2). :meth:`CompressedRR.decode` returns exactly
RR at ``ε_RR`` of the row: independent coordinates, a one kept with probability ``e^ε/(1+e^ε)``,
a zero flipped with probability ``1/(1+e^ε)``; independent across users with distinct ids. So the
usual RR estimators apply (:func:`item_popularity`, :func:`common_items`).
"""

from __future__ import annotations

import hashlib
import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

from dpsql.errors import ParameterError
from dpsql.mechanisms import elias, ppr
from dpsql.mechanisms.philox import philox4x64, uniform53
from dpsql.mechanisms.random import resolve_rng

__all__ = [
    "CommonItemsEstimate",
    "CompressedRR",
    "PopularityEstimate",
    "common_items",
    "common_items_matrix",
    "item_popularity",
    "rr_probabilities",
    "suggest_chunks",
]

UserId = int | str | bytes
BoolArray = npt.NDArray[np.bool_]

_KEY_TAG = b"dpsql.compressed_rr.user.v1\x00"
_PERMUTATION_TAG = b"dpsql.compressed_rr.permutation.v1\x00"
_CANDIDATE_DOMAIN = 0
_UNIFORM_SCALE = 2**53
_BATCH_INSTANCES = 1 << 15
_DECODE_BATCH_WORDS = 1 << 20


def _check_epsilon(epsilon: float, name: str = "epsilon") -> float:
    try:
        value = float(epsilon)
    except (TypeError, ValueError):
        raise ParameterError(f"{name} must be a finite number > 0, got {epsilon!r}") from None
    if not math.isfinite(value) or value <= 0.0:
        raise ParameterError(f"{name} must be a finite number > 0, got {epsilon!r}")
    return value


def _check_int(value: object, name: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool):
        raise ParameterError(f"{name} must be an integer, got {value!r}")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ParameterError(f"{name} must be an integer, got {value!r}") from None
    if number < low or (high is not None and number > high):
        upper = "" if high is None else f" and <= {high}"
        raise ParameterError(f"{name} must be >= {low}{upper}, got {value!r}")
    return number


def rr_probabilities(epsilon_rr: float) -> tuple[float, float]:
    """``(keep, flip)`` of binary randomized response: ``e^ε/(1+e^ε)`` and ``1/(1+e^ε)``."""
    epsilon_rr = _check_epsilon(epsilon_rr, "epsilon_rr")
    flip = 1.0 / (1.0 + math.exp(epsilon_rr))
    return 1.0 - flip, flip


def suggest_chunks(
    *, n: int, epsilon: float, public_d: float, alpha: float = 2.0, beta: float = 2.0
) -> int:
    """The seed paper's ``m = ⌈β·ε_RR·d⌉`` (Sec. 4, β = 2 by default), from a PUBLIC ``d``.

    ``public_d`` must not come from the person being encoded: use a declared bound on items per
    person, or a population statistic released separately (e.g. a DP median). Each chunk then
    holds ``d / m = 1/(β ε_RR)`` of a typical person's items; fewer chunks mean shorter messages
    but an encoder cost growing like ``e^{ε_RR · load}`` in the most loaded chunk.
    """
    n = _check_int(n, "n", 1)
    epsilon = _check_epsilon(epsilon)
    alpha = ppr._check_alpha(alpha)
    public_d = float(public_d)
    if not math.isfinite(public_d) or public_d < 0:
        raise ParameterError(f"public_d must be a finite number >= 0, got {public_d!r}")
    beta = _check_epsilon(beta, "beta")
    return int(min(n, max(1, math.ceil(beta * epsilon / (2.0 * alpha) * public_d))))


def _seed_bytes(public_seed: int) -> bytes:
    return operator.index(public_seed).to_bytes(32, "big")


def _id_bytes(user_id: UserId) -> bytes:
    if isinstance(user_id, str):
        return b"s" + user_id.encode("utf-8")
    if isinstance(user_id, bytes):
        return b"b" + user_id
    if isinstance(user_id, bool):
        raise ParameterError(f"user_id must be an int, str or bytes, got {user_id!r}")
    try:
        return b"i" + str(operator.index(user_id)).encode("ascii")
    except TypeError:
        raise ParameterError(
            f"user_id must be an int, str or bytes, got {type(user_id).__name__}"
        ) from None


def _key(tag: bytes, payload: bytes) -> tuple[int, int]:
    digest = hashlib.sha256(tag + payload).digest()
    return int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:16], "little")


@dataclass(frozen=True, kw_only=True)
class CompressedRR:
    """Codec for compressed randomized response of 0/1 rows of length ``n`` (module docstring).

    ``epsilon`` is the final privacy parameter of a message (per item; RR runs at
    ``epsilon/(2·alpha)``), ``chunks`` the public number of chunks, ``public_seed`` the seed of
    the public permutation and shared randomness (an integer in ``[0, 2**256)``; store it with
    the release). ``alpha > 1`` is the PPR parameter (2 by default: larger alpha spends more of
    ``epsilon`` on PPR and less on RR; alpha < 2 has a heavy-tailed index, see docs).
    ``method`` picks the PPR procedure and ``max_chunk_log_ratio`` bounds ``ε_RR`` times the
    number of a person's items in one chunk (the encoder's work grows like its exponential).

    >>> codec = CompressedRR(n=1000, epsilon=1.0, chunks=5, public_seed=7)
    >>> message = codec.encode([3, 141, 592], user_id=42, rng=np.random.default_rng(0))
    >>> decoded = codec.decode(message, user_id=42)
    >>> decoded.shape, decoded.dtype.name
    ((1000,), 'bool')
    >>> bool(np.all(codec.decode_entries(message, [3, 141], user_id=42) == decoded[[3, 141]]))
    True
    """

    n: int
    epsilon: float
    chunks: int
    public_seed: int
    alpha: float = 2.0
    code: elias.Code = "gamma"
    method: ppr.Method = "complete"
    max_chunk_log_ratio: float = 14.0

    def __post_init__(self) -> None:
        _check_int(self.n, "n", 1, 2**40)
        _check_epsilon(self.epsilon)
        _check_int(self.chunks, "chunks", 1, int(self.n))
        _check_int(self.public_seed, "public_seed", 0, 2**256 - 1)
        ppr._check_alpha(self.alpha)
        if self.code not in ("gamma", "delta"):
            raise ParameterError(f"code must be 'gamma' or 'delta', got {self.code!r}")
        if self.method not in ("complete", "enumerate"):
            raise ParameterError(f"method must be 'complete' or 'enumerate', got {self.method!r}")
        _check_epsilon(self.max_chunk_log_ratio, "max_chunk_log_ratio")

    # --- public parameters -----------------------------------------------------------------

    @cached_property
    def _flip_threshold(self) -> int:
        """Coordinates are 1 iff their 53-bit uniform is below this (rounded so ε only shrinks)."""
        target = self.epsilon / (2.0 * self.alpha)
        threshold = math.ceil(_UNIFORM_SCALE / (1.0 + math.exp(target)))
        while math.log((_UNIFORM_SCALE - threshold) / threshold) > target:
            threshold += 1
        return threshold

    @property
    def flip_probability(self) -> float:
        """Probability that a zero is reported as a one (and a one as a zero)."""
        return self._flip_threshold / _UNIFORM_SCALE

    @property
    def epsilon_rr(self) -> float:
        """The randomized-response parameter actually used: ``<= epsilon / (2 alpha)``."""
        threshold = self._flip_threshold
        return math.log((_UNIFORM_SCALE - threshold) / threshold)

    @cached_property
    def _starts(self) -> npt.NDArray[np.int64]:
        """Chunk ``q`` holds the permuted positions ``[starts[q], starts[q+1])``."""
        return (np.arange(self.chunks + 1, dtype=np.int64) * self.n) // self.chunks

    @cached_property
    def _position(self) -> npt.NDArray[np.int64]:
        """``φ``: the public permutation, item -> position (sort of Philox words; seed only)."""
        key = _key(_PERMUTATION_TAG, _seed_bytes(self.public_seed))
        words = philox4x64((np.arange(self.n, dtype=np.uint64), 0, 0, 1), key)[0]
        position = np.empty(self.n, dtype=np.int64)
        position[np.argsort(words, kind="stable")] = np.arange(self.n)
        return position

    @cached_property
    def _layout(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.intp]]:
        """Groups of 4 consecutive offsets per chunk (one Philox call each), and which of their
        ``4 * groups`` words are real positions (in position order)."""
        sizes = np.diff(self._starts)
        per_chunk = -(-sizes // 4)
        chunk = np.repeat(np.arange(self.chunks, dtype=np.int64), per_chunk)
        group = np.arange(chunk.size) - np.repeat(np.cumsum(per_chunk) - per_chunk, per_chunk)
        offset = 4 * group[:, None] + np.arange(4)[None, :]
        valid = np.flatnonzero((offset < sizes[chunk][:, None]).ravel())
        return chunk, group, valid

    def _chunk_of(self, position: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        return np.searchsorted(self._starts, position, side="right") - 1

    def _user_keys(self, user_ids: Sequence[UserId]) -> tuple[npt.NDArray[np.uint64], ...]:
        seed = _seed_bytes(self.public_seed)
        keys = np.array([_key(_KEY_TAG, seed + _id_bytes(u)) for u in user_ids], dtype=np.uint64)
        keys = keys.reshape(-1, 2)  # also when there are no users
        return keys[:, 0].copy(), keys[:, 1].copy()

    def _candidate_bits(
        self,
        key0: npt.NDArray[np.uint64],
        key1: npt.NDArray[np.uint64],
        chunk: npt.NDArray[np.int64],
        rank: npt.NDArray[np.int64],
        offset: npt.NDArray[np.int64],
    ) -> BoolArray:
        """Coordinate ``offset`` of candidate ``rank`` of ``chunk`` in each user's stream."""
        words = philox4x64(
            (
                (offset >> 2).astype(np.uint64),
                rank.astype(np.uint64),
                chunk.astype(np.uint64),
                _CANDIDATE_DOMAIN,
            ),
            (key0, key1),
        )
        word = np.choose(offset & 3, words)
        return uniform53(word) < np.uint64(self._flip_threshold)

    # --- encoding (Alg. 1 and 3) -----------------------------------------------------------

    def encode(
        self,
        items: Iterable[int] | npt.ArrayLike,
        *,
        user_id: UserId,
        rng: np.random.Generator | None = None,
    ) -> bytes:
        """The message for one person holding ``items`` (indices of their ones; repeats ignored).

        ``rng`` is the encoder's private randomness (None: a fresh CSPRNG; pass a seeded
        generator only for reproducible tests).
        """
        return self.encode_many([items], user_ids=[user_id], rng=rng)[0]

    def encode_many(
        self,
        items_per_person: Sequence[Iterable[int] | npt.ArrayLike],
        *,
        user_ids: Sequence[UserId],
        rng: np.random.Generator | None = None,
    ) -> list[bytes]:
        """Messages for many persons at once (vectorized over persons and chunks)."""
        if len(items_per_person) != len(user_ids):
            raise ParameterError(
                f"user_ids must have one id per person: {len(user_ids)} ids for "
                f"{len(items_per_person)} persons"
            )
        rows = [
            items if isinstance(items, np.ndarray) else np.asarray(list(items))  # type: ignore[arg-type]
            for items in items_per_person
        ]
        rows = [row if row.size else np.zeros(0, dtype=np.int64) for row in rows]
        lengths = np.array([row.size for row in rows], dtype=np.int64)
        person = np.repeat(np.arange(len(rows), dtype=np.int64), lengths)
        flat = np.concatenate([np.zeros(0, dtype=np.int64), *(row.ravel() for row in rows)])
        if any(row.ndim != 1 for row in rows if row.size):
            raise ParameterError("items must be one-dimensional collections of integer indices")
        return self.encode_pairs(person, flat, user_ids=user_ids, rng=rng)

    def encode_pairs(
        self,
        persons: npt.ArrayLike,
        items: npt.ArrayLike,
        *,
        user_ids: Sequence[UserId],
        rng: np.random.Generator | None = None,
    ) -> list[bytes]:
        """Messages from a long table: row ``j`` says person ``persons[j]`` (an index into
        ``user_ids``) has item ``items[j]``. Persons without rows get the message of an empty
        set; duplicate rows count once."""
        return self._encode(persons, items, user_ids, rng)[0]

    def _encode(
        self,
        persons: npt.ArrayLike,
        items: npt.ArrayLike,
        user_ids: Sequence[UserId],
        rng: np.random.Generator | None,
    ) -> tuple[list[bytes], npt.NDArray[np.int64]]:
        """Messages and the PPR points generated per (person, chunk)."""
        count = len(user_ids)
        person = np.asarray(persons)
        item = np.asarray(items)
        if person.shape != item.shape or person.ndim != 1:
            raise ParameterError("persons and items must be one-dimensional and of equal length")
        for name, values, limit in (("items", item, self.n), ("persons", person, count)):
            if values.size and not np.issubdtype(values.dtype, np.integer):
                raise ParameterError(f"{name} must be integer indices")
            if values.size and (int(values.min()) < 0 or int(values.max()) >= limit):
                raise ParameterError(f"{name} must be integer indices in [0, {limit})")
        pair = np.unique(person.astype(np.int64) * self.n + item.astype(np.int64))
        person, item = pair // self.n, pair % self.n
        m = self.chunks
        position = self._position[item]
        chunk = self._chunk_of(position)
        instance = person * m + chunk
        order = np.argsort(instance, kind="stable")
        instance, offset = instance[order], (position - self._starts[chunk])[order]
        load = np.bincount(instance, minlength=count * m)
        epsilon_rr = self.epsilon_rr
        if load.size and epsilon_rr * int(load.max()) > self.max_chunk_log_ratio:
            raise ParameterError(
                "items: too many of one person's items fall into a single chunk "
                f"(epsilon_rr * load > max_chunk_log_ratio={self.max_chunk_log_ratio}); "
                "use more chunks"
            )
        rng = resolve_rng(rng)
        key0, key1 = self._user_keys(user_ids)
        first = np.cumsum(load) - load
        messages: list[bytes] = []
        points = np.zeros((count, m), dtype=np.int64)
        batch = max(1, _BATCH_INSTANCES // m)
        for begin in range(0, count, batch):
            end = min(count, begin + batch)
            lo, hi = begin * m, end * m
            base = int(first[lo]) if lo < first.size else 0
            batch_load = load[lo:hi]
            indices, work = self._encode_batch(
                batch_load,
                offset[base : base + int(batch_load.sum())],
                key0[begin:end],
                key1[begin:end],
                rng,
            )
            messages.extend(elias.encode_rows(indices, code=self.code))
            points[begin:end] = work
        return messages, points

    def _encode_batch(
        self,
        load: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.int64],
        key0: npt.NDArray[np.uint64],
        key1: npt.NDArray[np.uint64],
        rng: np.random.Generator,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """PPR indices of the chunks of consecutive persons; ``offsets`` lists each (person,
        chunk) instance's in-chunk offsets of the person's items, instance by instance."""
        m = self.chunks
        count = key0.size
        first = np.cumsum(load) - load
        epsilon_rr = self.epsilon_rr

        def log_ratio(
            instances: npt.NDArray[np.int64], ranks: npt.NDArray[np.int64]
        ) -> npt.NDArray[np.float64]:
            """Alg. 3: ``ε_RR (2·#ones - load)`` over the person's items in the chunk."""
            per = load[instances]
            pair = np.repeat(np.arange(instances.size), per)
            within = np.arange(pair.size) - np.repeat(np.cumsum(per) - per, per)
            owner = instances[pair] // m
            bits = self._candidate_bits(
                key0[owner],
                key1[owner],
                instances[pair] % m,
                ranks[pair],
                offsets[first[instances[pair]] + within],
            )
            ones = np.bincount(pair, weights=bits, minlength=instances.size)
            return epsilon_rr * (2.0 * ones - per)

        result = ppr.encode(
            log_ratio, epsilon_rr * load, alpha=self.alpha, rng=rng, method=self.method
        )
        return result.indices.reshape(count, m), result.points.reshape(count, m)

    # --- decoding (Alg. 2) -----------------------------------------------------------------

    def unpack(self, message: bytes) -> npt.NDArray[np.uint64]:
        """The ``chunks`` PPR indices in a message (ParameterError if it is malformed)."""
        return self._unpack_many([message])[0]

    def _unpack_many(self, messages: Sequence[bytes]) -> npt.NDArray[np.uint64]:
        for message in messages:
            if not isinstance(message, bytes | bytearray | memoryview):
                raise ParameterError(f"message must be bytes, got {type(message).__name__}")
        return elias.decode_many(messages, self.chunks, code=self.code)

    def decode(self, message: bytes, *, user_id: UserId) -> BoolArray:
        """The person's randomized-response row: a bool array of length ``n``."""
        return self.decode_many([message], user_ids=[user_id])[0]

    def decode_many(self, messages: Sequence[bytes], *, user_ids: Sequence[UserId]) -> BoolArray:
        """Rows of many persons, shape ``(len(messages), n)``."""
        out = np.zeros((len(messages), self.n), dtype=bool)
        for begin, end, rows in self._decoded_batches(messages, user_ids):
            out[begin:end] = rows
        return out

    def noisy_counts(
        self, messages: Sequence[bytes], *, user_ids: Sequence[UserId]
    ) -> npt.NDArray[np.int64]:
        """Per item, how many decoded rows have a one (input of :func:`item_popularity`)."""
        counts = np.zeros(self.n, dtype=np.int64)
        for _, _, rows in self._decoded_batches(messages, user_ids):
            counts += rows.sum(axis=0)
        return counts

    def _decoded_batches(self, messages: Sequence[bytes], user_ids: Sequence[UserId]):
        if len(messages) != len(user_ids):
            raise ParameterError(
                f"user_ids must have one id per message: {len(user_ids)} ids for "
                f"{len(messages)} messages"
            )
        chunk, group, valid = self._layout
        batch = max(1, _DECODE_BATCH_WORDS // max(1, chunk.size))
        for begin in range(0, len(messages), batch):
            end = min(len(messages), begin + batch)
            indices = self._unpack_many(messages[begin:end])
            key0, key1 = self._user_keys(user_ids[begin:end])
            words = philox4x64(
                (
                    group.astype(np.uint64)[None, :],
                    indices[:, chunk],
                    chunk.astype(np.uint64)[None, :],
                    _CANDIDATE_DOMAIN,
                ),
                (key0[:, None], key1[:, None]),
            )
            by_position = np.stack(words, axis=-1).reshape(end - begin, -1)[:, valid]
            bits = uniform53(by_position) < np.uint64(self._flip_threshold)
            yield begin, end, bits[:, self._position]

    def decode_entries(
        self, message: bytes, indices: npt.ArrayLike, *, user_id: UserId
    ) -> BoolArray:
        """Entries ``indices`` of the decoded row, one Philox call each (after parsing)."""
        wanted = np.asarray(indices)
        if wanted.size and (not np.issubdtype(wanted.dtype, np.integer)):
            raise ParameterError("indices must be integers")
        wanted = wanted.astype(np.int64)
        if wanted.size and (int(wanted.min()) < 0 or int(wanted.max()) >= self.n):
            raise ParameterError(f"indices must be in [0, n={self.n})")
        ppr_indices = self.unpack(message)
        position = self._position[wanted.ravel()]
        chunk = self._chunk_of(position)
        key0, key1 = self._user_keys([user_id])
        bits = self._candidate_bits(
            key0, key1, chunk, ppr_indices[chunk].astype(np.int64), position - self._starts[chunk]
        )
        return bits.reshape(wanted.shape)

    # --- estimators bound to this codec ------------------------------------------------------

    def item_popularity(
        self, noisy_counts: npt.ArrayLike, persons: int, *, confidence: float = 0.95
    ) -> PopularityEstimate:
        """:func:`item_popularity` at this codec's ``epsilon_rr``."""
        return item_popularity(
            noisy_counts, persons, epsilon_rr=self.epsilon_rr, confidence=confidence
        )

    def common_items(
        self, decoded_a: npt.ArrayLike, decoded_b: npt.ArrayLike
    ) -> CommonItemsEstimate:
        """:func:`common_items` at this codec's ``epsilon_rr``."""
        return common_items(decoded_a, decoded_b, epsilon_rr=self.epsilon_rr)


# --- estimators: the decoded rows are exactly RR (PPR Prop. 4.2), so RR debiasing applies --------


@dataclass(frozen=True)
class PopularityEstimate:
    """Unbiased per-item counts of ones, with a normal-approximation interval.

    ``std_error`` is exact (it does not depend on the data for binary RR); ``lower``/``upper``
    are ``estimate ± z·std_error`` intersected with ``[0, persons]``.
    """

    estimate: npt.NDArray[np.float64]
    std_error: float
    lower: npt.NDArray[np.float64]
    upper: npt.NDArray[np.float64]
    confidence: float


@dataclass(frozen=True)
class CommonItemsEstimate:
    """Unbiased estimate of ``|A ∩ B|`` and a plug-in standard error."""

    estimate: float
    std_error: float


def _noise_variance(epsilon_rr: float) -> tuple[float, float, float]:
    """``(keep, flip, σ²)``: σ² = keep·flip/(keep-flip)² is the variance of one debiased bit."""
    keep, flip = rr_probabilities(epsilon_rr)
    return keep, flip, keep * flip / (keep - flip) ** 2


def item_popularity(
    noisy_counts: npt.ArrayLike, persons: int, *, epsilon_rr: float, confidence: float = 0.95
) -> PopularityEstimate:
    """How many persons have each item, from ``noisy_counts`` = ones per item over ``persons``
    decoded rows: ``(C - N·flip)/(keep - flip)``, variance ``N·keep·flip/(keep-flip)²``."""
    counts = np.asarray(noisy_counts, dtype=float)
    persons = _check_int(persons, "persons", 0)
    confidence = float(confidence)
    if not 0.0 < confidence < 1.0:
        raise ParameterError(f"confidence must be in (0, 1), got {confidence!r}")
    if np.any(counts < 0) or np.any(counts > persons):
        raise ParameterError("noisy_counts must lie in [0, persons]")
    keep, flip, variance = _noise_variance(epsilon_rr)
    estimate = (counts - persons * flip) / (keep - flip)
    std_error = math.sqrt(persons * variance)
    half = NormalDist().inv_cdf(0.5 + confidence / 2.0) * std_error
    lower = np.clip(estimate - half, 0.0, persons)
    upper = np.clip(estimate + half, 0.0, persons)
    return PopularityEstimate(estimate, std_error, lower, upper, confidence)


def _as_rows(decoded: npt.ArrayLike, name: str) -> npt.NDArray[np.float64]:
    array = np.asarray(decoded)
    if array.dtype != bool and not np.all((array == 0) | (array == 1)):
        raise ParameterError(f"{name} must hold 0/1 values")
    return array.astype(float)


def common_items(
    decoded_a: npt.ArrayLike, decoded_b: npt.ArrayLike, *, epsilon_rr: float
) -> CommonItemsEstimate:
    """Unbiased number of items two persons share: ``Σ_i x̂_a,i x̂_b,i`` with
    ``x̂ = (y - flip)/(keep - flip)`` (independent noise makes the product unbiased).

    Variance ``n σ⁴ + σ² (d_a + d_b)``; the standard error plugs in the estimated ``d``.
    """
    a = _as_rows(decoded_a, "decoded_a")
    b = _as_rows(decoded_b, "decoded_b")
    if a.ndim != 1 or a.shape != b.shape:
        raise ParameterError(f"decoded rows must be 1-D of equal length, got {a.shape}, {b.shape}")
    keep, flip, variance = _noise_variance(epsilon_rr)
    gap = keep - flip
    ones_a, ones_b, both, n = a.sum(), b.sum(), float(a @ b), a.size
    estimate = (both - flip * (ones_a + ones_b) + n * flip * flip) / (gap * gap)
    d_a = max(0.0, (ones_a - n * flip) / gap)
    d_b = max(0.0, (ones_b - n * flip) / gap)
    std_error = math.sqrt(n * variance**2 + variance * (d_a + d_b))
    return CommonItemsEstimate(float(estimate), std_error)


def common_items_matrix(decoded: npt.ArrayLike, *, epsilon_rr: float) -> npt.NDArray[np.float64]:
    """:func:`common_items` for every pair of rows of a ``(persons, n)`` array (diagonal: not an
    estimate of ``d``, since a row's noise is not independent of itself)."""
    rows = _as_rows(decoded, "decoded")
    if rows.ndim != 2:
        raise ParameterError(f"decoded must be two-dimensional, got shape {rows.shape}")
    keep, flip, _ = _noise_variance(epsilon_rr)
    ones = rows.sum(axis=1)
    both = rows @ rows.T
    n = rows.shape[1]
    return (both - flip * (ones[:, None] + ones[None, :]) + n * flip * flip) / (keep - flip) ** 2
