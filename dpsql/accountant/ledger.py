"""The budget ledger: an append-only, hash-chained SQLite file beside the data.

Every release is charged here before its answer leaves the engine. ``charge`` checks the dataset cap
and the analyst's allocation and appends the entry in one ``BEGIN IMMEDIATE`` transaction, so any
number of processes sharing the file can never together pass a cap. Policy changes are entries too.
Each entry stores the hash of the one before it; ``verify`` recomputes the chain and every total,
and a ledger that fails verification, or cannot be read, stops all queries (fail closed).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import getpass
import hashlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from json.encoder import encode_basestring_ascii  # what json.dumps writes text with
from pathlib import Path
from typing import Any

from dpsql.accountant import periods
from dpsql.accountant.composition import Charge, Spend, advanced_total, leaves
from dpsql.accountant.events import Event, event_from_dict, event_to_dict, total
from dpsql.accountant.limits import Limits
from dpsql.accountant.partitions import Totals
from dpsql.accountant.units import Cost
from dpsql.accountant.zcdp import curves, zcdp_total
from dpsql.errors import BudgetExceededError, LedgerError, PolicyError
from dpsql.memo import Kept

__all__ = ["BudgetLine", "Ledger", "LedgerEntry", "backup", "current_actor", "plan_text"]

_GENESIS = "0" * 64
_EVERY = "*"
"""The window of the running totals that holds every charge (a policy without a period)."""
_TABLE = """
CREATE TABLE IF NOT EXISTS entries (
    seq INTEGER PRIMARY KEY,
    time TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('policy', 'charge', 'token')),
    dataset TEXT NOT NULL,
    analyst TEXT,
    query TEXT,
    plan TEXT,
    mechanism TEXT,
    payload TEXT NOT NULL,
    partition TEXT,
    epsilon_units INTEGER NOT NULL,
    delta_units INTEGER NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL,
    actor TEXT,
    period TEXT
)"""
_TRIGGERS = (
    """CREATE TRIGGER IF NOT EXISTS entries_no_update BEFORE UPDATE ON entries
