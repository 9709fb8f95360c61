"""The ledger: exact totals, atomic refusals, persistence, tamper evidence, concurrency."""

from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql.accountant.events import Event, MechanismEvent, ParallelEvent, SequentialEvent, total
from dpsql.accountant.ledger import _COLUMNS, Ledger, LedgerEntry
from dpsql.accountant.limits import Limits
from dpsql.accountant.units import Cost
from dpsql.errors import BudgetExceededError, LedgerError, PolicyError, PrivacyError

DATASET = "census"
DOCUMENT = {"dataset": {"epsilon": 5.0}, "note": "test policy"}


def _limits(
    epsilon: float = 5.0,
    delta: float = 1e-6,
    analysts: dict[str, tuple[float, float]] | None = None,
) -> Limits:
    if analysts is None:
        analysts = {"alice": (3.0, 1e-6), "bob": (3.0, 1e-6)}
    return Limits(
        Cost.cap(epsilon, delta), {name: Cost.cap(*budget) for name, budget in analysts.items()}
    )


def _event(epsilon: float, delta: float = 0.0) -> MechanismEvent:
    return MechanismEvent("discrete_laplace", epsilon, delta, "COUNT(*)", (("groups", 1),))


def _charge(
    ledger: Ledger, epsilon: float = 0.1, delta: float = 0.0, analyst: str = "alice"
) -> LedgerEntry:
    return ledger.charge(
        analyst=analyst,
        event=_event(epsilon, delta),
        query="SELECT COUNT(*) FROM t",
        plan={"table": "t", "epsilon": epsilon},
        mechanism="discrete_laplace",
    )


def _raw(path: Path) -> list[tuple[Any, ...]]:
    """Every stored row, read with plain sqlite3."""
    connection = sqlite3.connect(path)
    try:
        return connection.execute("SELECT * FROM entries ORDER BY seq").fetchall()
    finally:
        connection.close()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "data.duckdb.dpsql.sqlite"


@pytest.fixture
def ledger(path: Path) -> Iterator[Ledger]:
    opened = Ledger(path, dataset=DATASET)
    opened.set_policy(DOCUMENT, _limits())
    yield opened
    opened.close()


def _spent(ledger: Ledger) -> dict[str, Cost]:
    return {line.name: line.spent for line in ledger.budget()}


# --- totals ------------------------------------------------------------------------------------


def test_totals_equal_the_sum_of_charges(ledger: Ledger) -> None:
    rng = np.random.Generator(np.random.PCG64(1))
    expected = {DATASET: Cost(), "alice": Cost(), "bob": Cost()}
    for _ in range(40):
        epsilon = float(rng.choice([0.01, 0.05, 1 / 30, 0.02]))
        delta = float(rng.choice([0.0, 1e-9, 1e-8 / 3]))
        analyst = str(rng.choice(["alice", "bob"]))
        entry = _charge(ledger, epsilon, delta, analyst)
        assert entry.cost == Cost.of(epsilon, delta) == total(_event(epsilon, delta))
        expected[analyst] = expected[analyst] + entry.cost
        expected[DATASET] = expected[DATASET] + entry.cost
    assert _spent(ledger) == expected
    charges = [e for e in ledger.entries() if e.kind == "charge"]
    assert len(charges) == 40
    summed = Cost()
    for entry in charges:
        summed = summed + entry.cost
    assert summed == expected[DATASET]
    for line in ledger.budget():
        assert line.remaining == line.cap - line.spent


def test_event_trees_are_charged_at_their_total(ledger: Ledger) -> None:
    tree = SequentialEvent(
        (ParallelEvent((_event(0.5), _event(0.2, 1e-7))), _event(0.25), _event(1 / 3, 1e-9))
    )
    entry = ledger.charge(analyst="bob", event=tree, query="q", plan={}, mechanism="m")
    assert entry.cost == total(tree) == Cost(1_083_333_334, 10**11 + 10**9)
    assert json.loads(entry.payload)["type"] == "sequential"
    assert _spent(ledger)["bob"] == total(tree)


