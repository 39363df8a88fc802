"""Watermark gating at the edge: read groups and watermarks, record skips, send stale alerts.

The decisions are in :mod:`pgtrickle.gates.watermark` (pure). The refresh
engine calls :func:`evaluate` inside its planning transaction, before any
Spark job; when it says ``blocked`` (``gate`` mode, a group misaligned; or a
``hold_back`` that cannot be honoured) the refresh is skipped and the history
says why. A ``hold_back`` refresh reads every capped source as of its cap
(:func:`hold_back_window` counts the changes of each source's own window),
and commits a :class:`WatermarkMark` with its frontier.

Positions of a hold_back stream table (``watermark_positions``)::

    {"sources": {"<relid>": "<pg_snapshot the source was read at>"},
     "groups":  {"<group_id>": "<the group's watermark it was held back to>"}}

A source without an entry was read at the stream table's ``frontier``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

import psycopg
from psycopg import sql

from pgtrickle.catalog.store import StreamTable
from pgtrickle.cdc.buffers import PendingChanges
from pgtrickle.db.instants import parse_instant, tolerant_cursor
from pgtrickle.gates import watermark as wm


@dataclass(frozen=True)
class WatermarkMark:
    """What a refresh commits with its frontier (and the caps its FULL refresh reads at)."""

    effective_watermark: datetime | None
    positions: dict | None
    caps: dict[int, str] = field(default_factory=dict)
    """relid → snapshot a capped source is read as of."""


@dataclass(frozen=True)
class WatermarkCheck:
    mode: str
    origin: str  # 'set' | 'inferred'
    blocked: str | None
    """Why the refresh must not run (None: it may)."""
    reason: str
    mark: WatermarkMark
    hold_back: bool
    """Take the hold_back path: capped sources, or positions left from an earlier hold_back refresh."""


# ----------------------------------------------------------------- reading


def load_groups(conn: psycopg.Connection) -> list[wm.Group]:
    rows = (
        tolerant_cursor(conn)
        .execute(
            """
        SELECT g.group_id, g.group_name, g.tolerance, g.stale_after, g.effective_watermark,
               coalesce(json_agg(json_build_object(
                   'relid', m.source_relid, 'wm', w.watermark,
                   'adv', h.advancement_id, 'adv_wm', h.watermark, 'xid', h.xid::text,
                   'snap', h.snapshot::text)) FILTER (WHERE m.source_relid IS NOT NULL), '[]')
          FROM pgtrickle.pgt_watermark_groups g
          LEFT JOIN pgtrickle.pgt_watermark_group_sources m USING (group_id)
          LEFT JOIN pgtrickle.pgt_watermarks w ON w.source_relid = m.source_relid
          LEFT JOIN pgtrickle.pgt_watermark_history h ON h.advancement_id = m.aligned_advancement
         GROUP BY g.group_id ORDER BY g.group_name
        """
        )
        .fetchall()
    )
    groups = []
    for gid, name, tolerance, stale_after, effective, members in rows:
        watermarks = {int(m["relid"]): parse_instant(m["wm"]) for m in members if m["wm"] is not None}
        aligned = {
            int(m["relid"]): wm.Advancement(
                int(m["adv"]), int(m["relid"]), parse_instant(m["adv_wm"]), int(m["xid"]), m["snap"]
            )
            for m in members
            if m["adv"] is not None
        }
        groups.append(
            wm.Group(
                int(gid),
                name,
                frozenset(int(m["relid"]) for m in members),
                tolerance,
                watermarks,
                effective,
                aligned,
                stale_after,
            )
        )
    return groups


@dataclass(frozen=True)
class _Graph:
    direct: dict[int, list[int]]
    st_relids: dict[int, int]
    names: dict[int, str]
    settings: dict[int, str]
    positions: dict[int, dict | None]


def _graph(conn: psycopg.Connection) -> _Graph:
    direct: dict[int, list[int]] = {}
    for pgt_id, relid in conn.execute(
        "SELECT pgt_id, source_relid FROM pgtrickle.pgt_dependencies"
    ).fetchall():
        direct.setdefault(int(pgt_id), []).append(int(relid))
    st_relids, names, settings, positions = {}, {}, {}, {}
    for pgt_id, relid, name, setting, pos in conn.execute(
        "SELECT pgt_id, pgt_relid, pgtrickle._display_name(pgt_schema, pgt_name), watermark_gating,"
        " watermark_positions FROM pgtrickle.pgt_stream_tables"
    ).fetchall():
        st_relids[int(relid)] = int(pgt_id)
        names[int(pgt_id)] = name
        settings[int(pgt_id)] = setting
        positions[int(pgt_id)] = pos
    return _Graph(direct, st_relids, names, settings, positions)


def _group_points(positions: dict | None) -> dict[int, datetime]:
    return {int(k): parse_instant(v) for k, v in ((positions or {}).get("groups") or {}).items()}


def _source_positions(positions: dict | None) -> dict[int, str]:
    return {int(k): v for k, v in ((positions or {}).get("sources") or {}).items()}


# ---------------------------------------------------------------- deciding


def evaluate(conn: psycopg.Connection, st: StreamTable) -> WatermarkCheck | None:
    """The watermark decision for one refresh of ``st``; ``None`` when no watermark matters to it."""
    stored = _source_positions(st.watermark_positions)
    has_groups = conn.execute("SELECT EXISTS (SELECT 1 FROM pgtrickle.pgt_watermark_groups)").fetchone()
    if not (has_groups and has_groups[0]) and not stored and st.effective_watermark is None:
        return None
    groups = load_groups(conn)
    graph = _graph(conn)
    bases = wm.base_sources(st.pgt_id, graph.direct, graph.st_relids)
    mode, origin = wm.effective_mode(st.watermark_gating, bases, groups)
    applicable = wm.applicable_groups(bases, groups)
    if mode != "hold_back":
        decision = wm.gate_decision(mode, applicable)
        mark = WatermarkMark(decision.effective_watermark if mode == "gate" else None, None)
        return WatermarkCheck(
            mode,
            origin,
            decision.reason if decision.blocked else None,
            decision.reason,
            mark,
            hold_back=bool(stored),
        )
    upstream = []
    direct_tables = []
    for source in st.sources:
        up = graph.st_relids.get(source.relid)
        if up is None:
            direct_tables.append(source.relid)
            continue
        up_bases = wm.base_sources(up, graph.direct, graph.st_relids)
        up_mode, _ = wm.effective_mode(graph.settings[up], up_bases, groups)
        upstream.append(
            wm.UpstreamMark(
                source.relid, graph.names[up], up_bases, up_mode, _group_points(graph.positions[up])
            )
        )
    plan = wm.hold_back_plan(applicable, direct_tables, upstream)
    if plan.skip_reason is not None:
        return WatermarkCheck(
            mode, origin, plan.skip_reason, plan.skip_reason, WatermarkMark(None, None), hold_back=True
        )
    caps = {relid: wm.cap_snapshot(adv) for relid, adv in plan.caps.items()}
    positions = None
    if plan.group_points:
        positions = {
            "sources": {str(k): v for k, v in caps.items()},
            "groups": {str(k): v.isoformat() for k, v in plan.group_points.items()},
        }
    return WatermarkCheck(
        mode,
        origin,
        None,
        plan.reason,
        WatermarkMark(plan.effective_watermark, positions, caps),
        hold_back=bool(caps) or bool(stored),
    )


@dataclass(frozen=True)
class Window:
    pending: list[PendingChanges]
    skip_reason: str | None = None


def hold_back_window(
    conn: psycopg.Connection, st: StreamTable, check: WatermarkCheck, snapshot: str
) -> Window:
    """The changes a hold_back refresh up to ``snapshot`` would consume (or undo), per source.

    Each source's window runs from where the stream table read it last (its
    stored position, else the frontier) to its cap (else ``snapshot``). Rows
    the stream table holds beyond a cap (it refreshed before the hold-back
    applied) count too: a FULL refresh takes them back out. A capped source
    must still have every change after its cap in its buffer: the FULL
    refresh rebuilds it as of the cap from them.
    """
    stored = _source_positions(st.watermark_positions)
    caps = check.mark.caps
    pending = []
    for source in st.sources:
        buffer = sql.Identifier(source.buffer_name)
        upper = caps.get(source.relid, snapshot)
        name = f"{source.schema}.{source.name}"
        if source.relid in caps:
            cap = caps[source.relid]
            row = conn.execute(
                sql.SQL(
                    "SELECT c.cleaned_below IS NOT NULL AND c.cleaned_below > pg_snapshot_xmin(%(c)s::pg_snapshot),"
                    " (SELECT bool_or(b.action = 'T') FROM pgtrickle_changes.{} b"
                    "   WHERE b.xid >= pg_snapshot_xmin(%(c)s::pg_snapshot)"
                    "     AND NOT pg_visible_in_snapshot(b.xid, %(c)s::pg_snapshot)"
                    "     AND pg_visible_in_snapshot(b.xid, %(s)s::pg_snapshot))"
                    " FROM pgtrickle.pgt_change_sources c WHERE c.source_relid = %(r)s"
                ).format(buffer),
                {"c": cap, "s": snapshot, "r": source.relid},
            ).fetchone()
            if row and row[0]:
                return Window(
                    [],
                    (
                        f"hold_back: the changes of {name} after its watermark snapshot were already cleaned up "
                        "(the stream table had refreshed past it); it waits for the group's next aligned point "
                        "(or refresh with force => true to read the source as it is now)"
                    ),
                )
            if row and row[1]:
                return Window(
                    [],
                    (
                        f"hold_back: {name} was truncated after its watermark snapshot, so it cannot be read as of "
                        "it; it waits for the group's next aligned point (or refresh with force => true)"
                    ),
                )
        if st.frontier is None:
            pending.append(PendingChanges(source, 0, 0, 0, False))
            continue
        lower = stored.get(source.relid, st.frontier)
        row = conn.execute(
            sql.SQL(
                "SELECT count(*) FILTER (WHERE fwd AND action = 'I'), count(*) FILTER (WHERE fwd AND action = 'D'),"
                " count(*) FILTER (WHERE fwd AND action = 'U') + count(*) FILTER (WHERE back),"
                " coalesce(bool_or(action = 'T'), false)"
                " FROM (SELECT action,"
                "         NOT pg_visible_in_snapshot(xid, %(l)s::pg_snapshot)"
                "         AND pg_visible_in_snapshot(xid, %(u)s::pg_snapshot) AS fwd,"
                "         pg_visible_in_snapshot(xid, %(l)s::pg_snapshot)"
                "         AND NOT pg_visible_in_snapshot(xid, %(u)s::pg_snapshot)"
                "         AND pg_visible_in_snapshot(xid, %(s)s::pg_snapshot) AS back"
                "    FROM pgtrickle_changes.{}"
                "   WHERE xid >= least(pg_snapshot_xmin(%(l)s::pg_snapshot), pg_snapshot_xmin(%(u)s::pg_snapshot))) w"
                " WHERE fwd OR back"
            ).format(buffer),
            {"l": lower, "u": upper, "s": snapshot},
        ).fetchone()
        assert row is not None
        pending.append(PendingChanges(source, int(row[0]), int(row[1]), int(row[2]), bool(row[3])))
    return Window(pending)


def gated_reason(conn: psycopg.Connection, st: StreamTable) -> str | None:
    """Why a manual refresh of ``st`` is refused (a ``gate`` with a misaligned group), or None."""
    check = evaluate(conn, st)
    if check is None or check.mode != "gate":
        return None
    return check.blocked


# ------------------------------------------------------------ stale alerts


def send_stale_alerts(conn: psycopg.Connection) -> int:
    """Alert ``watermark_stuck`` (once per stall) for every group member that has not advanced in time.

    ``watermark_resumed`` is sent by advance_watermark itself, in the
    transaction that moves the watermark. Returns the alerts sent.
    """
    rows = (
        tolerant_cursor(conn)
        .execute(
            """
        SELECT g.group_id, g.group_name, m.source_relid, pgtrickle._rel_display(m.source_relid),
               coalesce(w.advanced_at, g.created_at), w.watermark, g.stale_after,
               m.stuck_since IS NOT NULL, clock_timestamp()
          FROM pgtrickle.pgt_watermark_groups g
          JOIN pgtrickle.pgt_watermark_group_sources m USING (group_id)
          LEFT JOIN pgtrickle.pgt_watermarks w ON w.source_relid = m.source_relid
         WHERE g.stale_after IS NOT NULL AND m.stuck_since IS NULL
        """
        )
        .fetchall()
    )
    sent = 0
    for gid, group, relid, source, last, watermark, stale_after, alerted, now in rows:
        if not wm.stuck_due(last, stale_after, now, alerted):
            continue
        with conn.transaction():
            cur = conn.execute(
                "UPDATE pgtrickle.pgt_watermark_group_sources SET stuck_since = %s"
                " WHERE group_id = %s AND source_relid = %s AND stuck_since IS NULL",
                (now, gid, relid),
            )
            if not cur.rowcount:
                continue
            payload = {
                "event": "watermark_stuck",
                "group": group,
                "source": source,
                "watermark": watermark.isoformat() if watermark else None,
                "last_advanced_at": last.isoformat(),
                "stale_after": str(stale_after),
                "at": now.isoformat(),
            }
            conn.execute("SELECT pgtrickle._send_alert(%s::jsonb)", (json.dumps(payload),))
            sent += 1
    return sent