BEGIN SELECT RAISE(ABORT, 'ledger entries are append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS entries_no_delete BEFORE DELETE ON entries
BEGIN SELECT RAISE(ABORT, 'ledger entries are append-only'); END""",
)
# Every query reads the policy in force (the newest 'policy' entry): without this index SQLite
# walks back over every charge since the last policy change, so each query's ledger work grew
# with the ledger's length.
_INDEX = "CREATE INDEX IF NOT EXISTS entries_by_kind ON entries (kind, seq)"
_SCHEMA = ";\n".join((_TABLE, *_TRIGGERS, _INDEX)) + ";"

_COLUMNS = (
    "seq",
    "time",
    "kind",
    "dataset",
    "analyst",
    "query",
    "plan",
    "mechanism",
    "payload",
    "partition",
    "epsilon_units",
    "delta_units",
    "prev_hash",
    "hash",
    "actor",
    "period",
)


_CHARGE_COLUMNS = "time, analyst, epsilon_units, delta_units, payload, partition, period"
"""What ``Ledger._read_charge`` reads of a charge entry besides its number, in its order."""

_CATCH_UP = f"SELECT seq, kind, hash, {_CHARGE_COLUMNS} FROM entries WHERE seq >= ? ORDER BY seq"
"""The entry a ledger read or wrote last, and every entry after it (``Ledger._catch_up``)."""

_NO_POLICY = (
    "no privacy policy is set for this database; run `dpsql policy set --db DB --file policy.toml`"
)

_DIGESTED = tuple(sorted(name for name in _COLUMNS if name != "hash"))
"""The fields an entry's hash covers, in the order ``json.dumps(..., sort_keys=True)`` writes."""


def _json_value(value: Any) -> str:
    """``json.dumps(value)`` for an entry's field: text, integers and None written directly."""
    if value is None:
        return "null"
    if type(value) is str:
        return encode_basestring_ascii(value)
    if type(value) is int:
        return int.__repr__(value)
    return json.dumps(value)


_INSERT = f"INSERT INTO entries ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"


def current_actor() -> dict[str, Any]:
    """Who is acting, as recorded in every new entry: the operating-system user (the HTTP
    service adds its token's name through ``Ledger.actor``)."""
    return {"os_user": _os_user()}


def plan_text(plan: dict[str, Any]) -> str:
    """A plan as a charge's entry records it (JSON with sorted keys)."""
    return json.dumps(plan, sort_keys=True)


@functools.cache
def _default_actor() -> str:
    """The actor recorded when no service acts: ``current_actor()`` as JSON."""
    return json.dumps(current_actor(), sort_keys=True)


@functools.cache
def _os_user() -> str:
    """This process's operating-system user (looked up once: it does not change)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown"


@dataclass(frozen=True)
class LedgerEntry:
    """One ledger row. ``payload`` is the event tree (charges) or the policy (policy changes)."""

    seq: int
    time: str
    kind: str
    dataset: str
    analyst: str | None
    query: str | None
    plan: str | None
    mechanism: str | None
    payload: str
    partition: str | None
    epsilon_units: int
    delta_units: int
    prev_hash: str
    hash: str
    actor: str | None = None
    """JSON of who acted (``{"os_user": ...}``, plus what the service adds); None in entries
    written before it was recorded, which then hash exactly as they did."""
    period: str | None = None
    """The budget period a charge counts in (e.g. "2026-11") when the policy renews its caps;
    None otherwise, and in entries written before periods existed (which hash as they did)."""

    @property
    def cost(self) -> Cost:
        return Cost(self.epsilon_units, self.delta_units)

    def digest(self) -> str:
        """The hash this entry must carry: SHA-256 over every other field, as the JSON object
        ``json.dumps(fields, sort_keys=True)`` writes (``actor`` and ``period`` left out when
        None), written here field by field in that order, to the same text (a test compares
        them)."""
        members = []
        for name in _DIGESTED:
            value = getattr(self, name)
            if value is None and name in ("actor", "period"):
                continue
            members.append(f'"{name}": {_json_value(value)}')
        return hashlib.sha256(("{" + ", ".join(members) + "}").encode()).hexdigest()

    def values(self) -> tuple[Any, ...]:
        """The fields in the ledger table's column order (every field is a plain value)."""
        return tuple(getattr(self, name) for name in _COLUMNS)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["payload"] = json.loads(self.payload)
        data["plan"] = json.loads(self.plan) if self.plan else None
        data["partition"] = json.loads(self.partition) if self.partition else None
        data["epsilon"] = self.cost.epsilon
        data["delta"] = self.cost.delta
        data["actor"] = json.loads(self.actor) if self.actor else None
        data["os_user"] = (data["actor"] or {}).get("os_user")
        return data


@dataclass(frozen=True)
class BudgetLine:
    """Cap, spent and remaining for the dataset, one analyst, or the people of one partition.

    ``rule`` says which composition bound gave ``spent``: "basic", "advanced" or "zcdp".
    """

    scope: str
    name: str
    cap: Cost
    spent: Cost
    rule: str = "basic"
    period: str | None = None
    """The budget period ``spent`` covers (e.g. "2026-11"); None when the caps never renew."""

    @property
    def remaining(self) -> Cost:
        return Cost(
            max(0, self.cap.epsilon_units - self.spent.epsilon_units),
            max(0, self.cap.delta_units - self.spent.delta_units),
        )


class Ledger:
    """The ledger file of one dataset.

    ``read_only`` opens an existing file (e.g. a backup) without changing a byte of it: no
    journal mode, schema or migration is written, and charging fails.
    """

    def __init__(self, path: str | Path, *, dataset: str, read_only: bool = False):
        self.path = Path(path)
        self.dataset = dataset
        self._cache: dict[str | None, list[tuple[Charge, tuple[str | None, ...]]]] = {None: []}
        """Charges with the windows they count in (``periods.windows``): every one (None) and
        each analyst's."""
        self._totals: dict[str | None, dict[str | None, Totals]] = {}
        """Running totals per analyst (None: the dataset), then per window: ``_EVERY`` (all
        charges), None (those without a period label), and each month and year (the labelled
        charges whose time lies in it)."""
        self.clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)
        """The time of new entries, and so their budget period (a seam for tests)."""
        self._seen = 0
        self._known: tuple[int, str] = (0, _GENESIS)
        """The number and hash of the last entry read in order (``_catch_up``, ``verify``) or
        charged; (0, genesis) when none was."""
        self._events: Kept[tuple[Cost, str, Any, Any]] = Kept(64)
        """What a charge records of an event tree (trees are immutable: kept by identity)."""
        self._policy_limits: tuple[int, Limits] | None = None
        """The sequence number of the policy entry last read, and its limits."""
        self.actor: dict[str, Any] | None = None
        """Who acts through this ledger, when not the default ``current_actor()``: the seam
        through which a service records its token with every entry."""
        try:
            if read_only:
                if not self.path.is_file():
                    raise LedgerError(f"ledger file {str(self.path)!r} does not exist")
                self._connection = sqlite3.connect(
                    f"{self.path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None
                )
                self._connection.execute("SELECT count(*) FROM entries").fetchone()
            else:
                self._open()
        except sqlite3.DatabaseError as error:
            raise LedgerError(
                f"ledger {str(self.path)!r} is unreadable ({error}); "
                "all queries are stopped until it is repaired"
            ) from None
        self.verify()

    def _open(self) -> None:
        """Open the file for writing: WAL, full fsync, the schema and its later columns."""
        self._connection = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        self._connection.execute("PRAGMA journal_mode=WAL")
        self._connection.execute("PRAGMA synchronous=FULL")
        self._connection.executescript(_SCHEMA)
        columns = {row[1] for row in self._connection.execute("PRAGMA table_info(entries)")}
        for added in ("actor", "period"):
            if added not in columns:
                self._connection.execute(f"ALTER TABLE entries ADD COLUMN {added} TEXT")

    def close(self) -> None:
        self._connection.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        connection = self._connection
        try:
            connection.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as error:
            raise LedgerError(f"cannot lock ledger {str(self.path)!r}: {error}") from None
        try:
            yield connection
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        try:
            connection.execute("COMMIT")
        except sqlite3.DatabaseError as error:
            self._forget()  # what the body remembered may not be in the file
            raise LedgerError(f"cannot commit to ledger {str(self.path)!r}: {error}") from None

    def _rows(self, where: str = "", parameters: tuple[Any, ...] = ()) -> list[LedgerEntry]:
        try:
            cursor = self._connection.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM entries {where} ORDER BY seq", parameters
            )
            return [LedgerEntry(*row) for row in cursor.fetchall()]
        except sqlite3.DatabaseError as error:
            raise LedgerError(f"ledger {str(self.path)!r} is unreadable ({error})") from None

    def entries(self) -> list[LedgerEntry]:
        """Every entry, oldest first."""
        return self._rows()

    def verify(self) -> int:
        """Check the hash chain and every entry's total; return the number of entries.

        Raises ``LedgerError`` naming the first entry that was edited, deleted or reordered.
        The charges it reads and checks join the cache of charges (in order, each once), so the
        first charge after it parses no entry again.
        """
        previous, expected_seq = _GENESIS, 1
        entries = self._rows()
        for entry in entries:
            problem, read = None, None
            if entry.seq != expected_seq:
                problem = f"sequence gap: expected entry {expected_seq}, found {entry.seq}"
            elif entry.prev_hash != previous:
                problem = "does not follow the entry before it (deleted or reordered entries)"
            elif entry.digest() != entry.hash:
                problem = "its contents do not match its hash (edited)"
            elif entry.kind == "charge" and (
                (read := _charge_event(entry)) is None or read[1] != entry.cost
            ):
                problem = "its recorded cost differs from its event tree"
            elif entry.period is not None and not periods.holds(entry.period, entry.time):
                problem = f"its budget period {entry.period} does not hold its time"
            if problem:
                raise LedgerError(
                    f"ledger {str(self.path)!r} fails verification at entry "
                    f"{entry.seq}: {problem}; all queries are stopped"
                )
            if read is not None and entry.seq > self._seen:
                charge = _charge(entry.analyst, entry.cost, read[0], entry.partition)
                self._remember(entry.seq, charge, periods.windows(entry.period, entry.time))
            previous, expected_seq = entry.hash, expected_seq + 1
        if entries:
            self._caught_up(entries[-1].seq, entries[-1].hash)
            policy = next((entry for entry in reversed(entries) if entry.kind == "policy"), None)
            if policy is not None:
                try:
                    self._policy_read(policy.seq, policy.payload)
                except (ValueError, KeyError, TypeError):
                    raise LedgerError(
                        f"ledger {str(self.path)!r} fails verification at entry "
                        f"{policy.seq}: its policy's limits cannot be read; all queries "
                        "are stopped"
                    ) from None
        return len(entries)

    def _catch_up(self, connection: sqlite3.Connection) -> None:
        """Read, in one statement, the entry last read or charged and every entry after it:
        new charges join the cache and the running totals, a new policy entry's limits replace
        the ones in force. Inside a charge's transaction (the file locked) this is the whole
        file's news, so the next entry follows the last one read.

        The entry last read must still be there with the same hash: a ledger file changed under
        an open ledger stops charging (every later charge finds the same difference) rather than
        being extended from a stale state.
        """
        known_seq, known_hash = self._known
        rows = connection.execute(_CATCH_UP, (known_seq,)).fetchall()
        if known_seq:
            if not rows or rows[0][0] != known_seq or rows[0][2] != known_hash:
                raise LedgerError(
                    f"ledger {str(self.path)!r} changed under this process: entry {known_seq} "
                    "is not the one it read; nothing was charged (open the ledger again)"
                )
            rows = rows[1:]
        for seq, kind, _, time, name, e, d, payload, partition, period in rows:
            if kind == "charge" and seq > self._seen:
                self._read_charge(seq, time, name, e, d, payload, partition, period)
            elif kind == "policy":
                self._policy_read(seq, payload)
        if rows:
            self._caught_up(rows[-1][0], rows[-1][2])

    def _caught_up(self, seq: int, digest: str) -> None:
        """Every entry up to ``seq`` (whose hash is ``digest``) has been read."""
        self._known = (seq, digest)
        self._seen = max(self._seen, seq)

    def _policy_read(self, seq: int, payload: str) -> Limits:
        """The policy entry ``seq`` (its payload) is the newest read: its limits, now in force
        (callers read policy entries in order)."""
        limits = Limits.from_dict(json.loads(payload)["limits"])
        self._policy_limits = (seq, limits)
        return limits

    def _forget(self) -> None:
        """Drop everything read from the file (the next read reads it all again): after a
        failed commit, what was remembered of the charge may not be in the file."""
        self._cache = {None: []}
        self._totals = {}
        self._seen = 0
        self._known = (0, _GENESIS)
        self._policy_limits = None

    def _append(
        self,
        connection: sqlite3.Connection,
        now: dt.datetime | None = None,
        after: tuple[int, str] | None = None,
        **fields: Any,
    ) -> LedgerEntry:
        """Insert the entry of ``fields`` after the last one: ``after`` (its number and hash)
        when the caller has just read to the end of the file in this transaction, else read."""
        if after is None:
            after = connection.execute(
                "SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1"
            ).fetchone() or (0, _GENESIS)
        seq, previous = after[0] + 1, after[1]
        time = (now or self.clock()).isoformat(timespec="microseconds")
        actor = json.dumps(self.actor, sort_keys=True) if self.actor else _default_actor()
        known = {"seq": seq, "time": time, "dataset": self.dataset, "prev_hash": previous}
        draft = LedgerEntry(hash="", actor=actor, **known, **fields)
        entry = LedgerEntry(hash=draft.digest(), actor=actor, **known, **fields)
        connection.execute(_INSERT, entry.values())
        return entry

    def _policy(self, connection: sqlite3.Connection) -> dict[str, Any] | None:
        row = connection.execute(
            "SELECT payload FROM entries WHERE kind = 'policy' ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        return json.loads(row[0]) if row else None

    def _limits(self, connection: sqlite3.Connection) -> Limits:
        """The limits of the policy in force, read again only when a newer policy entry
        exists (entries never change, so a policy entry's limits are its own for ever)."""
        (seq,) = connection.execute("SELECT MAX(seq) FROM entries WHERE kind = 'policy'").fetchone()
        if seq is None:
            raise PolicyError(_NO_POLICY)
        if self._policy_limits is not None and self._policy_limits[0] == seq:
            return self._policy_limits[1]
        query = "SELECT payload FROM entries WHERE seq = ?"
        (payload,) = connection.execute(query, (seq,)).fetchone()
        return self._policy_read(seq, payload)

    def _charges(
        self, connection: sqlite3.Connection, analyst: str | None = None
    ) -> list[tuple[Charge, tuple[str | None, ...]]]:
        """Every charge (of ``analyst``) with the windows it counts in, parsed once and cached;
        only new entries are read, and each updates the running totals of the dataset and its
        analyst in every window it counts in."""
        rows = connection.execute(
            f"SELECT seq, {_CHARGE_COLUMNS} FROM entries WHERE kind = 'charge' AND seq > ? "
            "ORDER BY seq",
            (self._seen,),
        ).fetchall()
        for seq, *charged in rows:
            self._read_charge(seq, *charged)
        return self._cache.setdefault(analyst, [])

    def _read_charge(
        self,
        seq: int,
        time: str,
        analyst: str,
        epsilon_units: int,
        delta_units: int,
        payload: str,
        partition: str | None,
        period: str | None,
    ) -> None:
        """Parse the charge entry ``seq`` read from the file (``_CHARGE_COLUMNS``) and
        remember it (``_remember``)."""
        event = event_from_dict(json.loads(payload))
        charge = _charge(analyst, Cost(int(epsilon_units), int(delta_units)), event, partition)
        self._remember(seq, charge, periods.windows(period, time))

    def _remember(self, seq: int, charge: Charge, windows: tuple[str | None, ...]) -> None:
        """Add the charge of entry ``seq`` to the cache and the running totals; every entry up
        to ``seq`` has then been read."""
        self._cache[None].append((charge, windows))
        self._cache.setdefault(charge.analyst, []).append((charge, windows))
        for who in (None, charge.analyst):
            totals = self._totals.setdefault(who, {})
            for window in (_EVERY, *windows):
                totals.setdefault(window, Totals()).add(charge)
        self._seen = seq

    def _window(self, analyst: str | None, current: str | None) -> tuple[Cost, Totals]:
        """What ``analyst`` (None: the dataset) spent in the window ``current`` (None: for
        ever), as (the total of the unlabelled charges, which count in every window; the
        running totals of the charges whose time lies in the window, which a new charge joins).
        The totals are up to date after ``_charges``."""
        totals = self._totals.get(analyst, {})
        if current is None:
            return Cost(), totals.get(_EVERY, Totals())
        unlabelled = totals.get(None)
        return (unlabelled.total() if unlabelled else Cost()), totals.get(current, Totals())

    def current_period(self, limits: Limits | None = None) -> str | None:
        """The label of the budget period now (None when the policy renews nothing)."""
        limits = limits if limits is not None else self._limits(self._connection)
        return periods.label(limits.period, self.clock())

    def _spend(
        self,
        connection: sqlite3.Connection,
        limits: Limits,
        analyst: str | None = None,
        extra: Charge | None = None,
        now: dt.datetime | None = None,
        read: bool = True,
    ) -> Spend:
        """Spent budget of the dataset (or ``analyst``) in the window of the policy's period
        holding ``now`` (default: the clock), with ``extra`` added if given: every charge whose
        time lies in that window counts, whatever period it was charged under (see
        ``dpsql.accountant.periods``). Basic totals come from the running totals (O(values
        ``extra`` touches)); the advanced bound, when enabled, is recomputed over every step of
        the window. ``read=False`` when the caller has just read the new charges (in the same
        transaction)."""
        current = periods.label(limits.period, now or self.clock())
        # Reading the new charges also brings the running totals up to date.
        charges = self._charges(connection, analyst) if read else self._cache.get(analyst, [])
        unlabelled, window = self._window(analyst, current)
        basic = unlabelled + (window.total_with(extra) if extra is not None else window.total())
        advanced = zcdp = None
        if limits.advanced_delta is None and limits.zcdp_delta is None:
            return Spend(basic, advanced, zcdp)  # no pass over every step of the period
        steps = [c for c, windows in charges if periods.counts(windows, current)]
        if extra is not None:
            steps = [*steps, extra]
        if limits.advanced_delta is not None:
            advanced = advanced_total(steps, limits.advanced_delta)
        if limits.zcdp_delta is not None:
            zcdp = zcdp_total([c.curves for c in steps], limits.zcdp_delta)
        return Spend(basic, advanced, zcdp)

    def policy(self) -> dict[str, Any] | None:
        """The policy document in force (as given to ``set_policy``), or None before one is set."""
        payload = self._policy(self._connection)
        return payload["document"] if payload else None

    def policy_entry(self) -> int | None:
        """The sequence number of the policy entry in force (None before one is set)."""
        row = self._connection.execute(
            "SELECT MAX(seq) FROM entries WHERE kind = 'policy'"
        ).fetchone()
        return row[0]

    def set_policy(self, document: dict[str, Any], limits: Limits) -> LedgerEntry:
        """Record a new policy; refuse caps or allocations below what was already spent."""
        with self._transaction() as connection:
            spent = self._spend(connection, limits).best
            if not self._spend(connection, limits).fits_within(limits.dataset):
                raise PolicyError(
                    f"refused: the new dataset cap (epsilon={limits.dataset.epsilon:g}, "
                    f"delta={limits.dataset.delta:g}) is below what was already spent "
                    f"(epsilon={spent.epsilon:g}, delta={spent.delta:g})"
                )
            for name, allocation in limits.analysts.items():
                used = self._spend(connection, limits, name).best
                if not self._spend(connection, limits, name).fits_within(allocation):
                    raise PolicyError(
                        f"refused: analyst {name!r}'s new allocation (epsilon="
                        f"{allocation.epsilon:g}, delta={allocation.delta:g}) is below what "
                        f"they already spent (epsilon={used.epsilon:g}, delta={used.delta:g})"
                    )
            payload = {"document": document, "limits": limits.to_dict()}
            return self._append_record(connection, "policy", None, payload)

    def record_token_event(self, *, analyst: str, payload: dict[str, Any]) -> LedgerEntry:
        """Append a zero-cost ``token`` entry (an access token created or revoked)."""
        with self._transaction() as connection:
            _allow_token_entries(connection)
            return self._append_record(connection, "token", analyst, payload)

    def _append_record(
        self,
        connection: sqlite3.Connection,
        kind: str,
        analyst: str | None,
        payload: dict[str, Any],
    ) -> LedgerEntry:
        """Append an entry that spends nothing (a policy change, a token event)."""
        return self._append(
            connection,
            kind=kind,
            analyst=analyst,
            query=None,
            plan=None,
            mechanism=None,
            payload=json.dumps(payload, sort_keys=True),
            partition=None,
            epsilon_units=0,
            delta_units=0,
        )

    def charge(
        self,
        *,
        analyst: str,
        event: Event,
        query: str,
        plan: dict[str, Any] | str,
        mechanism: str,
        partition: tuple[str, tuple[str, ...]] | None = None,
        within: Callable[[sqlite3.Connection, LedgerEntry], None] | None = None,
        policy_entry: int | None = None,
    ) -> LedgerEntry:
        """Check both limits and record the charge atomically, or raise and record nothing.

        ``policy_entry`` is the policy entry the query was planned under: when another policy
        is in force by the time the file is locked (set meanwhile), nothing is recorded and a
        ``PolicyError`` says so (the plan may not hold under the new policy).

        ``plan`` is the plan as shown: a dict, or its text ``plan_text(plan)`` (which a caller
        that charges the same plan again keeps, instead of writing it on every charge).

        ``partition`` = (family, values) when the query reads only rows whose partition column
        holds one of ``values`` (declared values, as the database spells them); such charges
        compose in parallel with charges on other values of the same family. ``within`` is
        called with the connection and the new entry inside the charge's transaction (a record
        that must be written with the charge or not at all, such as a stream's name; it reads
        no data, the file being locked): if it raises, nothing is recorded.
        """
        cost, payload, steps, zcdp = self._events.get((event,), lambda: _recorded(event))
        stored = family = values = None
        if partition is not None:
            if not partition[1]:
                raise ValueError("a partitioned charge needs at least one value")
            family, ordered = partition[0], sorted(set(partition[1]))
            values = tuple(str(v) for v in ordered)  # as _charge reads them back from ``stored``
            stored = json.dumps({"family": family, "values": ordered})
        new = Charge(analyst, cost, steps, family, values, zcdp)
        with self._transaction() as connection:
            self._catch_up(connection)  # the new charges and policy, and the last entry: one read
            if self._policy_limits is None:
                raise PolicyError(_NO_POLICY)
            in_force, limits = self._policy_limits
            if policy_entry is not None and policy_entry != in_force:
                raise PolicyError(
                    "the privacy policy changed while this query was planned; nothing was "
                    "charged: ask again (it is planned under the new policy)"
                )
            now = self.clock()
            current = periods.label(limits.period, now)
            allocation = limits.analysts.get(analyst)
            if allocation is None:
                raise PolicyError(f"analyst {analyst!r} has no allocation in the policy")
            checks = (
                (f"dataset {self.dataset!r} cap", None, limits.dataset),
                (f"analyst {analyst!r} allocation", analyst, allocation),
            )
            for name, scope, cap in checks:
                if not self._spend(connection, limits, scope, new, now, read=False).fits_within(
                    cap
                ):
                    spent = self._spend(connection, limits, scope, now=now).best
                    where = ""
                    if partition is not None:
                        unlabelled, window = self._window(scope, current)
                        spent = unlabelled + window.at(*partition)
                        column = partition[0].split(".", 1)[-1]
                        shown = ", ".join(sorted(set(partition[1]))[:5])
                        more = ", ..." if len(set(partition[1])) > 5 else ""
                        where = f" for the people where {column} is one of [{shown}{more}]"
                    remaining = BudgetLine("", "", cap, spent).remaining
                    raise BudgetExceededError(
                        f"budget exceeded: the query needs epsilon={cost.epsilon:.10g}, "
                        f"delta={cost.delta:.10g} but the {name} has epsilon="
                        f"{remaining.epsilon:.10g}, delta={remaining.delta:.10g} remaining"
                        f"{where}{_in(current)} ({_why_refused(cost, remaining)})",
                        requested={"epsilon": cost.epsilon, "delta": cost.delta},
                        remaining={"epsilon": remaining.epsilon, "delta": remaining.delta},
                    )
            entry = self._append(
                connection,
                now,
                self._known,
                period=current,
                kind="charge",
                analyst=analyst,
                query=query,
                plan=plan if isinstance(plan, str) else plan_text(plan),
                mechanism=mechanism,
                payload=payload,
                partition=stored,
                epsilon_units=cost.epsilon_units,
                delta_units=cost.delta_units,
            )
            if within is not None:
                within(connection, entry)
            # Every entry before this one was read in this transaction (the file is locked), so
            # the new charge joins the cache as read, not parsed back from its payload.
            self._remember(entry.seq, new, periods.windows(entry.period, entry.time))
            self._caught_up(entry.seq, entry.hash)
            return entry

    def budget(self, analyst: str | None = None) -> list[BudgetLine]:
        """Cap, spent and remaining for the dataset, each analyst (or just ``analyst``), and the
        people of each partition value that a partitioned charge touched: the whole dataset's
        spending on them against its cap, or, for one ``analyst``, only that analyst's own
        against their allocation (an analyst is not shown where the others spent)."""
        connection = self._connection
        limits = self._limits(connection)
        now = self.clock()
        current = periods.label(limits.period, now)
        dataset = self._spend(connection, limits, now=now)
        lines = [
            BudgetLine("dataset", self.dataset, limits.dataset, dataset.best, dataset.rule, current)
        ]
        for name, allocation in sorted(limits.analysts.items()):
            if analyst is None or name == analyst:
                used = self._spend(connection, limits, name, now=now)
                lines.append(BudgetLine("analyst", name, allocation, used.best, used.rule, current))
        if analyst is not None and len(lines) == 1:
            raise PolicyError(f"analyst {analyst!r} has no allocation in the policy")
        # Partition lines: the spending on the people of each value in the current window, as the
        # cap check counts it.
        cap = limits.dataset if analyst is None else limits.analysts[analyst]
        unlabelled, window = self._window(analyst, current)
        lines += [
            BudgetLine(
                "partition", f"{family} = {value!r}", cap, unlabelled + spent, period=current
            )
            for family, value, spent in window.per_value()
        ]
        return lines


def _allow_token_entries(connection: sqlite3.Connection) -> None:
    """Ledgers written before tokens existed refuse kind 'token': rebuild the table once inside
    the caller's transaction, copying every entry unchanged (the hash chain is not touched)."""
    (schema,) = connection.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'entries'"
    ).fetchone()
    if "'token'" in schema:
        return
    connection.execute("DROP TRIGGER entries_no_update")
    connection.execute("DROP TRIGGER entries_no_delete")
    connection.execute("ALTER TABLE entries RENAME TO entries_before_tokens")
    connection.execute(_TABLE)
    connection.execute("INSERT INTO entries SELECT * FROM entries_before_tokens")
    connection.execute("DROP TABLE entries_before_tokens")
    for trigger in _TRIGGERS:
        connection.execute(trigger)
    connection.execute(_INDEX)


