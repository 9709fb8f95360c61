"""Planning a compressed-RR publication from the policy alone: the public item universe, the
cap, the chunks and the charged epsilon and delta (see ``dpsql.engine.publishing``)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from dpsql.accountant.events import MechanismEvent
from dpsql.accountant.units import check_budget_value
from dpsql.engine.policy import ColumnPolicy, Policy
from dpsql.errors import ParameterError, PolicyError
from dpsql.mechanisms.compressed_rr import (
    CompressedRR,
    suggest_chunks,
)
from dpsql.sql.shape import ColumnKind

__all__ = [
    "DELTA_TARGET",
    "FORMAT",
    "INDEX_LIMIT_LOG2",
    "MAX_CHUNK_LOG_RATIO",
    "MAX_DELTA",
    "MAX_UNIVERSE",
    "MECHANISM",
    "POST_PROCESSING",
    "RELEASES_TABLE",
    "TABLE_PREFIX",
    "Item",
    "ItemUniverse",
    "ReleasePlan",
    "UserId",
    "overflow_delta",
    "plan_release",
]

RELEASES_TABLE = "dpsql_rr_releases"
"""One row per stored release: its public parameters."""


TABLE_PREFIX = "dpsql_rr_"


MECHANISM = "compressed_rr"


POST_PROCESSING = "post_processing"


FORMAT = "compressed_rr.v1"


MAX_UNIVERSE = 1 << 24
"""Largest item universe accepted (the codec keeps an n-entry permutation in memory)."""


MAX_CHUNK_LOG_RATIO = 8.0
"""Largest ``L = ε_RR · min(D, chunk size)`` (the log of the worst chunk's ``r*``) allowed:
bounds the encoder's work (about ``e^L`` points in the worst chunk) and keeps the codec's own
crowded-chunk refusal (at 14) unreachable. δ usually forces a smaller L."""


DELTA_TARGET = 1e-10
"""The automatic chunk choice adds chunks until the charged δ is at most this."""


MAX_DELTA = 1e-6
"""Configurations whose δ (:func:`overflow_delta`) exceeds this are refused."""


INDEX_LIMIT_LOG2 = 60
"""The PPR encoder refuses indices that could pass ``2**60`` (``ppr._LOG_RANK_LIMIT``)."""


_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,62}")


_INTEGER_TYPES = {
    "TINYINT",
    "SMALLINT",
    "INTEGER",
    "INT",
    "BIGINT",
    "UTINYINT",
    "USMALLINT",
    "UINTEGER",
    "INT1",
    "INT2",
    "INT4",
    "INT8",
    "LONG",
    "SHORT",
}


UserId = int | str


Item = int | str


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ParameterError(
            f"name must start with a letter and hold at most 63 letters, digits or '_', "
            f"got {name!r}"
        )
    return name


@dataclass(frozen=True)
class ItemUniverse:
    """The public coordinates of the release: item ``keys[i]`` (from ``public_keys``) or
    ``low + i`` (from integer ``bounds``), ``i = 0 … size-1``. Never derived from the data."""

    source: Literal["public_keys", "bounds"]
    size: int
    kind: Literal["integer", "string"]
    low: int = 0
    keys: tuple[Item, ...] = ()

    def items(self, indices: npt.ArrayLike) -> list[Item]:
        """The items at coordinates ``indices``."""
        positions = np.asarray(indices, dtype=np.int64).ravel()
        if self.source == "bounds":
            return [self.low + i for i in positions.tolist()]
        return np.asarray(self.keys, dtype=object)[positions].tolist()

    def to_dict(self, *, with_keys: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {"source": self.source, "size": self.size, "kind": self.kind}
        if self.source == "bounds":
            data["low"] = self.low
        elif with_keys:
            data["keys"] = list(self.keys)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ItemUniverse:
        return cls(
            source=data["source"],
            size=int(data["size"]),
            kind=data["kind"],
            low=int(data.get("low", 0)),
            keys=tuple(data.get("keys", ())),
        )


def _universe(column: str, kind: ColumnKind, rules: ColumnPolicy) -> ItemUniverse:
    """The item universe the policy declares for ``column``; PolicyError if there is none."""
    if kind not in (ColumnKind.INTEGER, ColumnKind.STRING):
        raise PolicyError(
            f"item column {column!r} must be an integer or string column, it is {kind.value}"
        )
    label = "integer" if kind is ColumnKind.INTEGER else "string"
    if rules.public_keys is not None:
        keys: list[Item] = []
        for key in rules.public_keys:
            if kind is ColumnKind.STRING and isinstance(key, str):
                keys.append(key)
            elif (
                kind is ColumnKind.INTEGER
                and isinstance(key, int | float)
                and not isinstance(key, bool)
                and float(key).is_integer()
            ):
                keys.append(int(key))
            else:
                raise PolicyError(
                    f"public key {key!r} of item column {column!r} does not match its type "
                    f"({kind.value})"
                )
        universe = ItemUniverse("public_keys", len(keys), label, keys=tuple(keys))
    elif rules.bounds is not None and kind is ColumnKind.INTEGER:
        low, high = rules.bounds
        if not (float(low).is_integer() and float(high).is_integer()):
            raise PolicyError(
                f"bounds of item column {column!r} must be integers to define its items, "
                f"got [{low}, {high}]"
            )
        universe = ItemUniverse("bounds", int(high) - int(low) + 1, label, low=int(low))
    else:
        raise PolicyError(
            f"item column {column!r} has no public item universe: declare public_keys = [...] "
            "(or, for an integer column, bounds = [low, high]) for it in the policy; "
            "the items of a release are never taken from the data"
        )
    if universe.size > MAX_UNIVERSE:
        raise PolicyError(
            f"item column {column!r} declares {universe.size} items; at most {MAX_UNIVERSE} "
            "are supported"
        )
    return universe


def overflow_delta(
    *, epsilon_per_item: float, alpha: float, chunks: int, n: int, max_items: int
) -> float:
    """δ that the encoder's overflow refusal costs a person (``docs/publish.md``, "δ").

    The completing PPR encoder (notes S2.6) refuses when a contender with ``T > 2**60`` could
    still win, i.e. ``V (T/r*)^α < best <= W_1``. Given the first point the others form a unit
    Poisson process, so a chunk holding ``d`` of the person's items refuses with probability at
    most ``C·G^d``: ``C = Γ(α+1)·2^{-60(α-1)}/(α-1)``, ``G = g·e^{αε}``, ``ε = ε_RR`` and
    ``g = (e^{-αε} + e^{(α+1)ε})/(1+e^ε)`` (so ``g^d = E_Q[r^{-α}]``). Counting the refusal as
    an output, chunk ``q`` is ``(ε_q, p_q(x) + e^{ε_q} p_q(x'))``-DP; over the chunks, with
    ``l = min(D, s)``, ``k = min(2l, s)`` (``s`` = largest chunk) and convexity,
    ``δ <= C·[2(m + (D/l)(G^l - 1)) + G^l·(2D/k)(e^{ε_item·k} - 1)]``.
    """
    epsilon_rr = epsilon_per_item / (2.0 * alpha)
    size = -(-n // chunks)
    load = min(max_items, size)
    spread = min(2 * load, size)
    log_c = math.lgamma(alpha + 1.0) - math.log(alpha - 1.0)
    log_c -= (alpha - 1.0) * INDEX_LIMIT_LOG2 * math.log(2.0)
    log_g = math.log(
        (math.exp(-alpha * epsilon_rr) + math.exp((alpha + 1.0) * epsilon_rr))
        / (1.0 + math.exp(epsilon_rr))
    )
    log_big_g = min(load * (log_g + alpha * epsilon_rr), 700.0)
    refusals = 2.0 * (chunks + max_items / load * math.expm1(log_big_g))
    # log of G^l·(2D/k)(e^{ε_item·k} - 1), without overflow.
    log_flips = log_big_g + math.log(2.0 * max_items / spread)
    log_flips += epsilon_per_item * spread + math.log(-math.expm1(-epsilon_per_item * spread))
    log_total = max(math.log(refusals), log_flips)
    log_total += math.log1p(math.exp(-abs(math.log(refusals) - log_flips)))
    log_delta = log_c + log_total
    return 1.0 if log_delta >= 0.0 else math.exp(log_delta)


@dataclass(frozen=True, kw_only=True)
class ReleasePlan:
    """Everything public about a release, fixed from the policy and catalog before any data."""

    name: str
    table: str
    unit: str
    item: str
    unit_kind: Literal["integer", "string"]
    universe: ItemUniverse
    epsilon: float
    delta: float
    epsilon_per_item: float
    max_items: int
    hamming_bound: int
    chunks: int
    alpha: float
    chunk_log_ratio_bound: float

    def codec(self, public_seed: int) -> CompressedRR:
        return CompressedRR(
            n=self.universe.size,
            epsilon=self.epsilon_per_item,
            chunks=self.chunks,
            public_seed=public_seed,
            alpha=self.alpha,
        )

    @property
    def description(self) -> str:
        return (
            f"publish-rr {self.table}({self.unit}, {self.item}) as {self.name!r}: compressed "
            f"randomized response, at most {self.max_items} items per {self.unit}"
        )

    def summary(self) -> dict[str, Any]:
        return {
            "release": self.name,
            "table": self.table,
            "unit": self.unit,
            "item": self.item,
            "universe": self.universe.to_dict(with_keys=False),
            "epsilon": self.epsilon,
            "delta": self.delta,
            "epsilon_per_item": self.epsilon_per_item,
            "max_items": self.max_items,
            "hamming_bound": self.hamming_bound,
            "chunks": self.chunks,
            "alpha": self.alpha,
            "chunk_log_ratio_bound": self.chunk_log_ratio_bound,
            "neighbours": "replace one unit's item set; the set of units is published",
        }

    def event(self) -> MechanismEvent:
        """The charge: ``h·ε_item`` per person (replace one unit's item set), δ of the refusal."""
        return MechanismEvent(
            MECHANISM,
            self.epsilon,
            self.delta,
            label=f"publish {self.name}",
            params=(
                ("release", self.name),
                ("table", self.table),
                ("unit", self.unit),
                ("item", self.item),
                ("n", self.universe.size),
                ("epsilon_per_item", self.epsilon_per_item),
                ("max_items", self.max_items),
                ("hamming_bound", self.hamming_bound),
                ("chunks", self.chunks),
                ("alpha", self.alpha),
                ("neighbours", "replace_item_set"),
            ),
        )


def _chunk_options(
    *, n: int, epsilon_per_item: float, max_items: int, alpha: float, chunks: int
) -> tuple[float, float]:
    """``(chunk log-ratio bound L, δ)`` of a public configuration (both from public values)."""
    load = min(max_items, -(-n // chunks))
    bound = epsilon_per_item / (2.0 * alpha) * load
    delta = overflow_delta(
        epsilon_per_item=epsilon_per_item, alpha=alpha, chunks=chunks, n=n, max_items=max_items
    )
    return bound, delta


def _choose_chunks(
    requested: int | None, *, n: int, epsilon_per_item: float, max_items: int, alpha: float
) -> tuple[int, float, float]:
    """Chunks, L and δ: ``suggest_chunks`` from the public cap D, or more chunks (a geometric
    grid of chunk sizes, largest first) until L <= MAX_CHUNK_LOG_RATIO and δ <= DELTA_TARGET.

    A chunk may receive all D items of a person (the partition is public, the items are not), so
    only smaller chunks bound the worst chunk's ratio ``e^L`` and with it δ (docs/publish.md).
    """
    options = {"n": n, "epsilon_per_item": epsilon_per_item, "max_items": max_items}
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int | np.integer):
            raise ParameterError(f"chunks must be an integer, got {requested!r}")
        if not 1 <= requested <= n:
            raise ParameterError(f"chunks must be in [1, n={n}], got {requested}")
        bound, delta = _chunk_options(**options, alpha=alpha, chunks=int(requested))
        if bound > MAX_CHUNK_LOG_RATIO or delta > MAX_DELTA:
            raise ParameterError(
                f"chunks={requested} lets {max_items} items of one person crowd a chunk "
                f"(epsilon_rr * load = {bound:.3g}, delta = {delta:.3g}); use more chunks, or "
                "omit chunks to let dpsql choose"
            )
        return int(requested), bound, delta
    first = suggest_chunks(n=n, epsilon=epsilon_per_item, public_d=max_items, alpha=alpha)
    size = -(-n // first)
    best: tuple[float, int, float] | None = None
    while True:
        chunks = -(-n // size)
        bound, delta = _chunk_options(**options, alpha=alpha, chunks=chunks)
        if bound <= MAX_CHUNK_LOG_RATIO:
            if delta <= DELTA_TARGET:
                return chunks, bound, delta
            if best is None or delta < best[0]:
                best = (delta, chunks, bound)
        if size == 1:
            break
        size = min(size - 1, int(size / 1.05))
    if best is None or best[0] > MAX_DELTA:
        raise ParameterError(
            f"epsilon per item {epsilon_per_item:.6g} is too large for the PPR encoder at "
            f"alpha={alpha:g} (even one item per chunk gives delta > {MAX_DELTA:g}); lower "
            "epsilon or raise max_items"
        )
    return best[1], best[2], best[0]


def plan_release(
    policy: Policy,
    catalog: dict[str, dict[str, str]],
    *,
    name: str,
    table: str,
    unit: str,
    item: str,
    epsilon: float,
    chunks: int | None = None,
    alpha: float = 2.0,
    max_items: int | None = None,
) -> ReleasePlan:
    """Check a release against the policy and catalog and price it; reads no data."""
    name = _check_name(name)
    epsilon = check_budget_value("epsilon", epsilon, allow_zero=False)
    try:
        alpha = float(alpha)
    except (TypeError, ValueError):
        raise ParameterError(f"alpha must be a finite number > 1, got {alpha!r}") from None
    if not math.isfinite(alpha) or alpha <= 1.0:
        raise ParameterError(f"alpha must be a finite number > 1, got {alpha!r}")
    table_policy = policy.table(table)
    if table_policy is None:
        raise PolicyError(
            f"table {table!r} is not in the policy; only policy tables can be published"
        )
    matches = [t for t in catalog if t.lower() == table.lower()]
    if not matches:
        raise PolicyError(f"policy table {table!r} does not exist in the database")
    columns = catalog[matches[0]]
    if unit != table_policy.privacy_unit:
        raise PolicyError(
            f"unit {unit!r} is not the privacy unit of table {table!r} "
            f"({table_policy.privacy_unit!r})"
        )
    for role, column in (("unit", unit), ("item", item)):
        if column not in columns:
            raise ParameterError(f"{role} column {column!r} does not exist in table {table!r}")
    if item == unit:
        raise ParameterError(f"item column must differ from the unit column, both are {item!r}")
    universe = _universe(item, ColumnKind.of(columns[item]), table_policy.column(item))
    unit_type = columns[unit].upper().split("(")[0].strip()
    unit_kind: Literal["integer", "string"] = "integer" if unit_type in _INTEGER_TYPES else "string"
    if max_items is None:
        max_items = table_policy.max_rows_per_unit
    if isinstance(max_items, bool) or not isinstance(max_items, int | np.integer) or max_items < 1:
        raise ParameterError(f"max_items must be an integer >= 1, got {max_items!r}")
    n = universe.size
    cap = min(int(max_items), n)
    hamming = min(2 * cap, n)
    epsilon_per_item = math.nextafter(epsilon / hamming, 0.0)
    chosen, bound, delta = _choose_chunks(
        chunks, n=n, epsilon_per_item=epsilon_per_item, max_items=cap, alpha=alpha
    )
    return ReleasePlan(
        name=name,
        table=matches[0],
        unit=unit,
        item=item,
        unit_kind=unit_kind,
        universe=universe,
        epsilon=epsilon,
        delta=delta,
        epsilon_per_item=epsilon_per_item,
        max_items=cap,
        hamming_bound=hamming,
        chunks=chosen,
        alpha=alpha,
        chunk_log_ratio_bound=bound,
    )
