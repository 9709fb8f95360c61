"""Turn an accepted query shape into noisy measurements, sensitivities and a priced event.

Everything here is computed from the shape and the policy alone, before any data is read:
sensitivity = declared value bounds x contribution bounds, never a property of the data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from sqlglot import exp

from dpsql.accountant.events import MechanismEvent, SequentialEvent
from dpsql.accountant.units import Cost
from dpsql.engine.key_mechanisms import DefaultChoice, choose_default
from dpsql.engine.policy import Policy, PublicKey, TablePolicy
from dpsql.engine.virtual_columns import with_virtual_bounds
from dpsql.errors import ParameterError, PolicyError, SchemaError, UnsupportedQueryError
from dpsql.mechanisms import (
    adaptive_selection,
    gaussian_threshold,
    quantile,
    sketch_split,
    svt,
    threshold,
    weighted_selection,
)
from dpsql.mechanisms.laplace import MAX_GRID, choose_grid, noise_scale
from dpsql.sql.generate import Bounds, Measure, MeasureKind
from dpsql.sql.shape import AggregateKind, ColumnKind, GroupKey, QueryShape

__all__ = ["MAX_GROUPS", "MeasurementPlan", "QueryPlan", "key_literal", "plan_query"]

MAX_GROUPS = 10_000_000
"""Largest public key domain (product over group columns) one query may answer."""

MECHANISM = "discrete_laplace"


@dataclass(frozen=True)
class MeasurementPlan:
    """One noisy vector (one value per group) and what it costs."""

    measure: Measure
    label: str
    epsilon: float
    sensitivity_units: int
    grid: float

    @property
    def scale(self) -> Fraction:
        """Noise scale in integer units (grid units for sums)."""
        return noise_scale(self.sensitivity_units, self.epsilon)


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

    def released_with_probability(self, probability: float) -> int:
        """The smallest true count released with at least ``probability``."""
        if self.weighted is not None:
            return self.weighted.persons_released_with_probability(probability)
        if self.gaussian is not None:
            return self.gaussian.count_released_with_probability(probability)
        return threshold.count_released_with_probability(self.tau, self.scale, probability)


@dataclass(frozen=True)
class RangeQueries:
    """A range JOIN with HAVING, answered by NumericSparse over the public table's ranges."""

    table: str
    threshold: int
    max_answers: int
    sensitivity: int
    svt: svt.SparseVectorPlan


DEFAULT_MAX_ANSWERS = 5
"""Cut-off c of the sparse vector technique when the query states none."""


AUTO_BOUND_EXPONENTS = tuple(range(-10, 63))
"""Candidate bounds 2**b for automatic clipping (an exponential grid, Programming DP ch. 10)."""


@dataclass(frozen=True)
class AutoBounds:
    """SUM/AVG over a column without declared bounds: AboveThreshold picks U on a 2**b grid."""

    column: str
    mode: str
    epsilon: float
    rest: float


@dataclass(frozen=True)
class QuantilePlan:
    """One DP quantile: permute-and-flip over ``candidates`` equal bins of ``[low, high]``, the
    rank utility having sensitivity ``sensitivity`` rows (``dpsql.mechanisms.quantile``)."""

    column: str
    name: str
    q: Fraction
    low: float
    high: float
    candidates: int
    epsilon: float
    sensitivity: int

    def rank_error(self, confidence: float) -> float:
        return quantile.rank_error_bound(
            self.sensitivity, self.epsilon, self.candidates, 1 - confidence, self.q
        )

    def describe(self, confidence: float) -> dict[str, Any]:
        return {
            "output": self.name,
            "column": self.column,
            "q": str(self.q),
            "bounds": [self.low, self.high],
            "candidates": self.candidates,
            "bin_width": (self.high - self.low) / self.candidates,
            "epsilon": self.epsilon,
            "rank_sensitivity": self.sensitivity,
            f"rank_error_with_probability_{confidence:g}": self.rank_error(confidence),
        }