def test_a_charge_is_remembered_as_another_process_reads_it_back(
    ledger: Ledger, path: Path
) -> None:
    """The charging ledger keeps its own new charge without parsing it back from the file; a
    ledger that reads the file must hold the very same charges and totals."""
    gaussian = MechanismEvent(
        "gaussian", 0.3, 1e-7, "SUM(x)", (("zcdp_rho", 0.02), ("zcdp_delta", 1e-8))
    )
    trees: list[Event] = [
        _event(0.1),
        _event(0.2, 1e-9),
        gaussian,
        SequentialEvent((ParallelEvent((_event(0.5), gaussian)), _event(0.25))),
    ]
    for i, tree in enumerate(trees):
        ledger.charge(
            analyst=("alice", "bob")[i % 2], event=tree, query="q", plan={}, mechanism="m",
            partition=("t.region", ("north", "south")) if i == 1 else None,
        )  # fmt: skip
    reader = Ledger(path, dataset=DATASET)
    try:
        reader._charges(reader._connection)
        assert reader._cache == ledger._cache
        assert reader.budget() == ledger.budget()
    finally:
        reader.close()


def test_charges_reach_the_cap_exactly_and_then_stop(path: Path) -> None:
    ledger = Ledger(path, dataset=DATASET)
    ledger.set_policy(DOCUMENT, _limits(1.0, 0.0, {"alice": (1.0, 0.0)}))
    for _ in range(10):
        _charge(ledger, 0.1)
    lines = ledger.budget()
    assert all(line.spent == line.cap == Cost.cap(1.0) for line in lines)
    assert all(line.remaining == Cost() for line in lines)
    with pytest.raises(BudgetExceededError):
        _charge(ledger, 1e-9)
    ledger.close()


def test_budget_for_one_analyst(ledger: Ledger) -> None:
    _charge(ledger, 0.5, analyst="bob")
    lines = ledger.budget("bob")
    assert [(line.scope, line.name) for line in lines] == [("dataset", DATASET), ("analyst", "bob")]
    assert lines[1].remaining == Cost.cap(2.5, 1e-6)
    with pytest.raises(PolicyError, match="'mallory' has no allocation"):
        ledger.budget("mallory")


# --- refusals change nothing -------------------------------------------------------------------


def _numbers(message: str) -> tuple[float, float, float, float]:
    match = re.search(
        r"needs epsilon=(\S+), delta=(\S+) but .* has epsilon=(\S+), delta=(\S+) remaining", message
    )
    assert match, message
    return tuple(float(group) for group in match.groups())  # type: ignore[return-value]


def test_refusal_over_the_dataset_cap(path: Path) -> None:
    ledger = Ledger(path, dataset=DATASET)
    ledger.set_policy(DOCUMENT, _limits(1.0, 1e-6, {"alice": (1.0, 1e-6), "bob": (1.0, 1e-6)}))
    _charge(ledger, 0.6, analyst="alice")
    before = _raw(path)
    with pytest.raises(BudgetExceededError) as caught:
        _charge(ledger, 0.5, analyst="bob")
    message = str(caught.value)
    assert f"dataset {DATASET!r} cap" in message
    assert _numbers(message) == (0.5, 0.0, 0.4, 1e-6)
    assert _raw(path) == before
    assert _spent(ledger)["bob"] == Cost()
    assert isinstance(caught.value, PrivacyError)
    ledger.close()


def test_refusal_over_the_analyst_allocation(path: Path) -> None:
    ledger = Ledger(path, dataset=DATASET)
    ledger.set_policy(DOCUMENT, _limits(5.0, 1e-6, {"alice": (0.3, 1e-6), "bob": (5.0, 1e-6)}))
    _charge(ledger, 0.1, analyst="alice")
    before = _raw(path)
    with pytest.raises(BudgetExceededError) as caught:
        _charge(ledger, 0.25, analyst="alice")
    message = str(caught.value)
    assert "analyst 'alice' allocation" in message
    assert _numbers(message) == (0.25, 0.0, 0.2, 1e-6)
    assert _raw(path) == before
    _charge(ledger, 0.25, analyst="bob")
    ledger.close()


def test_refusal_over_delta(path: Path) -> None:
    ledger = Ledger(path, dataset=DATASET)
    ledger.set_policy(DOCUMENT, _limits(5.0, 1e-6, {"alice": (5.0, 1e-6)}))
    _charge(ledger, 0.1, 7e-7)
    before = _raw(path)
    with pytest.raises(BudgetExceededError) as caught:
        _charge(ledger, 0.1, 4e-7)
    assert _numbers(str(caught.value))[1] == 4e-7
    assert _numbers(str(caught.value))[3] == pytest.approx(3e-7)
    assert _raw(path) == before
    ledger.close()


