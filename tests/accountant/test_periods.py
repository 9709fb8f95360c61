"""Budget periods: caps renew per calendar month, every charge records its period, older ledgers
keep verifying, and charges made before renewal stay counted."""

from __future__ import annotations

import datetime as dt
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from dpsql.accountant.ledger import _TABLE, _TRIGGERS, Ledger
from dpsql.errors import BudgetExceededError, LedgerError, PolicyError
from tests.accountant.test_ledger import DATASET, DOCUMENT, _charge, _limits

NOVEMBER = dt.datetime(2026, 11, 30, 23, 59, 59, tzinfo=dt.UTC)
DECEMBER = dt.datetime(2026, 12, 1, 0, 0, 1, tzinfo=dt.UTC)


def _ledger(path: Path, period: str | None, when: dt.datetime) -> Ledger:
    ledger = Ledger(path, dataset=DATASET)
    ledger.clock = lambda: when
    ledger.set_policy(DOCUMENT, replace(_limits(), period=period))
    return ledger


def test_the_caps_renew_each_month_and_every_charge_records_its_period(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path / "l.sqlite", "month", NOVEMBER)
    for _ in range(3):
        _charge(ledger, 1.0)
    with pytest.raises(BudgetExceededError, match="in budget period 2026-11"):
        _charge(ledger, 0.5)
    alice = next(line for line in ledger.budget() if line.name == "alice")
    assert (alice.period, alice.spent.epsilon, alice.remaining.epsilon) == ("2026-11", 3.0, 0.0)
    ledger.clock = lambda: DECEMBER
    entry = _charge(ledger, 1.0)
    assert entry.period == "2026-12"
    alice = next(line for line in ledger.budget() if line.name == "alice")
    assert (alice.period, alice.spent.epsilon) == ("2026-12", 1.0)
    assert [e.period for e in ledger.entries()] == [None, *["2026-11"] * 3, "2026-12"]
    assert ledger.verify() == 5
    ledger.close()