@dataclass(frozen=True)
class QueryPlan:
    """Everything needed to charge, run and noise one query."""

    shape: QueryShape
    table: TablePolicy
    measurements: tuple[MeasurementPlan, ...]
    key_domain: dict[str, tuple[Any, ...]]
    key_literals: dict[str, tuple[exp.Expression, ...]]
    bounds: Bounds
    epsilon: float
    delta: float
    confidence: float
    partition: tuple[str, tuple[str, ...]] | None = None
    """(family, values) when the WHERE clause reads only these declared partition values."""
    key_release: KeyRelease | None = None
    range_queries: RangeQueries | None = None
    auto_bounds: AutoBounds | None = None
    quantiles: tuple[QuantilePlan, ...] = ()

    @property
    def mechanism(self) -> str:
        if self.quantiles:
            return "permute_and_flip"
        if self.range_queries is not None:
            return "numeric_sparse"
        return MECHANISM if self.key_release is None else self.key_release.mechanism

    @property
    def reason(self) -> str:
        """Why this mechanism: what EXPLAIN shows."""
        if self.quantiles:
            return (
                "quantile: the exponential mechanism over public equal bins of the column's "
                "bounds, sampled with permute-and-flip (McKenna & Sheldon 2020); the utility is "
                "minus the distance of q*n from a bin's rank interval, from one bounded histogram "
                "in the database; the chosen bin's midpoint is released; with probability >= "
                "confidence the chosen bin's ranks are within 2*max(q, 1-q)*sensitivity/epsilon*"
                "ln(candidates/(1 - confidence)) rows of q*n"
            )
        if self.auto_bounds is not None:
            return (
                f"no declared bounds for {self.auto_bounds.column}: AboveThreshold over "
                "clipped-sum differences on a 2**b grid spends "
                f"epsilon={self.auto_bounds.epsilon:g} to choose the bound, the aggregates get "
                f"epsilon={self.auto_bounds.rest:g} with discrete Laplace noise"
            )
        if self.range_queries is not None:
            return (
                "range JOIN with HAVING: the sparse vector technique (NumericSparse, monotone "
                "counts) pays epsilon for at most max_answers ranges at or above the threshold, "
                "however many ranges it scans; noising every range instead would need L1 "
                "sensitivity max_rows_per_unit x the largest number of overlapping ranges"
            )
        if self.key_release is not None:
            if self.key_release.mechanism == "mad2r":
                return (
                    "GROUP BY over a column without public keys and delta > 0: two-round "
                    "adaptive weighted selection (MAD2R-style, Chen et al. 2025): round 1 finds "
                    "the heavy keys on a small share of the budget, round 2 moves each person's "
                    "weight to their other keys; then discrete Gaussian counts of the selected "
                    "keys; nothing about the others"
                )
            if self.key_release.mechanism == "weighted":
                return (
                    "GROUP BY over a column without public keys and delta > 0: weighted "
                    "selection (each person spreads a bounded L2 weight over their keys, "
                    "discrete Gaussian noise, Gopi et al. 2020), then discrete Gaussian counts of "
                    "the selected keys; nothing about the others"
                )
            if self.key_release.mechanism == "threshold_gaussian":
                return (
                    "GROUP BY over a column without public keys and delta > 0: thresholding with "
                    "discrete Gaussian noise (L2 sensitivity sqrt(L0)*Linf) releases only keys "
                    "whose noisy count reaches tau; nothing about the others"
                )
            if self.key_release.mechanism == "threshold" and self.key_release.delta == 0:
                return (
                    "GROUP BY over a column without public keys with delta = 0: thresholding over "
                    "the declared key domain (pure DP) releases keys whose noisy count reaches "
                    "tau, as hashes under the public key_hash_seed for a hash64 domain"
                )
            if self.key_release.mechanism == "threshold":
                return (
                    "GROUP BY over a column without public keys and delta > 0: thresholding "
                    "releases only keys whose noisy count reaches tau; nothing about the others"
                )
            return (
                "GROUP BY over a column without public keys: threshold + ALP sketch (combined "
                "structure); stored as a synopsis that answers later point queries for free"
            )
        if self.shape.having is not None:
            return (
                "HAVING over public keys: every group is noised once under parallel composition "
                "(cost epsilon whatever the number of groups) and the noisy counts are filtered "
                "(post-processing); cheaper than the sparse vector technique, whose noise grows "
                "with the number of answers"
            )
        return "discrete Laplace on each aggregate; parallel composition across disjoint groups"

    @property
    def groups(self) -> int:
        return math.prod(len(v) for v in self.key_domain.values()) if self.key_domain else 1

    @property
    def event(self) -> SequentialEvent:
        """The cost tree: one discrete-Laplace leaf per measurement, composed sequentially (or
        one thresholding / combined-structure leaf for a key release)."""
        if self.quantiles:
            return SequentialEvent(
                tuple(
                    MechanismEvent(
                        "permute_and_flip",
                        p.epsilon,
                        0.0,
                        p.name,
                        (
                            ("groups", self.groups),
                            ("candidates", p.candidates),
                            ("rank_sensitivity", p.sensitivity),
                        ),
                    )
                    for p in self.quantiles
                )
            )
        if self.auto_bounds is not None:
            auto = self.auto_bounds
            choose = MechanismEvent(
                "above_threshold",
                auto.epsilon,
                0.0,
                f"automatic bounds for {auto.column}",
                (("grid", "2**b, b in [-10, 62]"), ("mode", auto.mode)),
            )
            return SequentialEvent((choose, *self._laplace_leaves(auto=True)))
        if self.range_queries is not None:
            ranges = self.range_queries
            leaf = MechanismEvent(
                "numeric_sparse",
                ranges.svt.epsilon,
                ranges.svt.delta,
                "COUNT(*) per range",
                (
                    ("max_answers", ranges.max_answers),
                    ("threshold", ranges.threshold),
                    ("sensitivity", ranges.sensitivity),
                    ("ranges_table", ranges.table),
                ),
            )
            return SequentialEvent((leaf,))
        release = self.key_release
        if release is not None:
            (m,) = self.measurements
            params: tuple[tuple[str, Any], ...] = (
                ("key_column", release.column),
                ("max_groups_per_unit", self.bounds.max_groups_per_unit),
                ("max_rows_per_group", self.bounds.max_rows_per_group),
                ("max_rows_per_unit", self.bounds.max_rows_per_unit),
                ("domain", None if release.domain is None else repr(release.domain)),
                ("l1_sensitivity", release.l1_sensitivity),
                ("threshold_epsilon", release.threshold_epsilon),
                ("noise_scale", float(release.scale)),
                ("tau", release.tau),
                *_zcdp_params(release),
            )
            leaf = MechanismEvent(release.mechanism, self.epsilon, release.delta, m.label, params)
            return SequentialEvent((leaf,))
        return SequentialEvent(self._laplace_leaves())

    def _laplace_leaves(self, *, auto: bool = False) -> tuple[MechanismEvent, ...]:
        """One discrete-Laplace leaf per measurement (with automatic bounds, the sensitivities
        are only known after the bound is chosen, so the leaves record the groups only)."""
        return tuple(
            MechanismEvent(
                MECHANISM,
                m.epsilon,
                0.0,
                m.label,
                (("groups", self.groups), ("bounds", "automatic"))
                if auto
                else (
                    ("groups", self.groups),
                    ("l1_sensitivity", m.sensitivity_units * m.grid),
                    ("noise_scale", float(m.scale) * m.grid),
                ),
            )
            for m in self.measurements
        )

    def per_person(self) -> str:
        """How much of one person's rows a bounded aggregate keeps, in words."""
        bounds = self.bounds
        if self.range_queries is not None:
            return f"each person's rows weighted to at most {bounds.max_rows_per_unit} in all"
        if not self.shape.group_by:
            return f"at most {bounds.max_rows_per_unit} per person"
        text = (
            f"at most {bounds.max_rows_per_group} per person per group, in at most "
            f"{bounds.max_groups_per_unit} groups per person"
        )
        if bounds.max_rows_per_unit < bounds.max_groups_per_unit * bounds.max_rows_per_group:
            text += f", at most {bounds.max_rows_per_unit} per person in all"
        return text

    def measures(self) -> dict[str, str]:
        """What each noisy output column measures: the *bounded* quantity its interval covers,
        which differs from the plain SQL answer whenever a person exceeds a bound."""
        per_person = self.per_person()
        described: dict[str, str] = {}
        for output in self.shape.outputs:
            if isinstance(output, GroupKey):
                continue
            column = output.column
            rules = None if column is None else self.table.column(column)
            if column in self.shape.virtual:
                column = self.shape.virtual[column].meta.get("text", column)
            clamp = (
                "automatic bounds (see details)"
                if self.auto_bounds is not None or rules is None or rules.bounds is None
                else f"[{rules.bounds[0]:g}, {rules.bounds[1]:g}]"
            )
            if output.kind is AggregateKind.QUANTILE:
                text = (
                    f"the {output.quantile} quantile of {column} clamped to {clamp}: the midpoint "
                    "of a public bin chosen by permute-and-flip (no interval; see the rank error "
                    f"in the plan's quantiles), over rows {per_person}"
                )
            elif output.kind is AggregateKind.PERSONS:
                text = f"persons with a row kept under the bounds ({per_person})"
            elif output.kind is AggregateKind.COUNT:
                what = "rows" if column is None else f"rows with a non-NULL {column}"
                text = f"{what}, {per_person}"
            elif output.kind is AggregateKind.SUM:
                text = f"sum of {column} clamped to {clamp}, over rows {per_person}"
            else:
                text = (
                    f"mean of {column} clamped to {clamp} (bounded sum / bounded count), over "
                    f"rows {per_person}"
                )
            if self.key_release is not None:
                text += (
                    f"; only keys whose noisy weight reaches tau = {self.key_release.tau} (each "
                    f"person adds at most {weighted_selection.WEIGHT_SCALE} in L2) are shown"
                    if self.key_release.weighted is not None
                    else f"; only keys whose noisy count reaches tau = {self.key_release.tau} are "
                    "shown"
                )
            if self.range_queries is not None:
                text = f"rows in the range, {per_person}"
            described[output.name] = text
        return described

    def summary(self) -> dict[str, Any]:
        """What the ledger and EXPLAIN show: table, grouping, bounds and each measurement."""
        return {
            "table": self.shape.table,
            "group_by": list(self.shape.group_by),
            "groups": self.groups,
            "where": self.shape.where.sql(dialect="duckdb") if self.shape.where else None,
            "privacy_unit": self.bounds.unit,
            "contribution_bounds": {
                "max_groups_per_unit": self.bounds.max_groups_per_unit,
                "max_rows_per_group": self.bounds.max_rows_per_group,
                "max_rows_per_unit": self.bounds.max_rows_per_unit,
            },
            "partition": (
                None
                if self.partition is None
                else {"family": self.partition[0], "values": list(self.partition[1])}
            ),
            "mechanism": self.mechanism,
            "reason": self.reason,
            "measures": self.measures(),
            "having": (
                None
                if self.shape.having is None
                else {
                    "count_at_least": self.shape.having.integer_threshold,
                    "applied": "by the sparse vector technique"
                    if self.range_queries is not None
                    else "to the noisy counts (post-processing)",
                }
            ),
            "max_answers": None if self.range_queries is None else self.range_queries.max_answers,
            "auto_bounds": (
                None
                if self.auto_bounds is None
                else {
                    "column": self.auto_bounds.column,
                    "mode": self.auto_bounds.mode,
                    "epsilon": self.auto_bounds.epsilon,
                    "rest": self.auto_bounds.rest,
                }
            ),
            "key_release": (
                None
                if self.key_release is None
                else {
                    "column": self.key_release.column,
                    "delta": self.key_release.delta,
                    "domain": repr(self.key_release.domain) if self.key_release.domain else None,
                    "keys_shown_as": "hashes" if self.key_release.hashed else "values",
                    "l1_sensitivity": self.key_release.l1_sensitivity,
                    "threshold_epsilon": self.key_release.threshold_epsilon,
                    "noise_scale": float(self.key_release.scale),
                    "tau": self.key_release.tau,
                    **_key_release_extras(self.key_release, self.epsilon),
                    "smallest_count_released_half_the_time": self.key_release.tau,
                    f"smallest_count_released_with_probability_{self.confidence:g}": (
                        self.key_release.released_with_probability(self.confidence)
                    ),
                    "note": "a key is released iff its noisy count reaches tau: groups with fewer "
                    "rows (after bounding) than these counts are mostly or always missing",
                }
            ),
            "quantiles": [p.describe(self.confidence) for p in self.quantiles] or None,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "measurements": [
                {
                    "label": m.label,
                    "epsilon": (
                        m.epsilon
                        if self.key_release is None
                        else self.key_release.threshold_epsilon
                    ),
                    "l1_sensitivity": (
                        "set by the automatic bound"
                        if self.auto_bounds is not None
                        else m.sensitivity_units * m.grid
                    ),
                    "grid": m.grid,
                    "noise_scale": (
                        None
                        if self.auto_bounds is not None
                        else float(self.key_release.scale)
                        if self.key_release is not None
                        else float(m.scale) * m.grid
                    ),
                }
                for m in self.measurements
            ],
        }


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


