"""The reads the members of a batch share (refresh/batch.py), and the change-buffer columns lookup.

The stream tables of a fan read the same change buffer over the same (or a nearby) window: one JDBC
relation serves them all (:class:`SharedReads`), see :mod:`pgtrickle.refresh.delta_reads`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg

from pgtrickle.spark import jdbc

__all__ = ["SharedReads", "buffer_columns"]


class SharedReads:
    """The reads of several refreshes at one snapshot (a batch): one DataFrame per distinct read.

    Two members reading the same relation the same way (the same PostgreSQL query at the same
    exported snapshot - for a change buffer, the same window and columns) get the same JDBC
    DataFrame: Spark probes its schema once, and :meth:`persist_shared` persists a bounded one
    read by several plans so the shared job scans it once. Planner statistics and change-buffer
    columns are looked up once per relation.
    """

    def __init__(self) -> None:
        self._frames: dict[tuple[Any, ...], Any] = {}
        self._uses: dict[tuple[Any, ...], int] = {}
        self._bounded: set[tuple[Any, ...]] = set()
        self._persisted: set[tuple[Any, ...]] = set()
        self._stats: dict[int, jdbc.TableStats] = {}
        self._buffer_cols: dict[int, dict[str, str]] = {}
        self.persisted: list[Any] = []
        self.made = 0
        """JDBC reads made."""
        self.persisted_count = 0
        self.frontiers: dict[int, list[str]] = {}
        """Per source, the frontiers its readers' windows start at (:meth:`add_window`): one read
        of the widest window serves them all, each row flagged with the windows it is in."""
        self.columns: dict[str, set[str]] = {}
        """Per relation, the source columns any member's plan reads (:meth:`widen`): every member
        reads them all, so one read of a change buffer serves members reading different columns."""
        self.asked = 0
        """Reads the members' plans asked for (each served by one of those made)."""
        self.empty_windows: set[tuple[int, str]] = set()
        """(source relid, frontier) of windows known to hold no change (:meth:`nothing_pending`)."""
        self.fed: dict[int, Any] = {}
        """Per upstream member (its relid): its delta in the shared job (a DataFrame of its stored
        columns and ``__pgt_w``), which the chained members reading it add to its change buffer's
        rows (refresh/chained.py)."""

    def frame(self, key: tuple[Any, ...], make: Callable[[], Any], bounded: bool, uses: int = 1) -> Any:
        """The DataFrame of the read ``key`` (made by ``make`` the first time)."""
        self.asked += 1
        if key not in self._frames:
            self._frames[key] = make()
            self.made += 1
        self._uses[key] = self._uses.get(key, 0) + uses
        if bounded:
            self._bounded.add(key)
        return self._frames[key]

    def nothing_pending(self, relid: int, frontier: str) -> None:
        """The change buffer of ``relid`` holds nothing in the window from ``frontier`` (a chained
        member's upstream member: its change is the job's delta alone, nothing is read)."""
        self.empty_windows.add((relid, frontier))

    def feed(self, relid: int, delta: Any) -> None:
        """Offer the delta of the upstream member ``relid`` (computed by the shared job) to the
        chained members reading it."""
        self.fed[relid] = delta

    def add_window(self, relid: int, frontier: str) -> None:
        """A member reads ``relid``'s changes from ``frontier`` (before any member registers its reads)."""
        known = self.frontiers.setdefault(relid, [])
        if frontier not in known:
            known.append(frontier)

    def widen(self, read_columns: Mapping[str, frozenset[str]]) -> None:
        """Add a member's read columns (before any member registers its reads)."""
        for relation, cols in read_columns.items():
            self.columns.setdefault(relation, set()).update(cols)

    def stats(self, coord: psycopg.Connection, relids: Sequence[int]) -> dict[int, jdbc.TableStats]:
        missing = [r for r in relids if r not in self._stats]
        if missing:
            self._stats.update(jdbc.table_stats(coord, missing))
        return {r: self._stats[r] for r in relids if r in self._stats}

    def buffer_columns(self, conn: psycopg.Connection, relids: Sequence[int]) -> dict[int, dict[str, str]]:
        missing = [r for r in relids if r not in self._buffer_cols]
        if missing:
            found = buffer_columns(conn, missing)
            for relid in missing:
                self._buffer_cols[relid] = found.get(relid, {})
        return {r: self._buffer_cols[r] for r in relids if self._buffer_cols.get(r)}

    def persist_shared(self) -> int:
        """Persist every bounded read used more than once (not persisted yet); how many are."""
        for key, df in self._frames.items():
            if key in self._bounded and self._uses.get(key, 0) > 1 and key not in self._persisted:
                self.persisted.append(df.persist())
                self._persisted.add(key)
        self.persisted_count = len(self.persisted)
        return self.persisted_count

    def note(self) -> str | None:
        """What sharing saved, for the history (``None``: nothing was shared)."""
        if self.asked <= self.made:
            return None
        return f"{self.asked} reads of its members served by {self.made} JDBC reads ({self.persisted_count} persisted)"

    def release(self) -> None:
        for df in self.persisted:
            df.unpersist()
        self.persisted.clear()
        self._persisted.clear()
        self._frames.clear()
        self.fed.clear()


def buffer_columns(conn: psycopg.Connection, relids: Sequence[int]) -> dict[int, dict[str, str]]:
    """Per source: its column → the buffer's column carrying it (``new_``/``old_`` + that)."""
    rows = conn.execute(
        "SELECT source_relid::bigint, columns FROM pgtrickle.pgt_change_sources WHERE source_relid = ANY(%s::oid[])",
        (list(relids),),
    ).fetchall()
    result = {}
    for relid, cols in rows:
        if isinstance(cols, str):
            cols = json.loads(cols)
        result[int(relid)] = {c["name"]: c["buf"] for c in cols or []}
    return result