def test_the_period_is_in_the_hash(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    ledger = _ledger(path, "month", NOVEMBER)
    _charge(ledger, 1.0)
    ledger.close()
    connection = sqlite3.connect(path)
    connection.execute("DROP TRIGGER entries_no_update")
    connection.execute("UPDATE entries SET period = '2026-12' WHERE seq = 2")
    connection.commit()
    connection.close()
    with pytest.raises(LedgerError, match="entry 2: its contents do not match its hash"):
        Ledger(path, dataset=DATASET)


def test_a_ledger_written_before_periods_verifies_and_its_charges_count(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    ledger = _ledger(path, None, NOVEMBER)
    _charge(ledger, 2.0)
    ledger.close()
    # Rebuild the file as an older dpsql wrote it: no period column.
    connection = sqlite3.connect(path)
    columns = "seq, time, kind, dataset, analyst, query, plan, mechanism, payload, partition, " \
        "epsilon_units, delta_units, prev_hash, hash, actor"  # fmt: skip
    connection.executescript(
        "DROP TRIGGER entries_no_update; DROP TRIGGER entries_no_delete;"
        "ALTER TABLE entries RENAME TO newer;"
        + _TABLE.replace(",\n    period TEXT", "") + ";"
        + f"INSERT INTO entries SELECT {columns} FROM newer; DROP TABLE newer;"
        + ";".join(_TRIGGERS) + ";"
    )
    connection.close()
    reopened = Ledger(path, dataset=DATASET)  # adds the column; the chain is unchanged
    reopened.clock = lambda: DECEMBER
    assert reopened.verify() == 2
    # Switching to monthly renewal later: the unlabelled charge stays counted in every period.
    reopened.set_policy(DOCUMENT, replace(_limits(), period="month"))
    alice = next(line for line in reopened.budget() if line.name == "alice")
    assert (alice.period, alice.spent.epsilon) == ("2026-12", 2.0)
    with pytest.raises(BudgetExceededError):
        _charge(reopened, 1.5)
    assert _charge(reopened, 1.0).period == "2026-12"
    assert reopened.verify() == 4
    reopened.close()


def test_without_a_period_labelled_charges_all_count(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path / "l.sqlite", "month", NOVEMBER)
    _charge(ledger, 2.0)
    ledger.clock = lambda: DECEMBER
    _charge(ledger, 2.0)
    with pytest.raises(PolicyError, match=r"below what they already spent \(epsilon=4,"):
        ledger.set_policy(DOCUMENT, _limits())  # 4.0 spent in all > alice's 3.0
    ledger.close()


MARCH = dt.datetime(2026, 3, 2, 10, 0, tzinfo=dt.UTC)
OCTOBER = dt.datetime(2026, 10, 15, 12, 0, tzinfo=dt.UTC)
EARLY_NOVEMBER = dt.datetime(2026, 11, 2, 9, 0, tzinfo=dt.UTC)
JANUARY = dt.datetime(2027, 1, 4, 9, 0, tzinfo=dt.UTC)


def _switch(ledger: Ledger, period: str | None, when: dt.datetime, **more) -> None:
    ledger.clock = lambda: when
    ledger.set_policy(DOCUMENT, replace(_limits(), period=period, **more))


def _spent(ledger: Ledger, name: str = "alice") -> tuple[str | None, float]:
    line = next(line for line in ledger.budget() if line.name == name)
    return line.period, round(line.spent.epsilon, 9)


# advanced composition recounts the window's steps itself: a step left out would lower its bound
@pytest.mark.parametrize("advanced", [None, 1e-6])
def test_month_to_year_counts_the_months_charges_in_the_year(tmp_path: Path, advanced) -> None:
    ledger = _ledger(tmp_path / "l.sqlite", "month", OCTOBER)
    _charge(ledger, 1.0)
    ledger.clock = lambda: EARLY_NOVEMBER
    _charge(ledger, 1.5)
    _switch(ledger, "year", NOVEMBER, advanced_delta=advanced)
    assert _spent(ledger) == ("2026", 2.5)  # October's and November's charges, labelled by month
    with pytest.raises(BudgetExceededError, match="in budget period 2026"):
        _charge(ledger, 1.0)
    assert _charge(ledger, 0.5).period == "2026"
    assert _spent(ledger) == ("2026", 3.0)
    ledger.clock = lambda: JANUARY
    assert _spent(ledger) == ("2027", 0.0)  # a new year, under the policy in force
    assert ledger.verify() == 5
    ledger.close()


@pytest.mark.parametrize("advanced", [None, 1e-6])
def test_year_to_month_counts_this_months_charges_made_under_the_year(
    tmp_path: Path, advanced
) -> None:
    path = tmp_path / "l.sqlite"
    ledger = _ledger(path, "year", MARCH)
    _charge(ledger, 1.0)
    ledger.clock = lambda: EARLY_NOVEMBER
    entry = _charge(ledger, 1.5)
    assert entry.period == "2026"
    _switch(ledger, "month", NOVEMBER, advanced_delta=advanced)
    assert _spent(ledger) == ("2026-11", 1.5)  # November's, not March's
    with pytest.raises(BudgetExceededError, match="in budget period 2026-11"):
        _charge(ledger, 2.0)
    assert _charge(ledger, 1.5).period == "2026-11"
    # Back to yearly caps: the year holds all three charges (4.0), above alice's 3.0.
    with pytest.raises(PolicyError, match=r"below what they already spent \(epsilon=4,"):
        _switch(ledger, "year", NOVEMBER, advanced_delta=advanced)
    ledger.close()
    reopened = Ledger(path, dataset=DATASET)  # totals rebuilt from the entries' times
    reopened.clock = lambda: NOVEMBER
    assert reopened.verify() == 5 and _spent(reopened) == ("2026-11", 3.0)
    reopened.close()


def test_from_no_period_to_month_and_back_every_charge_counts(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path / "l.sqlite", None, OCTOBER)
    _charge(ledger, 1.0)
    _switch(ledger, "month", NOVEMBER)
    assert _spent(ledger) == ("2026-11", 1.0)  # made when nothing renewed: counts in every month
    _charge(ledger, 1.5)
    with pytest.raises(BudgetExceededError, match="in budget period 2026-11"):
        _charge(ledger, 1.0)
    ledger.clock = lambda: DECEMBER
    assert _spent(ledger) == ("2026-12", 1.0)
    _switch(ledger, None, DECEMBER)
    assert _spent(ledger) == (None, 2.5)
    with pytest.raises(BudgetExceededError):
        _charge(ledger, 1.0)
    assert ledger.verify() == 5
    ledger.close()


def test_the_dataset_and_bob_follow_the_same_windows(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path / "l.sqlite", "month", OCTOBER)
    _charge(ledger, 2.0, analyst="bob")
    _charge(ledger, 2.5)
    _switch(ledger, "year", NOVEMBER)
    assert _spent(ledger, "bob") == ("2026", 2.0)
    assert _spent(ledger, DATASET) == ("2026", 4.5)
    with pytest.raises(BudgetExceededError, match="dataset 'census' cap"):
        _charge(ledger, 1.0, analyst="bob")  # fits bob's 3.0, not the dataset's 5.0
    ledger.close()
