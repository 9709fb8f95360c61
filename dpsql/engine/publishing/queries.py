"""Queries on a stored release (post-processing, zero-cost ledger entries): item popularity,
common items and decoded rows."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from dpsql.accountant.events import PostProcessingEvent
from dpsql.accountant.ledger import LedgerEntry
from dpsql.engine.backends import Backend
from dpsql.engine.publishing.plan import MECHANISM, POST_PROCESSING, Item, UserId
from dpsql.engine.publishing.store import PublishedRelease, T, _find, _quote, _string
from dpsql.engine.session import Session
from dpsql.errors import ParameterError
from dpsql.mechanisms.compressed_rr import (
    common_items,
    item_popularity,
)

__all__ = [
    "UNCLIPPED",
    "CommonItemsResult",
    "DecodedRow",
    "PopularityResult",
    "release_common_items",
    "release_decode",
    "release_popularity",
]

UNCLIPPED = (
    "unbiased, unclipped: a randomized-response estimate may fall below 0 or above the persons "
    "who could hold the item (so sums and means of estimates stay unbiased); a popularity "
    "interval is clipped to [0, persons], the truth's range, so such an estimate lies outside "
    "its interval; clip it yourself for display"
)
"""What every randomized-response estimate says about its range."""


@dataclass(frozen=True)
class PopularityResult:
    """Unbiased counts of persons holding each item (among their <= D published items).

    ``lower``/``upper`` are per-item normal intervals at ``confidence`` (not adjusted for picking
    the top ``k``); ``std_error`` is the same for every item (binary RR).
    """

    release: str
    items: list[Item]
    estimate: npt.NDArray[np.float64]
    lower: npt.NDArray[np.float64]
    upper: npt.NDArray[np.float64]
    std_error: float
    confidence: float
    persons: int
    ledger_entry: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "release": self.release,
            "columns": ["item", "estimate"],
            "rows": [[i, float(e)] for i, e in zip(self.items, self.estimate, strict=True)],
            "intervals": {
                "estimate": [
                    [float(a), float(b)] for a, b in zip(self.lower, self.upper, strict=True)
                ]
            },
            "std_error": self.std_error,
            "confidence": self.confidence,
            "estimates": UNCLIPPED,
            "persons": self.persons,
            "epsilon_spent": 0.0,
            "delta_spent": 0.0,
            "ledger_entry": self.ledger_entry,
        }


@dataclass(frozen=True)
class CommonItemsResult:
    """Unbiased estimate of how many items two persons share, with its standard error."""

    release: str
    person_a: UserId
    person_b: UserId
    estimate: float
    std_error: float
    ledger_entry: int

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "estimates": UNCLIPPED, "epsilon_spent": 0.0, "delta_spent": 0.0}


@dataclass(frozen=True)
class DecodedRow:
    """A person's decoded randomized-response row: exactly RR at the release's ``epsilon_rr``."""

    release: str
    person: UserId
    row: npt.NDArray[np.bool_]
    items: list[Item]
    ledger_entry: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "release": self.release,
            "person": self.person,
            "items": self.items,
            "ones": len(self.items),
            "n": int(self.row.size),
            "epsilon_spent": 0.0,
            "delta_spent": 0.0,
            "ledger_entry": self.ledger_entry,
        }


def _person_id(release: PublishedRelease, value: object) -> UserId:
    """A person id of the release's kind (an int, or a str of digits, for integer units)."""
    if release.unit_kind == "string":
        if not isinstance(value, str):
            raise ParameterError(f"person must be a string id, got {value!r}")
        return value
    try:
        if isinstance(value, str):
            return int(value.strip())
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ParameterError(f"person must be an integer id, got {value!r}") from None


def _messages(
    backend: Backend, release: PublishedRelease, persons: Sequence[UserId] | None = None
) -> tuple[list[UserId], list[bytes]]:
    """Stored (user id, message) pairs: all, or those of ``persons`` (each must be present)."""
    where = ""
    if persons is not None:
        literals = [str(p) if release.unit_kind == "integer" else _string(str(p)) for p in persons]
        where = f" WHERE user_id IN ({', '.join(literals)})"
    frame = backend.run(
        f"SELECT user_id, message FROM {_quote(release.storage_table)}{where} ORDER BY user_id"
    )
    ids: list[UserId] = [
        int(u) if release.unit_kind == "integer" else str(u) for u in frame["user_id"]
    ]
    messages = [bytes(m) for m in frame["message"]]
    if persons is not None:
        found = set(ids)
        for person in persons:
            if person not in found:
                raise ParameterError(f"person {person!r} is not in release {release.name!r}")
    return ids, messages


def _source(release: PublishedRelease) -> str:
    return f"{MECHANISM} release {release.name!r} (ledger entry {release.ledger_entry})"


