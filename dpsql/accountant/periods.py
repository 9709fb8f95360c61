"""Budget periods: a policy may renew its caps every calendar month or year (UTC).

Renewal is the administrator's decision, not a privacy theorem: each period's charges are held to
the caps, so one person's exposure over *k* periods is up to *k* times a cap. The ledger records
the period of every charge (a label such as ``"2026-11"``), and a period counts the charges
labelled with it plus every charge without a label (those were made when nothing renewed, and
stay counted in every period: an over-statement, never an under-statement). Without a period in
the policy, every charge counts.

>>> import datetime as dt
>>> label("month", dt.datetime(2026, 11, 25, 23, 59, tzinfo=dt.UTC))
'2026-11'
>>> label("year", dt.datetime(2026, 11, 25, tzinfo=dt.UTC))
'2026'
>>> label(None, dt.datetime(2026, 11, 25, tzinfo=dt.UTC)) is None
True
>>> counts("2026-11", "2026-11"), counts("2026-10", "2026-11"), counts(None, "2026-11")
(True, False, True)
>>> counts("2026-10", None)
True
>>> holds("2026-11", "2026-11-30T23:59:59.000000+00:00"), holds("2026", "2027-01-01T00:00:00+00:00")
(True, False)
"""

from __future__ import annotations

import datetime as dt

__all__ = ["PERIODS", "counts", "holds", "label"]

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


def counts(charged_in: str | None, current: str | None) -> bool:
    """Whether a charge labelled ``charged_in`` counts against the caps of period ``current``
    (None: the policy renews nothing, so every charge counts)."""
    return current is None or charged_in is None or charged_in == current


def holds(period_label: str, time: str) -> bool:
    """Whether the period ``period_label`` holds the ISO ``time`` of an entry."""
    now = dt.datetime.fromisoformat(time)
    return period_label in (label(kind, now) for kind in PERIODS)
