"""Key releases: GROUP BY over a column without public keys.

Which keys are shown is itself a release: thresholding (Korolova et al. 2009; Wilson et al.
2020), thresholding with discrete Gaussian noise (Canonne, Kamath and Steinke 2020), weighted
selection (Gopi et al. 2020), two-round adaptive weighted selection (MAD2R-style, Chen et al.
2025), or the combined threshold + ALP structure (Aumüller, Lebeda and Pagh 2022), which is kept
as a synopsis. ``plan_key_release`` prices the release from the policy alone; ``Keys`` holds its
privacy map beside its read and release.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from dpsql.accountant.events import MechanismEvent, SequentialEvent
from dpsql.engine.answers import ALP_ROWS_PER_KEY, having_rows, plain
from dpsql.engine.choices import MECHANISMS
from dpsql.engine.key_mechanisms import DefaultChoice, candidates, choose_default
from dpsql.engine.plans.base import Family, MeasurementPlan
from dpsql.engine.policy import TablePolicy
from dpsql.engine.progress import DONE, READING_DATA
from dpsql.engine.release import aggregation, bounded_sql, read, reporting
from dpsql.engine.results import QueryResult
from dpsql.engine.synopses import Synopsis, SynopsisStore, conjuncts
from dpsql.engine.synopses import now as synopsis_time
from dpsql.errors import ParameterError, PolicyError, UnsupportedQueryError
from dpsql.mechanisms import (
    adaptive_selection,
    combined,
    gaussian_threshold,
    joint_selection,
    sketch_split,
    threshold,
    weighted_selection,
)
from dpsql.mechanisms.combined import CombinedRelease
from dpsql.mechanisms.hashing import hash_keys, new_seed
from dpsql.mechanisms.laplace import interval_half_width
from dpsql.sql.exclusion import FOUND_COLUMN, second_round_weights, without_keys
from dpsql.sql.generate import bounded_aggregate, ranked_cells
from dpsql.sql.shape import AggregateKind, ColumnKind, GroupKey, QueryShape

if TYPE_CHECKING:
    import pandas as pd

    from dpsql.accountant.ledger import LedgerEntry
    from dpsql.engine.backends import Scratch
    from dpsql.engine.planner import QueryPlan
    from dpsql.engine.release import ReleaseContext
    from dpsql.sql.shape import Aggregate

__all__ = [
    "MECHANISMS",
    "KeyRelease",
    "Keys",
    "key_answer",
    "plan_key_release",
    "store_synopsis",
]


@dataclass(frozen=True)
class KeyRelease:
    """GROUP BY over a column without public keys: which keys are released, and how.

    ``mechanism`` is "threshold" (approximate DP, keys present in the data) or "combined"
    (threshold + ALP synopsis; pure DP over ``domain`` when ``delta`` is 0).
    """

    column: str
    mechanism: str
    delta: float
    domain: threshold.Domain | None
    expected_keys: int
    hashed: bool = False
    """Keys are shown as their 64-bit hashes (``key_domain = "hash64"``), whatever the delta."""
    threshold_epsilon: float = 0.0
    """The ε of the thresholded counts (all of it, or the combined structure's split)."""
    l1_sensitivity: int = 1
    """``min(max_groups_per_unit · max_rows_per_group, max_rows_per_unit)``, as everywhere."""
    scale: Fraction = Fraction(1)
    tau: int = 1
    sketch: sketch_split.SketchChoice | None = None
    """The combined structure's split of ε and ALP α (``dpsql.mechanisms.sketch_split``)."""
    key_hash_seed: int | None = None
    """Public seed of released key hashes, drawn before the charge and recorded in the ledger."""
    gaussian: gaussian_threshold.GaussianThreshold | None = None
    """σ², τ and the two parts of δ of a Gaussian threshold (``scale`` is σ)."""
    weighted: weighted_selection.WeightedPlan | None = None
    """Weighted selection's noises and τ (in weight units); ``scale`` is the counts' σ."""
    default: DefaultChoice | None = None
    """Why this mechanism, when the query named none (``dpsql.engine.key_mechanisms``)."""

    def persons_released_with_probability(
        self, probability: float, keys_each: int, rows_each: int
    ) -> int:
        """The fewest persons, with ``keys_each`` keys each and each adding ``rows_each`` rows
        to the key, whose key is released with at least ``probability``."""
        if isinstance(self.weighted, joint_selection.JointPlan):
            return self.weighted.persons_released_with_probability(
                probability, keys_each, rows_each
            )
        if self.weighted is not None:
            return self.weighted.persons_released_with_probability(probability, keys_each)
        if self.gaussian is not None:
            count = self.gaussian.count_released_with_probability(probability)
        else:
            count = threshold.count_released_with_probability(self.tau, self.scale, probability)
        return max(1, -(-count // rows_each))


@dataclass(frozen=True)
class Keys(Family):
    """GROUP BY over a column without public keys: the keys are released by a thresholding or
    selection mechanism (``KeyRelease``), with their noisy counts."""

    spec: KeyRelease

    @property
    def mechanism(self) -> str:
        return self.spec.mechanism

    def reason(self, plan: QueryPlan) -> str:
        spec = self.spec
        if spec.mechanism == "mad2r":
            return (
                "GROUP BY over a column without public keys and delta > 0: two-round "
                "adaptive weighted selection (MAD2R-style, Chen et al. 2025): round 1 finds "
                "the heavy keys on a small share of the budget, round 2 moves each person's "
                "weight to their other keys; then discrete Gaussian counts of the selected "
                "keys; nothing about the others"
            )
        if spec.mechanism == "joint":
            return (
                "GROUP BY over a column without public keys and delta > 0: joint selection "
                "(discrete Gaussian noise on each key's person-bounded weights and on its "
                "count; a key is released when noisy weight + multiplier x noisy count reaches "
                "tau), released with those noisy counts; nothing about the others"
            )
        if spec.mechanism == "weighted":
            return (
                "GROUP BY over a column without public keys and delta > 0: weighted "
                "selection (each person spreads a bounded L2 weight over their keys, "
                "discrete Gaussian noise, Gopi et al. 2020), then discrete Gaussian counts of "
                "the selected keys; nothing about the others"
            )
        if spec.mechanism == "threshold_gaussian":
            return (
                "GROUP BY over a column without public keys and delta > 0: thresholding with "
                "discrete Gaussian noise (L2 sensitivity sqrt(L0)*Linf) releases only keys "
                "whose noisy count reaches tau; nothing about the others"
            )
        if spec.mechanism == "threshold" and spec.delta == 0:
            return (
                "GROUP BY over a column without public keys with delta = 0: thresholding over "
                "the declared key domain (pure DP) releases keys whose noisy count reaches "
                "tau, as hashes under the public key_hash_seed for a hash64 domain"
            )
        if spec.mechanism == "threshold":
            return (
                "GROUP BY over a column without public keys and delta > 0: thresholding "
                "releases only keys whose noisy count reaches tau; nothing about the others"
            )
        return (
            "GROUP BY over a column without public keys: threshold + ALP sketch (combined "
            "structure); stored as a synopsis that answers later point queries for free"
        )

    def event(self, plan: QueryPlan) -> SequentialEvent:
        release = self.spec
        (m,) = plan.measurements
        params: tuple[tuple[str, Any], ...] = (
            ("key_column", release.column),
            ("max_groups_per_unit", plan.bounds.max_groups_per_unit),
            ("max_rows_per_group", plan.bounds.max_rows_per_group),
            ("max_rows_per_unit", plan.bounds.max_rows_per_unit),
            ("domain", None if release.domain is None else repr(release.domain)),
            ("l1_sensitivity", release.l1_sensitivity),
            ("threshold_epsilon", release.threshold_epsilon),
            ("noise_scale", float(release.scale)),
            ("tau", release.tau),
            *_zcdp_params(release),
        )
        leaf = MechanismEvent(release.mechanism, plan.epsilon, release.delta, m.label, params)
        return SequentialEvent((leaf,))

    def measures(self, plan: QueryPlan, output: Aggregate, text: str) -> str:
        if isinstance(self.spec.weighted, joint_selection.JointPlan):
            return text + (
                f"; only keys whose noisy weight + {self.spec.weighted.multiplier} x noisy "
                f"count reaches tau = {self.spec.tau} are shown"
            )
        if self.spec.weighted is not None:
            return text + (
                f"; only keys whose noisy weight reaches tau = {self.spec.tau} (each "
                f"person adds at most {weighted_selection.WEIGHT_SCALE} in L2) are shown"
            )
        return text + f"; only keys whose noisy count reaches tau = {self.spec.tau} are shown"

    def summary(self, plan: QueryPlan) -> dict[str, Any]:
        release = self.spec
        return {
            **super().summary(plan),
            "key_release": {
                "column": release.column,
                "delta": release.delta,
                "domain": repr(release.domain) if release.domain else None,
                "keys_shown_as": "hashes" if release.hashed else "values",
                "l1_sensitivity": release.l1_sensitivity,
                "threshold_epsilon": release.threshold_epsilon,
                "noise_scale": float(release.scale),
                "tau": release.tau,
                **_key_release_extras(release, plan.epsilon),
                **_in_persons(release, plan),
            },
        }

    def measurement(self, plan: QueryPlan, m: MeasurementPlan) -> dict[str, Any]:
        return {
            **super().measurement(plan, m),
            "epsilon": self.spec.threshold_epsilon,
            "noise_scale": float(self.spec.scale),
        }

    def error(
        self, plan: QueryPlan, kind: AggregateKind, column: str | None, level: float
    ) -> float:
        return float(interval_half_width(self.spec.scale, level))

    def unit_weights(self) -> tuple[int, ...] | None:
        return None if self.spec.weighted is None else self.spec.weighted.weights

    def seeded(self, rng: Any) -> Keys:
        """The public seed released key hashes will use, drawn before the charge
        (data-independent), so the ledger entry, the result and any synopsis name it."""
        release = self.spec
        if not (
            release.hashed or release.sketch or isinstance(release.domain, threshold.HashDomain)
        ):
            return self
        seed = int(rng.integers(0, 2**64, dtype="uint64"))
        return Keys(replace(release, key_hash_seed=seed))

    def release(
        self, plan: QueryPlan, entry: LedgerEntry, context: ReleaseContext
    ) -> tuple[QueryResult, QueryPlan]:
        progress = context.stages
        spec = self.spec
        salt = int(context.rng.integers(0, 2**62))
        with contextlib.ExitStack() as stack:
            scratch = _scratch(spec, context, stack)
            if scratch is None:
                frame = read(context, bounded_sql(plan, salt, context.backend.dialect))
                second_round = _second_round(spec, context, plan, salt)
            else:
                frame, second_round = _kept_cells(spec, context, plan, salt, scratch)
            progress(f"building {plan.mechanism} release", None)
            answer, structure = key_answer(
                spec,
                plan,
                frame,
                entry,
                rng=context.rng,
                analyst=context.analyst,
                second_round=second_round,
            )
        if structure is not None and context.synopses is not None:
            store_synopsis(context.synopses, spec, plan, entry, structure)
        progress(DONE, 1.0)
        return answer, plan


def _in_persons(release: KeyRelease, plan: QueryPlan) -> dict[str, Any]:
    """The smallest true counts released half the time and with the plan's confidence, in
    persons at the public reference, for this release and (δ > 0) every key mechanism."""
    bounds = _contribution(plan)
    keys_each, rows_each = max(1, -(-bounds.new_keys // 2)), max(1, -(-bounds.per_key // 2))
    level = plan.confidence
    shown: dict[str, Any] = {
        "persons_released_half_the_time": release.persons_released_with_probability(
            0.5, keys_each, rows_each
        ),
        f"persons_released_with_probability_{level:g}": (
            release.persons_released_with_probability(level, keys_each, rows_each)
        ),
        "reference_person": f"{keys_each} keys, adding {rows_each} rows to the key",
        "note": "a key is released when its noisy statistic reaches tau: keys held by fewer "
        "persons (after bounding) than these are mostly or always missing",
    }
    if release.delta > 0 and release.domain is None:
        shown["mechanisms"] = {
            c.mechanism: c.shown(keys_each, rows_each, level)
            for c in candidates(plan.epsilon, release.delta, bounds)
        }
    return shown


def _zcdp_params(release: KeyRelease) -> tuple[tuple[str, float], ...]:
    """A Gaussian key release's zCDP curve for the ledger: the shared keys' ρ and the new keys'
    release probability (``dpsql.accountant.zcdp``)."""
    if release.gaussian is not None:
        rho = release.gaussian.l2_sensitivity**2 / (2 * float(release.gaussian.sigma_squared))
        return (("zcdp_rho", rho), ("zcdp_delta", release.gaussian.threshold_delta))
    if release.weighted is not None:
        plan = release.weighted
        rho = plan.selection_rho
        rho += plan.count_l2_sensitivity**2 / (2 * float(plan.count_sigma_squared))
        return (("zcdp_rho", rho), ("zcdp_delta", plan.threshold_delta))
    return ()


def _key_release_extras(release: KeyRelease, epsilon: float) -> dict[str, Any]:
    """The combined structure's split and sketch verdict, and the keys' public hash seed."""
    extras: dict[str, Any] = {}
    if release.default is not None:
        extras["default_choice"] = release.default.why()
    if release.weighted is not None:
        plan = release.weighted
        extras["selection"] = {
            "weights": "each person gives each of their n kept keys floor(sqrt(W^2/n)), "
            f"W = {weighted_selection.WEIGHT_SCALE} (L2 norm at most W)",
            "tau_in_weight": plan.tau,
            "selection_sigma": plan.selection_sigma,
            "selection_share_of_rho": plan.selection_share,
            "count_sigma": plan.count_sigma,
            "count_l2_sensitivity": plan.count_l2_sensitivity,
            "noise_delta": plan.noise_delta,
            "threshold_delta": plan.threshold_delta,
            "persons_needed_half_the_time": {
                f"{m}_keys_each": round(plan.units_needed(m), 1)
                for m in sorted({1, max(1, len(plan.weights) // 2), len(plan.weights)})
            },
        }
        if isinstance(plan, joint_selection.JointPlan):
            extras["selection"]["weights"] += (
                f"; a key is released when its noisy weight + {plan.multiplier} x its noisy "
                "count reaches tau_in_weight"
            )
            extras["selection"]["count_multiplier"] = plan.multiplier
        if isinstance(plan, adaptive_selection.AdaptivePlan):
            extras["selection"]["rounds"] = (
                f"round 1: sigma {plan.first_sigma:.4g}, tau {plan.first_tau} on "
                f"{plan.first_share:.0%} of the selection's rho; round 2 (persons drop round 1's "
                "keys and spread W over the rest): the sigma and tau above"
            )
    if release.gaussian is not None:
        extras["noise"] = {
            "distribution": "discrete Gaussian",
            "sigma": release.gaussian.sigma,
            "sigma_squared": str(release.gaussian.sigma_squared),
            "l2_sensitivity": release.gaussian.l2_sensitivity,
            "noise_delta": release.gaussian.noise_delta,
            "threshold_delta": release.gaussian.threshold_delta,
        }
    if release.sketch is not None:
        extras["sketch"] = {
            "threshold_share": release.sketch.split,
            "sketch_epsilon": epsilon - release.threshold_epsilon,
            "alpha": float(release.sketch.alpha),
            "sketch_expected_error_bound": release.sketch.sketch_error_bound,
            "unreleased_count_at_most": release.sketch.unreleased_ceiling,
            "sketch_beats_zero": release.sketch.sketch_helps,
            "note": release.sketch.note(),
        }
    if release.key_hash_seed is not None:
        extras["key_hash_seed"] = release.key_hash_seed
    return extras


_SELECTIONS = {
    "weighted": weighted_selection,
    "mad2r": adaptive_selection,
    "joint": joint_selection,
}
"""The mechanisms that select keys on person-bounded weights (their ``plan`` takes a share)."""

_KEY_INTEGER_TYPES = frozenset(
    {
        "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER",
        "INT1", "INT2", "INT4", "INT8", "INT", "LONG", "SHORT",
    }
)  # fmt: skip
"""Integer types whose every value is an exact int64."""


def plan_key_release(
    shape: QueryShape,
    table: TablePolicy,
    epsilon: float,
    delta: float,
    mechanism: str | None,
    confidence: float = 0.95,
) -> KeyRelease | None:
    """The key-release plan for a GROUP BY over a column without public keys, or None."""
    private = [c for c in shape.group_by if table.column(c).public_keys is None]
    prefer = shape.options.get("prefer")
    if not private:
        if prefer is not None:
            raise ParameterError(
                "prefer chooses how keys of a GROUP BY column without public keys are released; "
                "this query has none"
            )
        if mechanism not in (None, "laplace"):
            raise UnsupportedQueryError(
                f"mechanism {mechanism!r} releases keys of a GROUP BY column without public "
                "keys; this query has none"
            )
        return None
    column = private[0]
    if len(shape.group_by) != 1 or [(a.kind, a.column) for a in shape.aggregates] != [
        (AggregateKind.COUNT, None)
    ]:
        raise UnsupportedQueryError(
            f"GROUP BY {column!r} has no public key set: dpsql can release its keys for a "
            f"single GROUP BY column with COUNT(*) only (or declare [tables.{shape.table}."
            f"columns.{column}] public_keys = [...] in the policy)"
        )
    if mechanism == "laplace":
        raise UnsupportedQueryError(
            f"mechanism 'laplace' needs public keys for GROUP BY {column!r}; use 'threshold' "
            "or 'alp'"
        )
    rules = table.column(column)
    kind = shape.columns[column]
    type_name = shape.types.get(column, "").upper()
    if kind is not ColumnKind.STRING and type_name not in _KEY_INTEGER_TYPES:
        # Keys are compared and hashed as 64-bit integers or text: wider or inexact types would
        # merge distinct keys, and then whether the release works would depend on the data.
        raise UnsupportedQueryError(
            f"keys of {column!r} ({shape.types.get(column, kind.value)}) cannot be released: "
            "GROUP BY without public keys needs a text column or an integer type of at most 64 "
            "signed bits (TINYINT ... BIGINT, UTINYINT ... UINTEGER)"
        )
    domain: threshold.Domain | None = None
    if rules.key_domain == "hash64":
        domain = threshold.HashDomain()
    elif rules.key_domain is not None:
        if kind is not ColumnKind.INTEGER:
            raise PolicyError(f"an integer key_domain needs an integer column; {column!r} is not")
        domain = threshold.IntegerDomain(*rules.key_domain)
    if delta == 0 and domain is None:
        raise UnsupportedQueryError(
            f"GROUP BY {column!r} without public keys needs delta > 0 (thresholding), or a "
            f"declared key_domain in [tables.{shape.table}.columns.{column}] for pure DP"
        )
    chosen = MECHANISMS.get(mechanism or "") or ("threshold" if delta > 0 else "combined")
    bounds = threshold.Contribution(
        table.max_groups_per_unit, table.max_rows_per_group, table.max_rows_per_unit
    )
    if prefer is not None and (mechanism is not None or delta == 0):
        raise ParameterError(
            "prefer chooses the default key release (delta > 0, no mechanism named); "
            + (f"mechanism {mechanism!r} is named" if mechanism is not None else "delta is 0")
        )
    default = (
        choose_default(epsilon, delta, bounds, prefer)
        if delta > 0 and mechanism is None
        else None
    )
    if default is not None:
        chosen = default.mechanism
    if chosen in _SELECTIONS and delta == 0:
        raise UnsupportedQueryError(f"mechanism {mechanism!r} needs delta > 0")
    weighted = None
    share = shape.options.get("selection_share")
    if share is not None and chosen not in _SELECTIONS:
        raise ParameterError(
            f"selection_share applies to mechanisms 'weighted', 'mad2r' and 'joint', not "
            f"{chosen!r}; name one with mechanism=..."
        )
    if chosen in _SELECTIONS:
        if share is None:
            share = _SELECTIONS[chosen].DEFAULT_SELECTION_SHARE
            if default is not None and default.selection_share is not None:
                share = default.selection_share
        weighted = _SELECTIONS[chosen].plan(epsilon, delta, bounds, share)
        if weighted is None:
            raise UnsupportedQueryError(
                f"no weighted selection meets delta={delta} at epsilon={epsilon} for these "
                "bounds; use mechanism 'threshold'"
            )
    gaussian = None
    if chosen == "threshold_gaussian":
        gaussian = gaussian_threshold.plan(epsilon, delta, bounds)
        if gaussian is None:
            raise UnsupportedQueryError(
                f"no discrete Gaussian with sigma <= 32768 meets delta={delta} at "
                f"epsilon={epsilon} for these bounds; use mechanism 'threshold'"
            )
    # The same rule as every other GROUP BY, and exactly what the mechanism will compute.
    limits = {
        "max_groups_per_unit": table.max_groups_per_unit,
        "max_rows_per_group": table.max_rows_per_group,
        "max_rows_per_unit": table.max_rows_per_unit,
    }
    sketch = None
    threshold_epsilon = epsilon
    if chosen == "combined":
        sketch = sketch_split.choose(
            epsilon,
            delta,
            threshold.Contribution(*limits.values()),
            domain if delta == 0 else None,
            1 / sketch_split.ROWS_PER_KEY,
            confidence,
        )
        threshold_epsilon = sketch.split * epsilon
    if gaussian is not None or weighted is not None:
        tau = (gaussian or weighted).tau  # type: ignore[union-attr]
    elif delta > 0:
        tau = threshold.tau_for_delta(epsilon=threshold_epsilon, delta=delta, **limits)
    else:
        assert domain is not None
        tau = threshold.tau_for_false_positives(epsilon=threshold_epsilon, domain=domain, **limits)
    return KeyRelease(
        column,
        chosen,
        delta,
        domain if delta == 0 else None,
        rules.expected_keys,
        hashed=rules.key_domain == "hash64",
        threshold_epsilon=threshold_epsilon,
        l1_sensitivity=threshold.Contribution(*limits.values()).l1,
        scale=(gaussian or weighted).scale  # type: ignore[union-attr]
        if gaussian is not None or weighted is not None
        else threshold.noise_scale_for(epsilon=threshold_epsilon, **limits),
        tau=tau,
        sketch=sketch,
        gaussian=gaussian,
        weighted=weighted,
        default=default,
    )


def key_answer(
    spec: KeyRelease,
    plan: QueryPlan,
    frame: pd.DataFrame,
    entry: LedgerEntry,
    *,
    rng: np.random.Generator,
    analyst: str,
    second_round: Callable[[np.ndarray], pd.DataFrame] | None = None,
) -> tuple[QueryResult, CombinedRelease | None]:
    """Release the heavy keys of a GROUP BY without public keys; with the combined structure,
    also return it (the caller stores it as a synopsis). ``mad2r`` reads its round-2 weights
    with ``second_round`` (the bounded aggregation without round 1's keys: key, ``weight``)."""
    structure = None
    column = spec.column
    kind = plan.shape.columns[column]
    # The database returns groups in any order; sort so a seeded generator reproduces a release.
    frame = frame.sort_values(column, kind="stable", ignore_index=True)
    keys = frame[column].to_numpy(dtype=object if kind is ColumnKind.STRING else np.int64)
    counts = frame[plan.measurements[0].measure.name].to_numpy(dtype=np.int64)
    common: dict[str, Any] = {
        "epsilon": plan.epsilon,
        "delta": spec.delta,
        "domain": spec.domain,
        "max_groups_per_unit": plan.bounds.max_groups_per_unit,
        "max_rows_per_group": plan.bounds.max_rows_per_group,
        "max_rows_per_unit": plan.bounds.max_rows_per_unit,
        "confidence": plan.confidence,
        "rng": rng,
    }
    gaussian: dict[str, Any] = {  # the zCDP mechanisms' own parameters
        "epsilon": plan.epsilon,
        "delta": spec.delta,
        "bounds": _contribution(plan),
        "confidence": plan.confidence,
        "rng": rng,
    }
    seed = spec.key_hash_seed if spec.key_hash_seed is not None else new_seed(rng)
    if spec.mechanism == "mad2r":
        assert spec.weighted is not None and second_round is not None

        def round_two(found: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            # Sorted as round 1's keys are: a seeded generator then reproduces round 2's noise.
            second = second_round(found).sort_values(column, kind="stable", ignore_index=True)
            values = second[column].to_numpy(dtype=keys.dtype)
            return values, second["weight"].to_numpy(dtype=np.int64)

        released = adaptive_selection.release(
            keys,
            counts,
            frame["weight"].to_numpy(dtype=np.int64),
            round_two,
            selection_share=spec.weighted.selection_share,
            **gaussian,
        )
    elif spec.mechanism in ("joint", "weighted"):
        assert spec.weighted is not None
        released = _SELECTIONS[spec.mechanism].release(
            keys,
            counts,
            frame["weight"].to_numpy(dtype=np.int64),
            selection_share=spec.weighted.selection_share,
            **gaussian,
        )
    elif spec.mechanism == "threshold_gaussian":
        released = gaussian_threshold.release(keys, counts, **gaussian)
    elif spec.mechanism == "threshold":
        released = threshold.release(keys, counts, seed=seed, **common)
    else:
        assert spec.sketch is not None
        structure = combined.release(
            keys,
            counts,
            s=ALP_ROWS_PER_KEY * spec.expected_keys,
            seed=seed,
            split=spec.sketch.split,
            alpha=spec.sketch.alpha,
            **common,
        )
        released = structure.threshold
    # What was charged and shown in EXPLAIN is what was used (else the one after-charge failure).
    assert (released.scale, released.tau) == (spec.scale, spec.tau)
    shown, seed = _shown_keys(released, hashed=spec.hashed, seed=seed)
    lower, upper = released.lower, released.upper
    names = list(plan.shape.column_names)
    # The key column may be shown under several names (SELECT k AS a, k AS b ... GROUP BY 1, 2).
    by_output = {
        o.name: shown if isinstance(o, GroupKey) else released.values for o in plan.shape.outputs
    }
    rows = [
        tuple(plain(v) for v in row) for row in zip(*(by_output[n] for n in names), strict=True)
    ]
    count_name = next(o.name for o in plan.shape.outputs if not isinstance(o, GroupKey))
    intervals = {count_name: [(plain(a), plain(b)) for a, b in zip(lower, upper, strict=True)]}
    rows, intervals = having_rows(plan, names, rows, intervals)
    result = QueryResult(
        columns=names,
        rows=rows,
        intervals=intervals,
        noise_scale={count_name: float(released.scale)},
        confidence=plan.confidence,
        epsilon=entry.cost.epsilon,
        delta=entry.cost.delta,
        mechanism=spec.mechanism,
        analyst=analyst,
        ledger_entry=entry.seq,
        details={} if seed is None else {"key_hash_seed": seed},
    )
    return result, structure


def _contribution(plan: QueryPlan) -> threshold.Contribution:
    bounds = plan.bounds
    return threshold.Contribution(
        bounds.max_groups_per_unit, bounds.max_rows_per_group, bounds.max_rows_per_unit
    )


def _shown_keys(
    released: threshold.ThresholdRelease, *, hashed: bool, seed: int
) -> tuple[list[Any], int | None]:
    """The released keys as shown, and the public seed of their hashes when shown as hashes.

    A pure release over the hash domain holds hashes already; with ``key_domain = "hash64"`` an
    approximate release (keys present in the data) is hashed under the plan's public ``seed``
    (drawn before the charge and recorded in the ledger) before it is shown, a post-processing
    step: the analyst can check a key they know
    (``dpsql.mechanisms.hashing.hash_keys([key], seed)``) but reads no key they did not.
    """
    if released.key_kind == "hash":
        assert released.seed is not None
        return [f"0x{int(k):016x}" for k in released.keys], released.seed
    if not hashed:
        return [plain(k) for k in released.keys], None
    return [f"0x{int(k):016x}" for k in hash_keys(released.keys, seed)], seed


def _scratch(
    release: KeyRelease, context: ReleaseContext, stack: contextlib.ExitStack
) -> Scratch | None:
    """Temporary tables for mad2r's cells, when the backend keeps them (DuckDB); dropped
    when ``stack`` closes, however the query ends."""
    scratch = getattr(context.backend, "scratch", None)
    if release.mechanism != "mad2r" or not callable(scratch):
        return None
    return stack.enter_context(scratch())


def _kept_cells(
    release: KeyRelease, context: ReleaseContext, plan: QueryPlan, salt: int, scratch: Scratch
) -> tuple[pd.DataFrame, Callable[[Any], pd.DataFrame]]:
    """mad2r in one read of the data: round 1's ranked cells materialised in ``scratch``,
    round 1's aggregation and round 2's weights read from them
    (``dpsql.sql.exclusion.second_round_weights``: the same weights as the bounded
    aggregation without round 1's keys, same salt)."""
    weights = None if release.weighted is None else release.weighted.weights
    assert weights is not None
    cells = scratch.table(
        ranked_cells(plan.shape, **aggregation(plan, salt)), reporting(context, READING_DATA)
    )
    frame = read(
        context,
        bounded_sql(plan, salt, context.backend.dialect, cells_table=cells),
        "aggregating cells",
    )
    text = plan.shape.columns[release.column] is ColumnKind.STRING

    def round_two(found: Any) -> pd.DataFrame:
        keys = scratch.values(FOUND_COLUMN, found, text=text)
        return read(
            context, second_round_weights(cells, keys, release.column, weights), "reading round 2"
        )

    return frame, round_two


def _second_round(
    release: KeyRelease, context: ReleaseContext, plan: QueryPlan, salt: int
) -> Callable[[Any], pd.DataFrame] | None:
    """mad2r's round 2 where the backend keeps no cells: the same bounded aggregation (same
    salt) without round 1's keys, only the weights (``dpsql.mechanisms.adaptive_selection``)."""
    if release.mechanism != "mad2r":
        return None

    def round_two(found: Any) -> pd.DataFrame:
        sql = bounded_aggregate(
            without_keys(plan.shape, release.column, list(found)),
            **{**aggregation(plan, salt), "measures": []},  # only the weights
            dialect=context.backend.dialect,
        )
        return read(context, sql, "reading round 2")

    return round_two


def store_synopsis(
    store: SynopsisStore,
    release: KeyRelease,
    plan: QueryPlan,
    entry: LedgerEntry,
    structure: CombinedRelease,
) -> None:
    """Keep a combined structure as a synopsis that answers later point counts for free."""
    store.save(
        Synopsis(
            name=f"{plan.shape.table}_{release.column}_{entry.seq}",
            created=synopsis_time(),
            table=plan.shape.table,
            column=release.column,
            filters=conjuncts(plan.shape.where),
            epsilon=plan.epsilon,
            delta=release.delta,
            mechanism="combined",
            ledger_entry=entry.seq,
            params={
                "tau": int(structure.threshold.tau),
                "seed": structure.seed,
                "split": structure.split,
                "contribution_bounds": {
                    "max_groups_per_unit": plan.bounds.max_groups_per_unit,
                    "max_rows_per_group": plan.bounds.max_rows_per_group,
                    "max_rows_per_unit": plan.bounds.max_rows_per_unit,
                },
            },
            data=structure.to_bytes(),
        )
    )