def _post_process(
    database: str | Path,
    *,
    analyst: str,
    name: str,
    label: str,
    compute: Callable[[Session, PublishedRelease], T],
) -> tuple[T, LedgerEntry]:
    """Compute from the stored release only, then record a zero-cost entry naming it."""
    with Session(database, analyst=analyst) as session:
        release = _find(session.backend, name)
        value = compute(session, release)
        entry = session.charge(
            PostProcessingEvent(source=_source(release), label=label),
            query=f"rr {label} {release.name}",
            plan={"release": release.name, "source_entry": release.ledger_entry, "query": label},
            mechanism=POST_PROCESSING,
        )
    return value, entry


def release_popularity(
    database: str | Path,
    *,
    analyst: str,
    name: str,
    top_k: int | None = None,
    confidence: float | None = None,
) -> PopularityResult:
    """Unbiased per-item counts over the release (notes S5), all items in universe order or the
    ``top_k`` largest estimates; ``confidence`` defaults to the policy's. Free (post-processing).
    """
    if top_k is not None and (
        isinstance(top_k, bool) or not isinstance(top_k, int | np.integer) or top_k < 1
    ):
        raise ParameterError(f"top_k must be an integer >= 1, got {top_k!r}")

    def compute(session: Session, release: PublishedRelease) -> PopularityResult:
        level = session.policy.dataset.confidence if confidence is None else confidence
        ids, messages = _messages(session.backend, release)
        counts = release.codec.noisy_counts(messages, user_ids=ids)
        estimate = item_popularity(
            counts, len(ids), epsilon_rr=release.epsilon_rr, confidence=level
        )
        if top_k is None:
            order = np.arange(release.universe.size)
        else:
            order = np.argsort(-estimate.estimate, kind="stable")[: int(top_k)]
        return PopularityResult(
            release=release.name,
            items=release.universe.items(order),
            estimate=estimate.estimate[order],
            lower=estimate.lower[order],
            upper=estimate.upper[order],
            std_error=estimate.std_error,
            confidence=estimate.confidence,
            persons=len(ids),
            ledger_entry=0,
        )

    result, entry = _post_process(
        database, analyst=analyst, name=name, label="popularity", compute=compute
    )
    return dataclasses.replace(result, ledger_entry=entry.seq)


def _decoded(
    backend: Backend, release: PublishedRelease, persons: Sequence[object]
) -> tuple[list[UserId], dict[UserId, npt.NDArray[np.bool_]]]:
    """The persons' ids as given, and their decoded rows (each person decoded once)."""
    wanted = [_person_id(release, p) for p in persons]
    ids, messages = _messages(backend, release, list(dict.fromkeys(wanted)))
    rows = release.codec.decode_many(messages, user_ids=ids)
    return wanted, dict(zip(ids, rows, strict=True))


def release_common_items(
    database: str | Path,
    *,
    analyst: str,
    name: str,
    pairs: Sequence[tuple[object, object]],
) -> list[CommonItemsResult]:
    """For each pair of distinct persons, an unbiased estimate of how many items they share
    (``Σ_i x̂_a,i x̂_b,i``, notes S5) and its standard error. Free (post-processing)."""
    pairs = list(pairs)
    if not pairs:
        raise ParameterError("pairs must name at least one pair of persons")

    def compute(session: Session, release: PublishedRelease) -> list[CommonItemsResult]:
        flat = [p for pair in pairs for p in pair]
        wanted, rows = _decoded(session.backend, release, flat)
        results = []
        for a, b in zip(wanted[0::2], wanted[1::2], strict=True):
            if a == b:
                raise ParameterError(
                    f"common items need two different persons, got {a!r} twice (a row's noise "
                    "is not independent of itself)"
                )
            estimate = common_items(rows[a], rows[b], epsilon_rr=release.epsilon_rr)
            results.append(
                CommonItemsResult(release.name, a, b, estimate.estimate, estimate.std_error, 0)
            )
        return results

    for pair in pairs:
        if len(pair) != 2:
            raise ParameterError(f"each pair must hold two persons, got {pair!r}")
    results, entry = _post_process(
        database, analyst=analyst, name=name, label="common_items", compute=compute
    )
    return [dataclasses.replace(r, ledger_entry=entry.seq) for r in results]


def release_decode(
    database: str | Path, *, analyst: str, name: str, persons: Sequence[object]
) -> list[DecodedRow]:
    """The decoded (noisy) rows of ``persons``: exactly randomized response of their published
    item sets at the release's ``epsilon_rr``. Free (post-processing)."""
    persons = list(persons)
    if not persons:
        raise ParameterError("persons must name at least one person")

    def compute(session: Session, release: PublishedRelease) -> list[DecodedRow]:
        wanted, rows = _decoded(session.backend, release, persons)
        return [
            DecodedRow(release.name, p, rows[p], release.universe.items(np.flatnonzero(rows[p])), 0)
            for p in wanted
        ]

    rows, entry = _post_process(
        database, analyst=analyst, name=name, label="decode", compute=compute
    )
    return [dataclasses.replace(r, ledger_entry=entry.seq) for r in rows]
