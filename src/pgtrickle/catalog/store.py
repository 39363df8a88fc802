"""Reading the catalog into plain values (the daemon keeps nothing else)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgtrickle.db.instants import tolerant
from pgtrickle.sql.ident import quote_ident


@dataclass(frozen=True)
class Column:
    name: str
    type: str


@dataclass(frozen=True)
class Source:
    """A relation a stream table reads: a plain table or another stream table."""

    relid: int
    schema: str
    name: str
    kind: str  # 'TABLE' | 'STREAM_TABLE'
    buffer_name: str
    columns_used: tuple[str, ...] = ()
    column_types: tuple[tuple[str, str], ...] = ()
    """(name, PostgreSQL type) of every column of the source, in order."""
    cdc_mode: str = "trigger"

    @property
    def qualified(self) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"


@dataclass(frozen=True)
class StreamTable:
    pgt_id: int
    relid: int
    schema: str
    name: str
    defining_query: str
    normalized_query: str
    schedule: str
    """The schedule's canonical text, as the user sees it."""
    refresh_mode: str
    status: str
    needs_reinit: bool
    frontier: str | None
    last_refresh_at: datetime | None
    last_attempt_at: datetime | None
    consecutive_errors: int
    created_at: datetime
    last_error: str | None
    columns: tuple[Column, ...]
    sources: tuple[Source, ...] = field(default=())
    diff_fallback_ratio: float | None = None
    """Per-table override of the ``differential_fallback_ratio`` setting."""
    watermark_gating: str = "inferred"
    """The watermark_gating setting: inferred | none | gate | hold_back."""
    diamond_consistency: str = "atomic"
    """atomic | none: whether a diamond ending at this stream table refreshes as one group."""
    effective_watermark: datetime | None = None
    """The minimum watermark of the applicable watermark groups at the last refresh."""
    watermark_positions: dict | None = None
    """hold_back: where each grouped source was read at the last refresh (see gates.watermark_gate)."""
    reinit_reason: str | None = None
    """Why pgtrickle asked for reinitialization (a partition attached with rows, a repaired change
    capture...), if it did."""
    watermark_mark: Any = None
    """Set by the refresh engine for one refresh: the watermark state to commit with the frontier."""
    reads_clock: bool = False
    """The defining query reads the clock (now(), current_date, ...): recomputed on every scheduled refresh."""
    schedule_parsed: dict[str, Any] | None = None
    """The schedule as the catalog's one parser (``pgtrickle._parse_schedule``) gives it, for
    :func:`pgtrickle.scheduler.schedule.schedule_from_parsed`; for a stored text that parser refuses,
    its error (the ``invalid`` form)."""

    @property
    def qualified(self) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"

    @property
    def display(self) -> str:
        return f"{display_ident(self.schema)}.{display_ident(self.name)}"


_PLAIN_IDENT = re.compile(r"^[a-z_][a-z0-9_$]*$")


def display_ident(name: str) -> str:
    """An identifier as a person would type it: quoted only when it needs to be."""
    return name if _PLAIN_IDENT.match(name) else quote_ident(name)


@dataclass(frozen=True)
class RefreshRequest:
    request_id: int
    pgt_id: int
    kind: str
    force: bool