def key_literal(value: PublicKey, kind: ColumnKind, column: str) -> tuple[Any, exp.Expression]:
    """A public key as a Python value and a draft typed literal for ``column``'s type, for callers
    without a backend (the session converts keys with ``dpsql.engine.literals.Binder``)."""
    problem = f"public key {value!r} of column {column!r} does not match its type ({kind.value})"
    if kind is ColumnKind.STRING and isinstance(value, str):
        return value, exp.Literal.string(value)
    if kind is ColumnKind.BOOLEAN and isinstance(value, bool):
        return value, exp.Boolean(this=value)
    if kind.numeric and isinstance(value, (int, float)) and not isinstance(value, bool):
        if kind is ColumnKind.INTEGER and float(value) != int(value):
            raise PolicyError(problem)
        if kind is ColumnKind.INTEGER:
            return int(value), exp.cast(exp.Literal.string(str(int(value))), "BIGINT")
        return float(value), exp.cast(exp.Literal.string(repr(float(value))), "DOUBLE")
    if kind in (ColumnKind.DATE, ColumnKind.TIMESTAMP) and isinstance(value, str):
        target = "DATE" if kind is ColumnKind.DATE else "TIMESTAMP"
        return value, exp.cast(exp.Literal.string(value), target)
    raise PolicyError(problem)