def test_refusal_for_an_unknown_analyst(ledger: Ledger, path: Path) -> None:
    before = _raw(path)
    with pytest.raises(PolicyError, match="analyst 'mallory' has no allocation in the policy"):
        _charge(ledger, 0.1, analyst="mallory")
    assert _raw(path) == before


def test_refusal_without_a_policy(path: Path) -> None:
    ledger = Ledger(path, dataset=DATASET)
    with pytest.raises(PolicyError, match="no privacy policy is set"):
        _charge(ledger, 0.1)
    assert _raw(path) == []
    assert ledger.policy() is None
    with pytest.raises(PolicyError):
        ledger.budget()
    ledger.close()


def test_refusal_message_shows_remaining_below_requested(ledger: Ledger) -> None:
    _charge(ledger, 1e-9)
    with pytest.raises(BudgetExceededError) as caught:
        _charge(ledger, 3.0)
    needed, _, remaining, _ = _numbers(str(caught.value))
    assert remaining < needed


def test_a_negative_charge_is_refused(ledger: Ledger, path: Path) -> None:
    before = _raw(path)
    with pytest.raises((PrivacyError, ValueError)):
        _charge(ledger, -1.0)
    assert _raw(path) == before


# --- persistence -------------------------------------------------------------------------------


def test_the_ledger_survives_close_and_reopen(path: Path) -> None:
    ledger = Ledger(path, dataset=DATASET)
    ledger.set_policy(DOCUMENT, _limits())
    for epsilon in (0.1, 0.2, 0.3):
        _charge(ledger, epsilon, 1e-8)
    entries, budget = ledger.entries(), ledger.budget()
    ledger.close()
    reopened = Ledger(path, dataset=DATASET)
    assert reopened.entries() == entries
    assert reopened.budget() == budget
    assert reopened.verify() == 4
    assert reopened.policy() == DOCUMENT
    _charge(reopened, 0.4)
    assert reopened.entries()[-1].prev_hash == entries[-1].hash
    assert reopened.entries()[-1].seq == 5
    reopened.close()


def test_the_policy_in_force_is_found_by_index_also_in_older_ledgers(path: Path) -> None:
    """Every query reads the newest policy entry; SQLite must seek to it, not walk back over
    every charge since (a query's ledger work would grow with the ledger)."""
    ledger = Ledger(path, dataset=DATASET)
    ledger.set_policy(DOCUMENT, _limits(epsilon=100.0, analysts={"alice": (100.0, 1e-6)}))
    for _ in range(5):
        _charge(ledger)
    newer = {**DOCUMENT, "note": "newer"}
    ledger.set_policy(newer, _limits(epsilon=100.0, analysts={"alice": (100.0, 1e-6)}))
    _charge(ledger)
    ledger.close()
    raw = sqlite3.connect(path)
    raw.execute("DROP INDEX entries_by_kind")  # a ledger written before the index existed
    raw.commit()
    raw.close()
    reopened = Ledger(path, dataset=DATASET)
    assert reopened.policy() == newer
    plan = reopened._connection.execute(
        "EXPLAIN QUERY PLAN SELECT payload FROM entries WHERE kind = 'policy' "
        "ORDER BY seq DESC LIMIT 1"
    ).fetchall()
    assert "USING INDEX entries_by_kind" in " ".join(str(step[-1]) for step in plan)
    assert reopened.verify() == 8
    reopened.close()


def test_entries_form_a_hash_chain(ledger: Ledger) -> None:
    for _ in range(3):
        _charge(ledger)
    entries = ledger.entries()
    assert [e.seq for e in entries] == [1, 2, 3, 4]
    assert entries[0].prev_hash == "0" * 64
    for previous, entry in itertools.pairwise(entries):
        assert entry.prev_hash == previous.hash
    assert all(e.digest() == e.hash for e in entries)
    assert len({e.hash for e in entries}) == 4
    data = entries[1].to_dict()
    assert data["epsilon"] == 0.1
    assert data["payload"]["type"] == "mechanism"
    assert data["plan"] == {"epsilon": 0.1, "table": "t"}