def _in(period: str | None) -> str:
    return "" if period is None else f" in budget period {period}"


def _why_refused(cost: Cost, remaining: Cost) -> str:
    """The comparison that is actually false, in exact ledger units."""
    reasons = [
        f"{name} {cost_value:.10g} > {left:.10g}"
        for name, units, left_units, cost_value, left in (
            (
                "epsilon",
                cost.epsilon_units,
                remaining.epsilon_units,
                cost.epsilon,
                remaining.epsilon,
            ),
            ("delta", cost.delta_units, remaining.delta_units, cost.delta, remaining.delta),
        )
        if units > left_units
    ]
    if reasons:
        return "; ".join(reasons)
    return (
        "the cost fits what remains, but the composed total with it would pass the cap: "
        "the remaining budget is the cap minus the smaller of the basic and advanced "
        "composition totals, and the advanced total does not grow by a query's epsilon alone"
    )


def _charge(analyst: str | None, cost: Cost, event: Event, partition: str | None) -> Charge:
    """A ledger row as a charge. Entries written before partitions were value sets (interval
    regions) count sequentially: an over-statement, never an under-statement."""
    family = values = None
    if partition:
        stored = json.loads(partition)
        if "values" in stored:
            family, values = stored["family"], tuple(str(v) for v in stored["values"])
    return Charge(analyst, cost, leaves(event), family, values, curves(event))