def literal_text(literal: exp.Expression) -> str:
    """How the database prints the value of a typed literal (``CAST(x AS VARCHAR)``)."""
    if isinstance(literal, exp.Boolean):
        return "true" if literal.this else "false"
    if isinstance(literal, exp.Cast):
        return str(literal.this.this)
    return str(literal.this)


_MECHANISMS = {
    "laplace": None,
    "threshold": "threshold",
    "threshold_laplace": "threshold",
    "threshold_gaussian": "threshold_gaussian",
    "weighted": "weighted",
    "mad2r": "mad2r",
    "alp": "combined",
    "combined": "combined",
}
MECHANISM_NAMES: tuple[str, ...] = tuple(_MECHANISMS)
"""What ``mechanism=`` may name for a query the planner answers (query streams add theirs)."""


def _bounds(table: TablePolicy) -> Bounds:
    return Bounds(
        table.privacy_unit,
        table.max_groups_per_unit,
        table.max_rows_per_group,
        table.max_rows_per_unit,
        table.partition_column,
    )


def _mechanism_option(shape: QueryShape, given: str | None) -> str | None:
    option = shape.options.get("mechanism")
    if given is not None and option is not None and given != option:
        raise ParameterError(
            f"mechanism is given both in OPTIONS ({option!r}) and as an argument ({given!r})"
        )
    chosen = given if given is not None else option
    if chosen == "mad":
        raise ParameterError(
            "mechanism 'mad' (one-round MAD) is not available: the one-round rerouting's "
            "sensitivity dpsql can prove costs more noise than it gains "
            "(docs/partition_selection.md); use 'mad2r', the two-round adaptive weighting"
        )
    if chosen is not None and chosen not in _MECHANISMS:
        raise ParameterError(
            f"unknown mechanism {chosen!r}; choose one of {', '.join(sorted(_MECHANISMS))}"
        )
    return chosen


