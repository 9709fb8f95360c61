"""Publishing: charge first, then read the table, cap each person's items, encode and store
(``publish_rr``)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd

from dpsql.engine.backends import Backend
from dpsql.engine.progress import DONE, READING_DATA, Progress, no_progress
from dpsql.engine.publishing.plan import MECHANISM, ReleasePlan, UserId, _check_name, plan_release
from dpsql.engine.publishing.store import (
    PublishedRelease,
    _open_writable,
    _quote,
    _refuse_existing,
    _write_release,
)
from dpsql.engine.session import Session

__all__ = [
    "publish_rr",
]

def _read_rows(
    backend: Backend, plan: ReleasePlan
) -> tuple[list[UserId], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The table's units (sorted) and its distinct (person, item index) pairs in the universe.

    Units with no item in the universe are listed with no pairs; NULL units and items are dropped.
    """
    table, unit, item = _quote(plan.table), _quote(plan.unit), _quote(plan.item)
    unit_value = f"CAST({unit} AS {'BIGINT' if plan.unit_kind == 'integer' else 'VARCHAR'})"
    units = backend.run(
        f"SELECT DISTINCT {unit_value} AS __unit FROM {table} WHERE {unit} IS NOT NULL "
        "ORDER BY __unit"
    )["__unit"]
    universe = plan.universe
    if universe.source == "bounds":
        low, high = universe.low, universe.low + universe.size - 1
        pairs = backend.run(
            f"SELECT DISTINCT {unit_value} AS __unit, "
            f"CAST(CAST({item} AS HUGEINT) - ({low}) AS BIGINT) AS __index FROM {table} "
            f"WHERE {unit} IS NOT NULL AND {item} BETWEEN ({low}) AND ({high})"
        )
        index = pairs["__index"].to_numpy(dtype=np.int64)
    else:
        pairs = backend.run(
            f"SELECT DISTINCT {unit_value} AS __unit, CAST({item} AS VARCHAR) AS __item "
            f"FROM {table} WHERE {unit} IS NOT NULL AND {item} IS NOT NULL"
        )
        keys = pd.Index([str(key) for key in universe.keys])
        index = keys.get_indexer(pairs["__item"].astype(str)).astype(np.int64)
    person = pd.Index(units).get_indexer(pairs["__unit"]).astype(np.int64)
    inside = index >= 0
    user_ids: list[UserId] = (
        [int(u) for u in units] if plan.unit_kind == "integer" else [str(u) for u in units]
    )
    return user_ids, person[inside], index[inside]


def _cap_items(
    person: npt.NDArray[np.int64],
    item: npt.NDArray[np.int64],
    cap: int,
    rng: np.random.Generator,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Keep a uniformly random subset of at most ``cap`` of each person's (distinct) items.

    The subset depends only on the person's own items and fresh private randomness, so capping is
    a per-person randomized map into sets of size <= cap (docs/publish.md, "cap").
    """
    order = np.lexsort((rng.random(person.size), person))
    person, item = person[order], item[order]
    first = np.ones(person.size, dtype=bool)
    first[1:] = person[1:] != person[:-1]
    index = np.arange(person.size)
    rank = index - np.maximum.accumulate(np.where(first, index, 0))
    keep = rank < cap
    return person[keep], item[keep]


def publish_rr(
    database: str | Path,
    *,
    analyst: str,
    table: str,
    unit: str,
    item: str,
    epsilon: float,
    name: str,
    chunks: int | None = None,
    alpha: float = 2.0,
    max_items: int | None = None,
    progress: Progress | None = None,
) -> PublishedRelease:
    """Publish every person's item set of ``table`` with compressed randomized response.

    ``epsilon`` is the person-level cost charged to ``analyst`` (replace-one-person; the set of
    units is published): each item costs ``epsilon / min(2·max_items, n)``. The item universe
    comes from the policy (``public_keys`` or integer ``bounds`` of ``item``), ``max_items``
    defaults to the table's ``max_rows_per_unit``, ``chunks`` to a choice from those public
    values. Checks, then charges, then reads, encodes and stores (module docstring). The session's
    secure generator draws the public seed, the cap's subsets and the encoder's noise.
    ``progress`` (``dpsql.engine.progress``) is told the stages after the charge.
    """
    report = progress if progress is not None else no_progress
    name = _check_name(name)
    # Fail before the charge if the file cannot be written (e.g. another process has it open).
    _open_writable(database).close()
    with Session(database, analyst=analyst) as session:
        catalog = session.backend.catalog()
        plan = plan_release(
            session.policy,
            catalog,
            name=name,
            table=table,
            unit=unit,
            item=item,
            epsilon=epsilon,
            chunks=chunks,
            alpha=alpha,
            max_items=max_items,
        )
        _refuse_existing(session.backend, plan.name)
        entry = session.charge(
            plan.event(), query=plan.description, plan=plan.summary(), mechanism=MECHANISM
        )
        public_seed = int.from_bytes(session.rng.bytes(32), "big")
        codec = plan.codec(public_seed)
        report(READING_DATA, None)
        user_ids, person, index = _read_rows(session.backend, plan)
        person, index = _cap_items(person, index, plan.max_items, session.rng)
        messages: list[bytes] = []
        report("encoding messages", None)
        if user_ids:  # the codec cannot encode zero persons (IndexError in _user_keys)
            messages = codec.encode_pairs(person, index, user_ids=user_ids, rng=session.rng)
    release = PublishedRelease(
        name=plan.name,
        table=plan.table,
        unit=plan.unit,
        item=plan.item,
        unit_kind=plan.unit_kind,
        universe=plan.universe,
        persons=len(user_ids),
        epsilon=entry.cost.epsilon,
        delta=entry.cost.delta,
        epsilon_per_item=plan.epsilon_per_item,
        epsilon_rr=codec.epsilon_rr,
        max_items=plan.max_items,
        hamming_bound=plan.hamming_bound,
        chunks=plan.chunks,
        alpha=plan.alpha,
        code=codec.code,
        public_seed=public_seed,
        message_bytes=sum(len(m) for m in messages),
        analyst=analyst,
        ledger_entry=entry.seq,
        created=dt.datetime.now(dt.UTC).isoformat(timespec="microseconds"),
    )
    report("storing the release", None)
    _write_release(database, release, user_ids, messages)
    report(DONE, 1.0)
    return release