# --- policy changes ----------------------------------------------------------------------------


def test_set_policy_refuses_a_cap_below_what_was_spent(ledger: Ledger, path: Path) -> None:
    _charge(ledger, 1.5, 1e-7, analyst="alice")
    _charge(ledger, 1.0, analyst="bob")
    before = _raw(path)
    with pytest.raises(PolicyError, match=r"dataset cap .* is below what was already spent"):
        ledger.set_policy(DOCUMENT, _limits(2.4, 1e-6))
    with pytest.raises(PolicyError, match=r"dataset cap \(epsilon=5, delta=0\)"):
        ledger.set_policy(DOCUMENT, _limits(5.0, 0.0))
    with pytest.raises(PolicyError, match=r"analyst 'alice'.* below what they already spent"):
        ledger.set_policy(DOCUMENT, _limits(5.0, 1e-6, {"alice": (1.4, 0.0), "bob": (3.0, 0.0)}))
    assert _raw(path) == before
    ledger.set_policy({"v": 2}, _limits(2.5, 1e-7, {"alice": (1.5, 1e-7), "bob": (1.0, 0.0)}))
    assert ledger.policy() == {"v": 2}
    with pytest.raises(BudgetExceededError):
        _charge(ledger, 1e-9, analyst="bob")


def test_raising_a_cap_is_allowed_and_takes_effect(ledger: Ledger) -> None:
    _charge(ledger, 3.0, analyst="alice")
    with pytest.raises(BudgetExceededError):
        _charge(ledger, 0.5, analyst="alice")
    ledger.set_policy({"v": 3}, _limits(8.0, 1e-6, {"alice": (4.0, 1e-6), "bob": (3.0, 1e-6)}))
    _charge(ledger, 0.5, analyst="alice")
    assert _spent(ledger)["alice"] == Cost.of(3.5)
    kinds = [e.kind for e in ledger.entries()]
    assert kinds == ["policy", "charge", "policy", "charge"]


# --- append-only and tamper evidence -----------------------------------------------------------


def test_update_and_delete_are_blocked_by_triggers(ledger: Ledger, path: Path) -> None:
    _charge(ledger)
    before = _raw(path)
    connection = sqlite3.connect(path)
    try:
        for statement in (
            "UPDATE entries SET epsilon_units = 0",
            "UPDATE entries SET analyst = 'bob' WHERE seq = 2",
            "DELETE FROM entries WHERE seq = 2",
            "DELETE FROM entries",
        ):
            with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                connection.execute(statement)
        connection.commit()
    finally:
        connection.close()
    assert _raw(path) == before
    assert ledger.verify() == 2


def _ledger_with_charges(path: Path) -> None:
    ledger = Ledger(path, dataset=DATASET)
    ledger.set_policy(DOCUMENT, _limits())
    for epsilon in (0.5, 0.25, 0.125, 0.0625):
        _charge(ledger, epsilon)
    ledger.close()


def _tamper(path: Path, *statements: str, parameters: tuple[Any, ...] = ()) -> None:
    connection = sqlite3.connect(path)
    try:
        connection.execute("DROP TRIGGER entries_no_update")
        connection.execute("DROP TRIGGER entries_no_delete")
        for statement in statements:
            connection.execute(statement, parameters if "?" in statement else ())
        connection.commit()
    finally:
        connection.close()


def _rehash(path: Path, seq: int) -> None:
    """Recompute one entry's own hash after editing it, as a careless forger would."""
    connection = sqlite3.connect(path)
    try:
        row = connection.execute("SELECT * FROM entries WHERE seq = ?", (seq,)).fetchone()
        digest = LedgerEntry(*row).digest()
        connection.execute("UPDATE entries SET hash = ? WHERE seq = ?", (digest, seq))
        connection.commit()
    finally:
        connection.close()