def _key_release(
    shape: QueryShape,
    table: TablePolicy,
    epsilon: float,
    delta: float,
    mechanism: str | None,
    confidence: float = 0.95,
) -> KeyRelease | None:
    """The key-release plan for a GROUP BY over a column without public keys, or None."""
    private = [c for c in shape.group_by if table.column(c).public_keys is None]
    if not private:
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
    chosen = _MECHANISMS.get(mechanism or "") or ("threshold" if delta > 0 else "combined")
    bounds = threshold.Contribution(
        table.max_groups_per_unit, table.max_rows_per_group, table.max_rows_per_unit
    )
    default = choose_default(epsilon, delta, bounds) if delta > 0 and mechanism is None else None
    if default is not None:
        chosen = default.mechanism
    if chosen in ("threshold_gaussian", "weighted", "mad2r") and delta == 0:
        raise UnsupportedQueryError(f"mechanism {mechanism!r} needs delta > 0")
    weighted = None
    share = shape.options.get("selection_share")
    if share is not None and chosen not in ("weighted", "mad2r"):
        raise ParameterError(
            f"selection_share applies to mechanisms 'weighted' and 'mad2r', not {chosen!r}; "
            "name one with mechanism=..."
        )
    if chosen in ("weighted", "mad2r"):
        weighted = (weighted_selection if chosen == "weighted" else adaptive_selection).plan(
            epsilon,
            delta,
            bounds,
            weighted_selection.DEFAULT_SELECTION_SHARE if share is None else share,
        )
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


def unit_weights_of(plan: QueryPlan) -> tuple[int, ...] | None:
    """The per-unit weights the generated SQL sums for a weighted selection, else None."""
    release = plan.key_release
    return None if release is None or release.weighted is None else release.weighted.weights


def with_key_hash_seed(plan: QueryPlan, rng: Any) -> QueryPlan:
    """``plan`` with the public seed its released key hashes will use, drawn from ``rng`` before
    the charge (data-independent), so the ledger entry, the result and any synopsis name it."""
    release = plan.key_release
    if release is None:
        return plan
    if not (release.hashed or release.sketch or isinstance(release.domain, threshold.HashDomain)):
        return plan
    seed = int(rng.integers(0, 2**64, dtype="uint64"))
    return replace(plan, key_release=replace(release, key_hash_seed=seed))