def load_stream_tables(conn: psycopg.Connection, only: int | None = None) -> dict[int, StreamTable]:
    """Every stream table (or just ``only``) with its columns and sources."""
    with conn.cursor(row_factory=dict_row) as cur:
        # A watermark beyond Python's range must not stop the daemon (db/instants.py).
        tolerant(cur)
        rows = cur.execute(
            """
            SELECT s.*,
                   (SELECT coalesce(json_agg(json_build_object('name', a.attname,
                                     'type', format_type(a.atttypid, a.atttypmod)) ORDER BY a.attnum), '[]')
                      FROM pg_attribute a
                     WHERE a.attrelid = s.pgt_relid AND a.attnum > 0 AND NOT a.attisdropped
                       AND a.attname NOT LIKE '\\_\\_pgt\\_%%') AS cols,
                   s.frontier::text AS frontier_text,
                   -- names follow the OID (renames of the table or its schema)
                   (SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                     WHERE c.oid = s.pgt_relid) AS live_schema,
                   (SELECT c.relname::text FROM pg_class c WHERE c.oid = s.pgt_relid) AS live_name,
                   coalesce(pgtrickle._normalized_query(s.def_view), s.normalized_query) AS current_query,
                   -- stored at create / alter; a text with none (refused by the grammar) gets its error
                   coalesce(s.schedule_parsed, pgtrickle._parse_schedule_or_error(s.schedule)) AS schedule_form
              FROM pgtrickle.pgt_stream_tables s
             WHERE %(only)s::bigint IS NULL OR s.pgt_id = %(only)s
             ORDER BY s.pgt_id
            """,
            {"only": only},
        ).fetchall()
        deps = cur.execute(
            """
            SELECT d.pgt_id, d.columns_used, c.source_relid,
                   coalesce((SELECT n.nspname::text FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace
                              WHERE r.oid = c.source_relid), c.source_schema) AS source_schema,
                   coalesce((SELECT r.relname::text FROM pg_class r WHERE r.oid = c.source_relid),
                            c.source_name) AS source_name,
                   c.source_kind, c.buffer_name, c.cdc_mode,
                   (SELECT coalesce(json_agg(json_build_array(a.attname,
                                     format_type(a.atttypid, a.atttypmod)) ORDER BY a.attnum), '[]')
                      FROM pg_attribute a
                     WHERE a.attrelid = c.source_relid AND a.attnum > 0 AND NOT a.attisdropped
                       AND NOT (c.source_kind = 'STREAM_TABLE' AND a.attname LIKE '\\_\\_pgt\\_%%'))
                   AS column_types
              FROM pgtrickle.pgt_dependencies d
              JOIN pgtrickle.pgt_change_sources c USING (source_relid)
             WHERE %(only)s::bigint IS NULL OR d.pgt_id = %(only)s
             ORDER BY d.pgt_id, 4, 5
            """,
            {"only": only},
        ).fetchall()
    sources: dict[int, list[Source]] = {}
    for d in deps:
        sources.setdefault(d["pgt_id"], []).append(
            Source(
                relid=int(d["source_relid"]),
                schema=d["source_schema"],
                name=d["source_name"],
                kind=d["source_kind"],
                buffer_name=d["buffer_name"],
                columns_used=tuple(d["columns_used"] or ()),
                column_types=tuple((str(n), str(t)) for n, t in d["column_types"]),
                cdc_mode=d["cdc_mode"],
            )
        )
    result: dict[int, StreamTable] = {}
    for r in rows:
        result[r["pgt_id"]] = StreamTable(
            pgt_id=r["pgt_id"],
            relid=int(r["pgt_relid"]),
            schema=r["live_schema"] or r["pgt_schema"],
            name=r["live_name"] or r["pgt_name"],
            defining_query=r["defining_query"],
            normalized_query=r["current_query"],
            schedule=r["schedule"],
            refresh_mode=r["refresh_mode"],
            status=r["status"],
            needs_reinit=r["needs_reinit"],
            frontier=r["frontier_text"],
            last_refresh_at=r["last_refresh_at"],
            last_attempt_at=r["last_attempt_at"],
            consecutive_errors=r["consecutive_errors"],
            created_at=r["created_at"],
            last_error=r["last_error"],
            columns=tuple(Column(c["name"], c["type"]) for c in r["cols"]),
            sources=tuple(sources.get(r["pgt_id"], ())),
            diff_fallback_ratio=r.get("diff_fallback_ratio"),
            watermark_gating=r.get("watermark_gating") or "inferred",
            diamond_consistency=r.get("diamond_consistency") or "atomic",
            effective_watermark=r.get("effective_watermark"),
            watermark_positions=r.get("watermark_positions"),
            reads_clock=bool(r.get("reads_clock")),
            reinit_reason=r.get("reinit_reason"),
            schedule_parsed=r["schedule_form"],
        )
    return result


def load_requests(conn: psycopg.Connection) -> list[RefreshRequest]:
    rows = conn.execute(
        "SELECT request_id, pgt_id, kind, force FROM pgtrickle.pgt_refresh_requests ORDER BY request_id"
    ).fetchall()
    return [RefreshRequest(int(a), int(b), str(c), bool(d)) for a, b, c, d in rows]


def upstream_ids(sts: dict[int, StreamTable]) -> dict[int, frozenset[int]]:
    """For each stream table, the stream tables it reads directly."""
    by_relid = {st.relid: st.pgt_id for st in sts.values()}
    return {
        st.pgt_id: frozenset(by_relid[s.relid] for s in st.sources if s.relid in by_relid)
        for st in sts.values()
    }


def load_refresh_groups(conn: psycopg.Connection) -> dict[str, list[int]]:
    """Explicit refresh groups: name → member pgt_ids."""
    rows = conn.execute(
        "SELECT g.group_name, array_agg(m.pgt_id ORDER BY m.pgt_id) FROM pgtrickle.pgt_refresh_groups g"
        " JOIN pgtrickle.pgt_refresh_group_members m USING (group_id) GROUP BY g.group_name"
    ).fetchall()
    return {str(name): [int(i) for i in ids] for name, ids in rows}