TAMPERING = {
    "edit_epsilon_units": (
        ["UPDATE entries SET epsilon_units = 1 WHERE seq = 3"],
        False,
        r"at entry 3: its contents do not match its hash \(edited\)",
    ),
    "edit_epsilon_units_and_rehash": (
        ["UPDATE entries SET epsilon_units = 1 WHERE seq = 3"],
        True,
        r"at entry 3: its recorded cost differs from its event tree",
    ),
    "edit_payload_and_units_and_rehash_breaks_the_chain": (
        [
            "UPDATE entries SET epsilon_units = 1, payload = replace(payload, '0.25', '1e-09') "
            "WHERE seq = 3"
        ],
        True,
        r"at entry 4: does not follow the entry before it",
    ),
    "edit_the_policy_cap": (
        ["UPDATE entries SET payload = replace(payload, '5000000000', '9000000000') WHERE seq = 1"],
        False,
        r"at entry 1: its contents do not match its hash",
    ),
    "edit_the_analyst": (
        ["UPDATE entries SET analyst = 'bob' WHERE seq = 2"],
        False,
        r"at entry 2: its contents do not match its hash",
    ),
    "delete_an_entry": (
        ["DELETE FROM entries WHERE seq = 2"],
        False,
        r"at entry 3: sequence gap: expected entry 2, found 3",
    ),
    "delete_and_renumber": (
        [
            "DELETE FROM entries WHERE seq = 2",
            "UPDATE entries SET seq = seq - 1 WHERE seq > 2",
        ],
        False,
        r"at entry 2: does not follow the entry before it \(deleted or reordered entries\)",
    ),
    "reorder_two_entries": (
        [
            "UPDATE entries SET seq = -3 WHERE seq = 3",
            "UPDATE entries SET seq = 3 WHERE seq = 2",
            "UPDATE entries SET seq = 2 WHERE seq = -3",
        ],
        False,
        r"at entry 2: does not follow the entry before it",
    ),
    "garbage_payload": (
        ["UPDATE entries SET payload = 'not json' WHERE seq = 4"],
        True,
        r"at entry 4: its recorded cost differs from its event tree",
    ),
}


@pytest.mark.parametrize("case", TAMPERING, ids=list(TAMPERING))
def test_tampering_is_detected_on_reopen(path: Path, case: str) -> None:
    statements, rehash, problem = TAMPERING[case]
    _ledger_with_charges(path)
    _tamper(path, *statements)
    if rehash:
        seq = int(re.search(r"entry (\d)", problem).group(1))  # type: ignore[union-attr]
        _rehash(path, seq if "follow" not in problem else seq - 1)
    with pytest.raises(LedgerError, match=problem) as caught:
        Ledger(path, dataset=DATASET)
    assert "fails verification" in str(caught.value)
    assert "all queries are stopped" in str(caught.value)


def test_tampering_is_detected_by_verify_on_an_open_ledger(path: Path) -> None:
    _ledger_with_charges(path)
    ledger = Ledger(path, dataset=DATASET)
    assert ledger.verify() == 5
    _tamper(path, "UPDATE entries SET delta_units = 5 WHERE seq = 5")
    with pytest.raises(LedgerError, match="at entry 5"):
        ledger.verify()
    ledger.close()


def test_triggers_come_back_on_reopen(path: Path) -> None:
    _ledger_with_charges(path)
    _tamper(path)
    Ledger(path, dataset=DATASET).close()
    connection = sqlite3.connect(path)
    try:
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            connection.execute("DELETE FROM entries")
    finally:
        connection.close()


def test_a_garbage_file_is_a_ledger_error(path: Path) -> None:
    path.write_bytes(b"definitely not a SQLite database\x00" * 200)
    with pytest.raises(LedgerError, match="unreadable"):
        Ledger(path, dataset=DATASET)


def test_a_foreign_sqlite_file_is_a_ledger_error(path: Path) -> None:
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE entries (id INTEGER, note TEXT)")
    connection.execute("INSERT INTO entries VALUES (1, 'hello')")
    connection.commit()
    connection.close()
    with pytest.raises(LedgerError, match="unreadable"):
        Ledger(path, dataset=DATASET)


def test_an_unopenable_path_is_a_ledger_error(tmp_path: Path) -> None:
    with pytest.raises(LedgerError):
        Ledger(tmp_path / "no" / "such" / "directory" / "ledger.sqlite", dataset=DATASET)
    with pytest.raises(LedgerError):
        Ledger(tmp_path, dataset=DATASET)


# --- concurrency -------------------------------------------------------------------------------

PROCESSES = 4
CHARGES_PER_PROCESS = 30