_KEY_INTEGER_TYPES = frozenset(
    {
        "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER",
        "INT1", "INT2", "INT4", "INT8", "INT", "LONG", "SHORT",
    }
)  # fmt: skip
"""Integer types whose every value is an exact int64."""


def _auto_bounds(
    shape: QueryShape, table: TablePolicy, policy: Policy, epsilon: float
) -> AutoBounds | None:
    """The automatic-bounds step for SUM/AVG over a column the policy lets dpsql bound itself."""
    columns = sorted(
        {
            a.column
            for a in shape.aggregates
            if a.kind is not AggregateKind.COUNT
            and a.column is not None
            and table.column(a.column).bounds is None
            and table.column(a.column).auto_bounds is not None
        }
    )
    if not columns:
        return None
    if len(columns) > 1:
        raise UnsupportedQueryError(
            f"automatic bounds are chosen for one column per query; {columns} have none declared"
        )
    units = Cost.of(epsilon).epsilon_units
    share = max(1, int(units * policy.dataset.auto_bounds_share))
    if share >= units:
        raise ParameterError(f"epsilon {epsilon} is too small to also choose automatic bounds")
    mode = table.column(columns[0]).auto_bounds or "symmetric"
    return AutoBounds(columns[0], mode, Cost(share).epsilon, Cost(units - share).epsilon)


def _plan_ranges(
    shape: QueryShape,
    policy: Policy,
    table: TablePolicy,
    epsilon: float,
    delta: float,
    max_answers: int | None,
) -> QueryPlan:
    join = shape.range_join
    assert join is not None
    if join.table.lower() not in {name.lower() for name in policy.public_tables}:
        raise PolicyError(
            f"table {join.table!r} is not declared public: add [public_tables.{join.table}] to "
            "the policy to use it as a list of ranges"
        )
    if shape.having is None:
        raise UnsupportedQueryError(
            "a range JOIN needs HAVING COUNT(*) > <threshold>: dpsql answers it with the sparse "
            "vector technique"
        )
    if [(a.kind, a.column) for a in shape.aggregates] != [(AggregateKind.COUNT, None)]:
        raise UnsupportedQueryError("a range JOIN supports COUNT(*) only")
    option = shape.options.get("max_answers")
    if max_answers is not None and option is not None and float(max_answers) != option:
        raise ParameterError(
            f"max_answers is given both in OPTIONS ({option:g}) and as an argument ({max_answers})"
        )
    chosen = max_answers if max_answers is not None else option
    if chosen is None:
        chosen = DEFAULT_MAX_ANSWERS
    if float(chosen) != int(chosen) or int(chosen) < 1:
        raise ParameterError(f"max_answers must be a positive integer, got {chosen}")
    sensitivity = table.max_rows_per_unit
    svt_plan = svt.plan(
        epsilon=epsilon,
        c=int(chosen),
        delta=delta,
        sensitivity=sensitivity,
        numeric=True,
        monotone=True,
    )
    ranges = RangeQueries(
        join.table, shape.having.integer_threshold, int(chosen), sensitivity, svt_plan
    )
    measure = MeasurementPlan(
        Measure("m0", MeasureKind.ROWS), "COUNT(*)", epsilon, sensitivity, 1.0
    )
    return QueryPlan(
        shape=shape,
        table=table,
        measurements=(measure,),
        key_domain={},
        key_literals={},
        bounds=_bounds(table),
        epsilon=epsilon,
        delta=delta,
        confidence=policy.dataset.confidence,
        range_queries=ranges,
    )


