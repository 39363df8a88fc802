"""Is a stream table's change capture intact? (checked before every refresh)

A change buffer table or view, a capture trigger function or trigger dropped
by hand (or a capture trigger disabled) means changes may have been lost. The
refresh of a stream table reading such a source — or writing such a buffer
for the stream tables downstream of it — fails with
:class:`~pgtrickle.errors.CaptureBrokenError`, and every stream table reading
the broken buffer is marked for reinitialization. ``pgtrickle install``
(``pgtrickle._repair_capture``) recreates the objects.

What counts as broken is decided in SQL (``pgtrickle._capture_problems``), so
``check_cdc_health()``, ``pgtrickle status``, ``verify``, the metrics and the
refresh all agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import psycopg

from pgtrickle.catalog.store import StreamTable
from pgtrickle.errors import CaptureBrokenError


@dataclass(frozen=True)
class BrokenCapture:
    """One source (a table, or a stream table's own buffer) whose capture is not intact."""

    relid: int
    source: str
    """The source's display name."""
    problems: tuple[str, ...]


def broken_message(broken: Sequence[BrokenCapture]) -> str:
    """The error of a refresh over broken capture: what is missing, and what to do (pure)."""
    parts = "; ".join(f"the change capture of {b.source} is broken ({'; '.join(b.problems)})" for b in broken)
    return (
        f"{parts}: changes may have been lost; run `pgtrickle install` to repair it "
        "(the stream tables reading it are then recomputed in full)"
    )


def find_broken(conn: psycopg.Connection, relids: Iterable[int] | None = None) -> list[BrokenCapture]:
    """Sources (all, or those of ``relids``) whose change capture is not intact."""
    wanted = None if relids is None else sorted(set(relids))
    rows = conn.execute(
        "SELECT source_relid::bigint, pgtrickle._display_name(source_schema, source_name), problems"
        " FROM (SELECT c.*, pgtrickle._capture_problems(c.source_relid) AS problems"
        "        FROM pgtrickle.pgt_change_sources c"
        "       WHERE %(w)s::oid[] IS NULL OR c.source_relid = ANY(%(w)s::oid[])) x"
        " WHERE cardinality(problems) > 0 ORDER BY 2",
        {"w": wanted},
    ).fetchall()
    return [BrokenCapture(int(r[0]), str(r[1]), tuple(r[2])) for r in rows]


def broken_by_stream_table(conn: psycopg.Connection) -> dict[int, list[BrokenCapture]]:
    """For each stream table affected: the broken captures it reads or writes (its own buffer)."""
    broken = {b.relid: b for b in find_broken(conn)}
    if not broken:
        return {}
    rows = conn.execute(
        "SELECT d.pgt_id, d.source_relid::bigint FROM pgtrickle.pgt_dependencies d"
        " WHERE d.source_relid = ANY(%(r)s::oid[])"
        " UNION SELECT s.pgt_id, s.pgt_relid::bigint FROM pgtrickle.pgt_stream_tables s"
        " WHERE s.pgt_relid = ANY(%(r)s::oid[]) ORDER BY 1, 2",
        {"r": sorted(broken)},
    ).fetchall()
    result: dict[int, list[BrokenCapture]] = {}
    for pgt_id, relid in rows:
        result.setdefault(int(pgt_id), []).append(broken[int(relid)])
    return result


def require_capture(conn: psycopg.Connection, st: StreamTable) -> None:
    """Raise CaptureBrokenError when a source of ``st``, or its own buffer, has broken capture.

    Every stream table reading a broken buffer is marked for reinitialization
    first (committed: ``conn`` is in autocommit mode), so none of them is
    refreshed differentially over changes that may be incomplete.
    """
    broken = find_broken(conn, [s.relid for s in st.sources] + [st.relid])
    if not broken:
        return
    message = broken_message(broken)
    conn.execute(
        "UPDATE pgtrickle.pgt_stream_tables s SET needs_reinit = true, updated_at = now(),"
        " reinit_reason = coalesce(s.reinit_reason, %(why)s)"
        " FROM pgtrickle.pgt_dependencies d"
        " WHERE d.pgt_id = s.pgt_id AND d.source_relid = ANY(%(r)s::oid[]) AND NOT s.needs_reinit",
        {"r": [b.relid for b in broken], "why": message},
    )
    raise CaptureBrokenError(message)
