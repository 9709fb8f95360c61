"""Budget periods: a policy may renew its caps every calendar month or year (UTC).

Renewal is the administrator's decision, not a privacy theorem: each period's charges are held to
the caps, so one person's exposure over *k* periods is up to *k* times a cap. The ledger records
the period of every charge (a label such as ``"2026-11"``, which must hold the entry's time).

Which charges count in the window open now is decided by the charges' *times*, under the period
of the policy in force, never by the label a charge was written under: a charge counts in the
current month (or year) when its time lies in it, so changing the period (month to year, year to
month) never drops a charge from a window that is still open. A charge without a label (made
when nothing renewed) counts in every window: an over-statement, never an under-statement.
Without a period in the policy, every charge counts.

>>> import datetime as dt
>>> label("month", dt.datetime(2026, 11, 25, 23, 59, tzinfo=dt.UTC))
'2026-11'
>>> label("year", dt.datetime(2026, 11, 25, tzinfo=dt.UTC))
'2026'
>>> label(None, dt.datetime(2026, 11, 25, tzinfo=dt.UTC)) is None
True
>>> windows("2026-11", "2026-11-30T23:59:59+00:00"), windows(None, "2026-11-30T23:59:59+00:00")
(('2026-11', '2026'), (None,))
>>> november = windows("2026-11", "2026-11-30T23:59:59+00:00")
>>> counts(november, "2026-11"), counts(november, "2026"), counts(november, "2026-12")
(True, True, False)
>>> counts(windows("2026", "2026-03-02T10:00:00+00:00"), "2026-11"), counts((None,), "2026-11")
(False, True)
>>> counts(november, None)
True
>>> holds("2026-11", "2026-11-30T23:59:59.000000+00:00"), holds("2026", "2027-01-01T00:00:00+00:00")
(True, False)
"""

from __future__ import annotations

import datetime as dt

__all__ = ["PERIODS", "counts", "holds", "label", "windows"]

PERIODS = ("month", "year")


def label(period: str | None, now: dt.datetime) -> str | None:
    """The label of the ``period`` (None, "month" or "year") holding ``now`` (UTC)."""
    if period is None:
        return None
    now = now.astimezone(dt.UTC)
    if period == "month":
        return f"{now.year:04d}-{now.month:02d}"
    if period == "year":
        return f"{now.year:04d}"
    raise ValueError(f"unknown budget period {period!r}; choose one of {', '.join(PERIODS)}")


def windows(charged_in: str | None, time: str) -> tuple[str | None, ...]:
    """The windows a charge labelled ``charged_in`` at ISO ``time`` counts in: the month and the
    year holding its time, or ``(None,)`` (every window) for a charge without a label."""
    if charged_in is None:
        return (None,)
    when = dt.datetime.fromisoformat(time)
    return tuple(label(kind, when) for kind in PERIODS)


def counts(charged_in: tuple[str | None, ...], current: str | None) -> bool:
    """Whether a charge counting in ``charged_in`` (its ``windows``) counts against the caps of
    the window ``current`` (None: the policy renews nothing, so every charge counts)."""
    return current is None or None in charged_in or current in charged_in


def holds(period_label: str, time: str) -> bool:
    """Whether the period ``period_label`` holds the ISO ``time`` of an entry."""
    return period_label in windows(period_label, time)