def _plan_quantiles(
    shape: QueryShape,
    table: TablePolicy,
    epsilon: float,
    sensitivity: int,
    release: KeyRelease | None,
) -> tuple[QuantilePlan, ...]:
    """One permute-and-flip selection per quantile in the select list, ε split evenly; the
    rank utility's sensitivity is the rows' worth one person keeps (as for COUNT(*))."""
    if release is not None or shape.having is not None:
        raise UnsupportedQueryError(
            "quantiles are answered without GROUP BY or for GROUP BY over columns with public "
            "keys, without HAVING COUNT(*)"
        )
    if any(a.kind is not AggregateKind.QUANTILE for a in shape.aggregates):
        raise UnsupportedQueryError(
            "a quantile cannot share a query with COUNT, SUM or AVG: ask for them in a separate "
            "query (each is charged on its own)"
        )
    option = shape.options.get("quantile_candidates", quantile.DEFAULT_CANDIDATES)
    if float(option) != int(option) or not 2 <= int(option) <= MAX_CANDIDATES:
        raise ParameterError(
            f"quantile_candidates must be an integer in [2, {MAX_CANDIDATES}], got {option:g}"
        )
    if max(table.max_rows_per_group, table.max_rows_per_unit) * QUANTILE_WEIGHT > 2**31:
        raise PolicyError(
            "quantiles need max_rows_per_group and max_rows_per_unit of at most 2**21 (the "
            "histogram's integer weights must not overflow)"
        )
    shares = _split(epsilon, len(shape.aggregates))
    plans = []
    for aggregate, share in zip(shape.aggregates, shares, strict=True):
        column = aggregate.column or ""
        bounds = table.column(column).bounds
        text = shape.virtual[column].meta.get("text", column) if column in shape.virtual else column
        if bounds is None:
            raise PolicyError(
                f"a quantile of {text} needs declared bounds: set "
                f"[tables.{shape.table}.columns.{text}] bounds = [low, high]"
            )
        low, high = (float(b) for b in bounds)
        if not low < high:
            raise PolicyError(f"bounds of {text!r} are one point; a quantile needs low < high")
        if not math.isfinite(high - low):
            raise PolicyError(
                f"bounds of {text!r} are too wide for a quantile (high - low overflows)"
            )
        assert aggregate.quantile is not None
        quantile.quantile_fraction(aggregate.quantile)  # the mechanism's precision, refused here
        # Refuses, before the charge, an ε too small for the exact sampler's arithmetic.
        quantile.epsilon_used(
            share, quantile.utility_sensitivity(aggregate.quantile, sensitivity, QUANTILE_WEIGHT)
        )
        plans.append(
            QuantilePlan(
                column, aggregate.name, aggregate.quantile, low, high, int(option), share,
                sensitivity,
            )
        )  # fmt: skip
    return tuple(plans)


QUANTILE_WEIGHT = 1024
"""Histogram units per row for quantiles: a cell scaled down by a contribution bound loses less
than 1/1024 row per bin to rounding."""

MAX_CANDIDATES = 2**16
"""Largest grid of quantile candidates (``OPTIONS(quantile_candidates=...)``)."""


def _split(epsilon: float, parts: int) -> list[float]:
    """Split ``epsilon`` into ``parts`` shares that sum exactly to it in ledger units."""
    units = Cost.of(epsilon).epsilon_units
    base, extra = divmod(units, parts)
    if base == 0:
        raise ParameterError(
            f"epsilon {epsilon} is too small to split among {parts} noisy measurements"
        )
    return [Cost(base + (i < extra), 0).epsilon for i in range(parts)]