def _recorded(event: Event) -> tuple[Cost, str, Any, Any]:
    """An event tree's total, its payload as stored, and its composition steps and zCDP curves
    (what ``_charge`` reads back from that payload)."""
    payload = json.dumps(event_to_dict(event), sort_keys=True)
    return total(event), payload, leaves(event), curves(event)


def _charge_event(entry: LedgerEntry) -> tuple[Event, Cost] | None:
    """The event tree a charge entry records and its total, or None when its payload is not
    one."""
    try:
        event = event_from_dict(json.loads(entry.payload))
        return event, total(event)
    except (ValueError, KeyError, TypeError):
        return None


def backup(source: str | Path, target: str | Path) -> None:
    """Copy the ledger file ``source`` to ``target`` with SQLite's online backup API.

    The copy is one consistent snapshot holding every committed entry, those still in the
    write-ahead log included (a ``cp`` of the file misses them), taken under a read transaction
    that does not block writers: safe while the service charges. ``target`` must not exist; it
    is written beside itself and renamed into place, as one self-contained file (no WAL).
    """
    source, target = Path(source), Path(target)
    if not source.is_file():
        raise LedgerError(f"ledger file {str(source)!r} does not exist")
    if target.exists():
        raise LedgerError(f"{str(target)!r} exists; give a new file for the backup")
    partial = target.with_name(f".{target.name}.partial")
    partial.unlink(missing_ok=True)
    try:
        with (
            contextlib.closing(sqlite3.connect(source, timeout=60)) as reading,
            contextlib.closing(sqlite3.connect(partial)) as writing,
        ):
            reading.backup(writing)
            writing.execute("PRAGMA journal_mode=DELETE")
        partial.rename(target)
    except (sqlite3.DatabaseError, OSError) as error:
        partial.unlink(missing_ok=True)
        raise LedgerError(f"cannot back up {str(source)!r} to {str(target)!r}: {error}") from None