def _charge_many(
    path: Path, analyst: str, barrier: Any, results: Any, charges: int = CHARGES_PER_PROCESS
) -> None:
    """Worker: open the ledger, wait for the others, try ``charges`` charges of 0.1."""
    ledger = Ledger(path, dataset=DATASET)
    barrier.wait(timeout=60)
    succeeded = 0
    for _ in range(charges):
        try:
            _charge(ledger, 0.1, analyst=analyst)
            succeeded += 1
        except BudgetExceededError:
            pass
    ledger.close()
    results.put(succeeded)


def _race(path: Path, analysts: list[str]) -> list[int]:
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(len(analysts))
    results = context.Queue()
    workers = [
        context.Process(target=_charge_many, args=(path, name, barrier, results))
        for name in analysts
    ]
    for worker in workers:
        worker.start()
    counts = [results.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    return counts


def test_concurrent_processes_never_pass_the_dataset_cap(path: Path) -> None:
    names = [f"analyst{i}" for i in range(PROCESSES)]
    ledger = Ledger(path, dataset=DATASET)
    ledger.set_policy(DOCUMENT, _limits(5.0, 0.0, {name: (5.0, 0.0) for name in names}))
    ledger.close()
    counts = _race(path, names)
    assert sum(counts) == 50
    assert all(0 <= c <= CHARGES_PER_PROCESS for c in counts)
    reopened = Ledger(path, dataset=DATASET)
    assert reopened.verify() == 1 + 50
    lines = {line.name: line for line in reopened.budget()}
    assert lines[DATASET].spent == Cost.cap(5.0)
    assert sorted(lines[name].spent.epsilon_units for name in names) == sorted(
        c * 10**8 for c in counts
    )
    reopened.close()


def test_concurrent_processes_of_one_analyst_never_pass_the_allocation(path: Path) -> None:
    ledger = Ledger(path, dataset=DATASET)
    ledger.set_policy(DOCUMENT, _limits(10.0, 0.0, {"alice": (2.0, 0.0)}))
    ledger.close()
    counts = _race(path, ["alice"] * PROCESSES)
    assert sum(counts) == 20
    reopened = Ledger(path, dataset=DATASET)
    assert reopened.verify() == 21
    assert _spent(reopened) == {DATASET: Cost.cap(2.0), "alice": Cost.cap(2.0)}
    reopened.close()


def _event_types() -> list[type[Event]]:
    return [MechanismEvent, SequentialEvent, ParallelEvent]


def test_every_event_type_can_be_charged_and_verified(path: Path) -> None:
    ledger = Ledger(path, dataset=DATASET)
    ledger.set_policy(DOCUMENT, _limits())
    for kind in _event_types():
        event = _event(0.1) if kind is MechanismEvent else kind((_event(0.1), _event(0.2)))
        ledger.charge(analyst="alice", event=event, query="q", plan={}, mechanism="m")
    ledger.close()
    reopened = Ledger(path, dataset=DATASET)
    assert reopened.verify() == 4
    assert _spent(reopened)["alice"] == Cost.of(0.1) + Cost.of(0.3) + Cost.of(0.2)
    reopened.close()


# --- refusal messages state a comparison that is true -------------------------------------------


def test_a_refusal_names_the_comparison_that_fails(tmp_path: Path) -> None:
    """Under advanced composition, 200 charges of 0.01 spend about 0.76 of a cap of 1 (basic:
    2.0); a charge of 0.2 is refused although 0.2 < the 0.24 shown as remaining, and the message
    says so instead of implying 0.2 > 0.24. A delta refusal names delta."""
    ledger = Ledger(tmp_path / "advanced.sqlite", dataset=DATASET)
    limits = Limits(Cost.cap(1.0, 1e-5), {"alice": Cost.cap(100.0, 1e-5)}, advanced_delta=1e-6)
    ledger.set_policy(DOCUMENT, limits)
    try:
        for _ in range(200):
            _charge(ledger, epsilon=0.01)
        with pytest.raises(BudgetExceededError) as refused:
            _charge(ledger, epsilon=0.2)
        message = str(refused.value)
        needs, left = re.search(
            r"needs epsilon=([\d.e-]+).*has epsilon=([\d.e-]+)", message
        ).groups()
        assert float(needs) < float(left)
        assert "the cost fits what remains, but the composed total" in message
        with pytest.raises(BudgetExceededError, match=r"\(delta 2e-05 > 9e-06\)"):
            _charge(ledger, epsilon=0.001, delta=2e-5)
    finally:
        ledger.close()


def test_entries_record_who_acted_and_older_entries_still_verify(tmp_path: Path) -> None:
    """A ledger written before the actor column existed opens, verifies and gains the column;
    new entries carry the operating-system user (or what ``Ledger.actor`` says) in their hash."""
    path = tmp_path / "old.sqlite"
    old = LedgerEntry(
        1,
        "2026-01-01T00:00:00",
        "policy",
        DATASET,
        None,
        None,
        None,
        None,
        json.dumps({"document": DOCUMENT, "limits": _limits().to_dict()}, sort_keys=True),
        None,
        0,
        0,
        "0" * 64,
        "",
    )
    old = LedgerEntry(**{**old.__dict__, "hash": old.digest()})
    connection = sqlite3.connect(path)
    columns = [c for c in _COLUMNS if c != "actor"]
    connection.execute(f"CREATE TABLE entries ({', '.join(columns)})")
    connection.execute(
        f"INSERT INTO entries VALUES ({', '.join('?' * len(columns))})",
        tuple(getattr(old, c) for c in columns),
    )
    connection.commit()
    connection.close()
    ledger = Ledger(path, dataset=DATASET)
    try:
        assert ledger.verify() == 1
        ledger.actor = {"os_user": "ops", "token": "service-7"}
        entry = _charge(ledger, epsilon=0.1)
        assert json.loads(entry.actor or "") == {"os_user": "ops", "token": "service-7"}
        assert ledger.verify() == 2
        assert ledger.entries()[0].actor is None
    finally:
        ledger.close()
    edited = sqlite3.connect(path)
    edited.execute("DROP TRIGGER IF EXISTS entries_no_update")
    edited.execute('UPDATE entries SET actor = \'{"os_user": "someone else"}\' WHERE seq = 2')
    edited.commit()
    edited.close()
    with pytest.raises(LedgerError, match="entry 2: its contents do not match its hash"):
        Ledger(path, dataset=DATASET)


# --- one read per charge -------------------------------------------------------------------------


def _statements(ledger: Ledger) -> list[str]:
    """The statements ``ledger`` runs from now on (SQLite's trace of its connection)."""
    run: list[str] = []
    ledger._connection.set_trace_callback(run.append)
    return run


def test_a_charge_reads_the_file_once(ledger: Ledger) -> None:
    """A charge locks the file, reads what is new since its last read in one statement
    (charges, policy, the last entry), appends and commits: four statements."""
    _charge(ledger)
    run = _statements(ledger)
    _charge(ledger, 0.2)
    assert [statement.split()[0] for statement in run] == ["BEGIN", "SELECT", "INSERT", "COMMIT"]


def test_entries_of_other_processes_between_charges_are_all_read(
    ledger: Ledger, path: Path
) -> None:
    """Charges, a policy and a token event written by another ledger between two charges of
    this one: the second charge counts them, follows the last of them in the chain, and works
    under the new policy."""
    _charge(ledger, 0.5)
    other = Ledger(path, dataset=DATASET)
    try:
        _charge(other, 0.25, analyst="bob")
        other.set_policy(DOCUMENT, _limits(epsilon=2.0, analysts={"alice": (0.9, 1e-6)}))
        other.record_token_event(analyst="alice", payload={"event": "created"})
        _charge(other, 0.125)
    finally:
        other.close()
    with pytest.raises(BudgetExceededError, match="allocation"):
        _charge(ledger, 0.3)  # 0.5 + 0.125 + 0.3 > alice's new 0.9
    entry = _charge(ledger, 0.25)
    assert entry.seq == 7 and entry.prev_hash == ledger.entries()[5].hash
    reader = Ledger(path, dataset=DATASET)
    try:
        assert reader.verify() == 7
        assert reader.budget() == ledger.budget()
        assert _spent(reader)["alice"] == Cost.of(0.5) + Cost.of(0.125) + Cost.of(0.25)
    finally:
        reader.close()


def test_a_charge_planned_under_an_older_policy_records_nothing(
    ledger: Ledger, path: Path
) -> None:
    """The policy entry the query was planned under is checked with the file locked: a policy
    set in between refuses the charge (the plan may not hold under it)."""
    planned_under = ledger.policy_entry()
    assert ledger.charge(
        analyst="alice", event=_event(0.1), query="q", plan={}, mechanism="m",
        policy_entry=planned_under,
    ).seq == 2  # fmt: skip
    other = Ledger(path, dataset=DATASET)
    other.set_policy(DOCUMENT, _limits(epsilon=4.0))
    other.close()
    before = _raw(path)
    with pytest.raises(PolicyError, match="policy changed while this query was planned"):
        ledger.charge(
            analyst="alice", event=_event(0.1), query="q", plan={}, mechanism="m",
            policy_entry=planned_under,
        )  # fmt: skip
    assert _raw(path) == before
    assert ledger.charge(
        analyst="alice", event=_event(0.1), query="q", plan={}, mechanism="m",
        policy_entry=ledger.policy_entry(),
    ).seq == 4  # fmt: skip


def test_a_ledger_changed_under_an_open_one_stops_charging(ledger: Ledger, path: Path) -> None:
    """The entry a ledger read last is read again with the new ones: when it is no longer the
    same (the file was rewritten), nothing is appended after a state that is not the file's."""
    _charge(ledger, 0.5)
    _tamper(path, "UPDATE entries SET hash = ? WHERE seq = 2", parameters=("f" * 64,))
    before = _raw(path)
    for _ in range(2):  # it stays stopped
        with pytest.raises(LedgerError, match="changed under this process: entry 2"):
            _charge(ledger, 0.1)
    assert _raw(path) == before


def test_a_ledger_that_forgot_what_it_read_reads_it_all_again(ledger: Ledger, path: Path) -> None:
    """After a failed commit the ledger drops what it read (it may hold a charge the file does
    not): the next charge reads the whole file and counts exactly what is there."""
    for epsilon in (0.5, 0.25):
        _charge(ledger, epsilon, analyst="bob")
    ledger._forget()
    _charge(ledger, 0.125)
    reader = Ledger(path, dataset=DATASET)
    try:
        assert reader.budget() == ledger.budget()
        assert ledger._cache == reader._cache
    finally:
        reader.close()


# --- the hash of an entry --------------------------------------------------------------------

_TEXT = st.one_of(st.none(), st.text(max_size=40), st.text(st.characters(), max_size=400))


@settings(max_examples=300, deadline=None)
@given(
    fields=st.fixed_dictionaries(
        {
            "seq": st.integers(1, 2**62),
            "time": st.text(max_size=40),
            "kind": st.sampled_from(["charge", "policy", "token"]),
            "dataset": st.text(max_size=20),
            "analyst": _TEXT,
            "query": _TEXT,
            "plan": _TEXT,
            "mechanism": _TEXT,
            "payload": st.text(st.characters(), max_size=400),
            "partition": _TEXT,
            "epsilon_units": st.integers(-(2**63), 2**63),
            "delta_units": st.integers(0, 2**70),
            "prev_hash": st.text("0123456789abcdef", min_size=64, max_size=64),
            "hash": st.just(""),
            "actor": _TEXT,
            "period": _TEXT,
        }
    )
)
def test_an_entrys_hash_is_sha256_of_its_sorted_json(fields: dict[str, Any]) -> None:
    """The hash is written field by field; it must be the hash of what ``json.dumps`` writes
    (every ledger ever written was hashed that way): any text (quotes, controls, non-ASCII,
    lone surrogates), integers of any size, and None, with actor and period left out when
    None."""
    reference = {
        k: v
        for k, v in fields.items()
        if k != "hash" and not (k in ("actor", "period") and v is None)
    }
    expected = hashlib.sha256(json.dumps(reference, sort_keys=True).encode()).hexdigest()
    assert LedgerEntry(**fields).digest() == expected


def test_a_policy_whose_limits_cannot_be_read_fails_verification(path: Path) -> None:
    """A re-hashed policy entry whose payload holds no limits (a forger who rewrote the chain)
    is named on opening, as any other entry that fails verification, not a crash."""
    ledger = Ledger(path, dataset=DATASET)
    ledger.set_policy(DOCUMENT, _limits())
    ledger.close()
    _tamper(path, "UPDATE entries SET payload = '{\"document\": {}}' WHERE seq = 1")
    _rehash(path, 1)
    with pytest.raises(LedgerError, match="at entry 1: its policy's limits cannot be read"):
        Ledger(path, dataset=DATASET)
