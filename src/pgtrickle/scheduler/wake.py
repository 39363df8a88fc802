"""When the daemon wakes: on a change to a source, and when a stream table with new input falls due.

Three things wake the daemon besides its tick (``tick_seconds``):

* ``NOTIFY pgtrickle_refresh`` -- a refresh was requested or a stream table
  created: tick at once.
* ``NOTIFY pgtrickle_changes, '<relid>'`` -- a source's capture trigger (or
  the WAL decoder) stored changes of table ``relid``: the stream tables that
  read it are *pending*; the daemon wakes when the first of them is due by
  its schedule (at once if it already is).
* a pending stream table's due time -- one whose input changed (a source
  notified, or an upstream stream table committed new rows in a tick) but
  whose schedule did not allow a refresh yet: a ``1s`` schedule still
  refreshes at most once a second, and refreshes as soon as that second is up
  instead of at the next tick.

Everything here is pure: no I/O, no clock. Times are the database's
(``now()``), as timezone-aware datetimes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

CHANGES_CHANNEL = "pgtrickle_changes"
"""Channel of the capture triggers' and the WAL decoder's notifications; payload: the source's relid."""


def readers_of(sources: Mapping[int, Iterable[int]]) -> dict[int, frozenset[int]]:
    """Each source relid mapped to the stream tables (pgt_ids) that read it directly.

    ``sources`` maps each stream table's pgt_id to the relids of its sources.
    """
    found: dict[int, set[int]] = {}
    for pgt_id, relids in sources.items():
        for relid in relids:
            found.setdefault(relid, set()).add(pgt_id)
    return {relid: frozenset(ids) for relid, ids in found.items()}


def parse_change(payload: str) -> int | None:
    """The relid a ``pgtrickle_changes`` notification names, or ``None`` when it names none."""
    text = payload.strip()
    if not text.isascii() or not text.isdigit():
        return None
    relid = int(text)
    return relid if 0 < relid < 2**32 else None


def changed_wake(
    relids: Iterable[int | None],
    readers: Mapping[int, frozenset[int]],
    next_due: Mapping[int, datetime | None],
    now: datetime,
) -> tuple[datetime | None, frozenset[int]]:
    """When changes of ``relids`` need a tick, and which stream tables they made pending.

    The wake is the earliest due time among the stream tables reading them
    (``now`` when one is due already, or when a relid is unknown -- ``None``
    or a table no stream table known at the last tick reads, e.g. one
    created since: the tick sorts it out). Stream tables that are not
    refreshed automatically (``next_due`` ``None``: suspended, broken
    schedule) do not wake the daemon. Returns ``(None, ...)`` when nothing needs a tick.
    """
    wake: datetime | None = None
    pending: set[int] = set()
    for relid in relids:
        if relid is None or relid not in readers:
            wake = now
            continue
        for pgt_id in readers[relid]:
            due = next_due.get(pgt_id)
            if due is None:
                continue
            pending.add(pgt_id)
            at = max(due, now)
            wake = at if wake is None else min(wake, at)
    return wake, frozenset(pending)


def wait_seconds(now: datetime, tick_seconds: float, wakes: Iterable[datetime]) -> float:
    """Seconds to wait for a NOTIFY before the next tick: the tick, or sooner for a pending due time."""
    wait = tick_seconds
    for at in wakes:
        wait = min(wait, (at - now).total_seconds())
    return max(0.0, wait)
