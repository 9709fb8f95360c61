"""The event tree: totals (sequential adds, parallel takes the max) and the JSON round trip."""

from __future__ import annotations

import dataclasses
import json
import math
from fractions import Fraction

import numpy as np
import pytest

from dpsql.accountant.events import (
    Event,
    MechanismEvent,
    ParallelEvent,
    SequentialEvent,
    event_from_dict,
    event_to_dict,
    total,
)
from dpsql.accountant.units import Cost


def _leaf(epsilon: float, delta: float = 0.0, label: str = "") -> MechanismEvent:
    return MechanismEvent("discrete_laplace", epsilon, delta, label)


def test_leaf_total_is_its_cost_rounded_up() -> None:
    assert total(_leaf(0.5, 1e-6)) == Cost(5 * 10**8, 10**12)
    assert total(_leaf(1 / 3)) == Cost(333_333_334, 0)


def test_sequential_adds() -> None:
    tree = SequentialEvent((_leaf(0.1), _leaf(0.2, 1e-7), _leaf(0.3, 2e-7)))
    assert total(tree) == Cost.of(0.6, 3e-7)
    assert total(tree).epsilon == 0.6


def test_sequential_sums_leaves_each_rounded_up() -> None:
    third = _leaf(1 / 3)
    assert total(SequentialEvent((third, third, third))) == Cost(1_000_000_002, 0)


def test_parallel_takes_the_componentwise_max() -> None:
    tree = ParallelEvent((_leaf(1.0), _leaf(0.5, 1e-6), _leaf(0.25, 1e-7)))
    assert total(tree) == Cost.of(1.0, 1e-6)


def test_ten_tenths_in_sequence_is_exactly_one() -> None:
    tree = SequentialEvent(tuple(_leaf(0.1) for _ in range(10)))
    assert total(tree) == Cost.cap(1.0)
    assert total(tree).epsilon == 1.0


def test_empty_nodes_cost_nothing() -> None:
    assert total(SequentialEvent(())) == Cost()
    assert total(ParallelEvent(())) == Cost()


def test_nested_tree() -> None:
    tree = SequentialEvent(
        (
            ParallelEvent((_leaf(0.5), SequentialEvent((_leaf(0.2), _leaf(0.4))))),
            _leaf(0.1, 1e-6),
            ParallelEvent((ParallelEvent((_leaf(0.3, 2e-6),)), _leaf(0.05, 1e-6))),
        )
    )
    assert total(tree) == Cost.of(0.6 + 0.1 + 0.3, 1e-6 + 2e-6)
    assert total(tree) == Cost(10**9, 3 * 10**12)


def _random_tree(rng: np.random.Generator, depth: int) -> Event:
    if depth == 0 or rng.random() < 0.3:
        epsilon = float(rng.choice([0.1, 0.25, 1 / 3, 0.7, 1e-9, 2.0]))
        delta = float(rng.choice([0.0, 1e-9, 1e-6 / 7]))
        return _leaf(epsilon, delta)
    children = tuple(_random_tree(rng, depth - 1) for _ in range(int(rng.integers(0, 4))))
    return SequentialEvent(children) if rng.random() < 0.5 else ParallelEvent(children)


def _reference(event: Event) -> tuple[Fraction, Fraction]:
    """Independent oracle: exact rationals, each leaf rounded up to 1e-9 and 1e-18."""
    if isinstance(event, MechanismEvent):
        epsilon = Fraction(math.ceil(Fraction(repr(event.epsilon)) * 10**9), 10**9)
        delta = Fraction(math.ceil(Fraction(repr(event.delta)) * 10**18), 10**18)
        return epsilon, delta
    parts = [_reference(child) for child in event.events]
    if not parts:
        return Fraction(0), Fraction(0)
    if isinstance(event, SequentialEvent):
        return sum(p[0] for p in parts), sum(p[1] for p in parts)
    return max(p[0] for p in parts), max(p[1] for p in parts)


@pytest.mark.parametrize("seed", range(20))
def test_random_trees_match_an_exact_rational_oracle(seed: int) -> None:
    tree = _random_tree(np.random.Generator(np.random.PCG64(seed)), depth=4)
    epsilon, delta = _reference(tree)
    cost = total(tree)
    assert Fraction(cost.epsilon_units, 10**9) == epsilon
    assert Fraction(cost.delta_units, 10**18) == delta


def test_events_are_frozen_and_hashable() -> None:
    leaf = _leaf(0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        leaf.epsilon = 0.0  # type: ignore[misc]
    tree = SequentialEvent((leaf, ParallelEvent((leaf,))))
    assert len({tree, SequentialEvent((_leaf(0.5), ParallelEvent((_leaf(0.5),))))}) == 1


# --- JSON round trip ---------------------------------------------------------------------------


TREES = [
    MechanismEvent("discrete_laplace", 0.1),
    MechanismEvent(
        "discrete_laplace",
        0.30000000000000004,
        1e-7,
        "SUM(x)",
        (("groups", 12), ("l1_sensitivity", 0.5), ("noise_scale", 2.5), ("valid", True)),
    ),
    MechanismEvent("gaussian", 1 / 3, 1e-6 / 7, 'ünïcode "label"', (("note", None),)),
    SequentialEvent(()),
    SequentialEvent(
        (
            ParallelEvent((_leaf(0.5, label="a"), _leaf(0.25, 1e-9, label="b"))),
            SequentialEvent((_leaf(1e-9),)),
            ParallelEvent(()),
        )
    ),
]


@pytest.mark.parametrize("tree", TREES)
def test_json_round_trip(tree: Event) -> None:
    text = json.dumps(event_to_dict(tree), sort_keys=True)
    back = event_from_dict(json.loads(text))
    assert back == tree
    assert total(back) == total(tree)
    assert json.dumps(event_to_dict(back), sort_keys=True) == text


def test_json_form_of_a_leaf() -> None:
    leaf = MechanismEvent("discrete_laplace", 0.5, 0.0, "COUNT(*)", (("groups", 3),))
    assert event_to_dict(leaf) == {
        "type": "mechanism",
        "mechanism": "discrete_laplace",
        "epsilon": 0.5,
        "delta": 0.0,
        "label": "COUNT(*)",
        "params": {"groups": 3},
    }
    node = event_to_dict(ParallelEvent((leaf,)))
    assert node["type"] == "parallel"
    assert node["events"] == [event_to_dict(leaf)]


def test_integer_epsilon_reads_back_as_float() -> None:
    back = event_from_dict(json.loads(json.dumps(event_to_dict(MechanismEvent("m", 1, 0)))))
    assert isinstance(back, MechanismEvent)
    assert type(back.epsilon) is float
    assert back.epsilon == 1.0


def test_unknown_event_type_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown event type 'rdp'"):
        event_from_dict({"type": "rdp", "events": []})


def test_json_round_trip_keeps_params_in_their_order() -> None:
    leaf = MechanismEvent("m", 0.5, params=(("scale", 2.0), ("groups", 3)))
    assert event_from_dict(json.loads(json.dumps(event_to_dict(leaf)))) == leaf