def plan_query(
    shape: QueryShape,
    policy: Policy,
    *,
    epsilon: float,
    delta: float,
    mechanism: str | None = None,
    max_answers: int | None = None,
    keys: Mapping[str, Sequence[exp.Expression]] | None = None,
    partition: tuple[str, tuple[str, ...]] | None = None,
) -> QueryPlan:
    """Check the shape against the policy and price it; raises before any data is read.

    ``mechanism`` (or ``OPTIONS(mechanism=...)``) chooses how keys without a public key set are
    released: "threshold" or "alp" (the combined threshold + ALP synopsis). ``keys`` are the
    public keys of group columns as the database converted them, and ``partition`` the partition
    values the (restricted) WHERE clause reads (see ``dpsql.engine.literals``).
    """
    table = policy.table(shape.table)
    if table is None:
        raise PolicyError(f"table {shape.table!r} is not covered by the privacy policy")
    shape, table = with_virtual_bounds(shape, table)
    if table.privacy_unit not in shape.columns:
        raise SchemaError(
            f"the policy's privacy unit {table.privacy_unit!r} is not a column "
            f"of table {shape.table!r}"
        )
    key_domain: dict[str, tuple[Any, ...]] = {}
    key_literals: dict[str, tuple[exp.Expression, ...]] = {}
    mechanism = _mechanism_option(shape, mechanism)
    if shape.range_join is not None:
        return _plan_ranges(shape, policy, table, epsilon, delta, max_answers)
    if max_answers is not None or "max_answers" in shape.options:
        raise UnsupportedQueryError(
            "max_answers applies to a range JOIN with HAVING (the sparse vector technique)"
        )
    release = _key_release(shape, table, epsilon, delta, mechanism, policy.dataset.confidence)
    converted = keys
    for column in shape.group_by:
        keys = table.column(column).public_keys
        if keys is None:
            continue
        key_domain[column] = tuple(keys)
        if converted is not None and column in converted:
            key_literals[column] = tuple(converted[column])
        else:
            key_literals[column] = tuple(
                key_literal(k, shape.columns[column], column)[1] for k in keys
            )
    if math.prod(len(v) for v in key_domain.values()) > MAX_GROUPS:
        raise UnsupportedQueryError(f"the public key domain has more than {MAX_GROUPS} groups")

    grouped = bool(shape.group_by)
    rows_per_unit = (
        min(table.max_groups_per_unit * table.max_rows_per_group, table.max_rows_per_unit)
        if grouped
        else table.max_rows_per_unit
    )
    if any(a.kind is AggregateKind.QUANTILE for a in shape.aggregates):
        return QueryPlan(
            shape=shape,
            table=table,
            measurements=(),
            key_domain=key_domain,
            key_literals=key_literals,
            bounds=_bounds(table),
            partition=partition,
            epsilon=epsilon,
            delta=delta,
            confidence=policy.dataset.confidence,
            quantiles=_plan_quantiles(shape, table, epsilon, rows_per_unit, release),
        )

    auto = _auto_bounds(shape, table, policy, epsilon)
    if auto is not None:
        rules = table.column(auto.column)
        placeholder = (0.0, 1.0) if auto.mode == "nonnegative" else (-1.0, 1.0)
        columns = {**table.columns, auto.column: rules.model_copy(update={"bounds": placeholder})}
        table = table.model_copy(update={"columns": columns})
    main_epsilon = epsilon if auto is None else auto.rest

    wanted: dict[Measure, str] = {}
    for aggregate in shape.aggregates:
        column = aggregate.column
        if aggregate.kind is AggregateKind.PERSONS:
            if column != table.privacy_unit:
                raise UnsupportedQueryError(
                    f"COUNT(DISTINCT {column}) is supported for the privacy unit only "
                    f"(COUNT(DISTINCT {table.privacy_unit}) counts persons)"
                )
            wanted.setdefault(Measure("", MeasureKind.UNITS, column), aggregate.name)
            continue
        if aggregate.kind is AggregateKind.COUNT:
            kind = MeasureKind.ROWS if column is None else MeasureKind.COUNT
            wanted.setdefault(Measure("", kind, column), aggregate.name)
            continue
        bounds = table.column(column or "").bounds
        if bounds is None:
            raise PolicyError(
                f"{aggregate.kind.value.upper()}({column}) needs declared bounds: "
                f"set [tables.{shape.table}.columns.{column}] bounds = [low, high]"
            )
        wanted.setdefault(Measure("", MeasureKind.SUM, column, (*bounds, 0.0)), f"SUM({column})")
        if aggregate.kind is AggregateKind.AVG:
            wanted.setdefault(
                Measure("", MeasureKind.COUNT, column, (*bounds, 0.0)),
                f"COUNT({column}) within bounds",
            )

    shares = _split(main_epsilon, len(wanted))
    measurements = []
    for index, ((draft, label), share) in enumerate(zip(wanted.items(), shares, strict=True)):
        grid, units = 1.0, rows_per_unit
        clamp = None
        if draft.kind is MeasureKind.UNITS:
            # One person adds at most 1 to each of the groups it keeps a row in.
            units = min(table.max_groups_per_unit, rows_per_unit) if grouped else 1
        if draft.clamp is not None:
            low, high, _ = draft.clamp
            largest = max(abs(low), abs(high))
            if draft.kind is MeasureKind.SUM:
                if largest == 0:
                    raise PolicyError(f"bounds of {draft.column!r} are [0, 0]; nothing to sum")
                grid = choose_grid(rows_per_unit * largest, share)
                # The database rounds values to integers of the grid: keep them within 2**52.
                grid = max(grid, math.ldexp(1.0, math.frexp(largest / 2.0**52)[1]))
                if grid > MAX_GRID:
                    raise PolicyError(
                        f"bounds [{low:g}, {high:g}] of {draft.column!r} are too wide to release "
                        f"a sum exactly at epsilon {share:g}: noise would leave the float range; "
                        "narrow the bounds"
                    )
                units = rows_per_unit * max(math.ceil(abs(low) / grid), math.ceil(abs(high) / grid))
            clamp = (low, high, grid if draft.kind is MeasureKind.SUM else 1.0)
        measure = Measure(f"m{index}", draft.kind, draft.column, clamp)
        measurements.append(MeasurementPlan(measure, label, share, units, grid))

    return QueryPlan(
        shape=shape,
        table=table,
        measurements=tuple(measurements),
        key_domain=key_domain,
        key_literals=key_literals,
        bounds=_bounds(table),
        partition=partition,
        key_release=release,
        auto_bounds=auto,
        epsilon=epsilon,
        delta=delta,
        confidence=policy.dataset.confidence,
    )
