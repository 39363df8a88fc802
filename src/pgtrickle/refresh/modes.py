"""The refresh mode of a stream table: decided, recorded, and its table laid out to match.

The decision itself is pure and lives below: :func:`pgtrickle.dvm.layout.decide_mode` (can the
query be maintained differentially, and why not), :func:`pgtrickle.dvm.layout.plan_layout` (the
table's hidden columns for that mode) and :func:`pgtrickle.refresh.plan.plan_refresh` (this
refresh's action, with the adaptive fallback). Here is what a refresh does with it:

- :class:`RefreshModes` caches the decision per query text (shared per database by the
  refreshers of a process), records the effective mode in the catalog (``mode_effective``,
  ``mode_reason``) once per change, and makes the table's layout match it
  (:mod:`pgtrickle.refresh.layout_ddl`), with the hidden state tables of the nodes its delta
  plan keeps (:mod:`pgtrickle.refresh.state_tables`). A differential plan that failed on Spark demotes the
  query to FULL from then on.
- :func:`mode_figures` reads the figures the adaptive fallback weighs (source sizes, ratio).

It uses the refresher only through :class:`~pgtrickle.refresh.context.RefreshContext`.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from pgtrickle.catalog.store import StreamTable
from pgtrickle.dvm.layout import DeltaMode, Layout, decide_mode, plan_layout
from pgtrickle.errors import PgTrickleError, RefreshError, UnsupportedQueryError
from pgtrickle.refresh import history
from pgtrickle.refresh.capture_check import require_capture
from pgtrickle.refresh.context import RefreshContext
from pgtrickle.refresh.layout_ddl import ensure_layout
from pgtrickle.refresh.plan import DEFAULT_FALLBACK_RATIO, READS_CLOCK_REASON, Action, RefreshPlan
from pgtrickle.refresh.state_tables import ensure_state_tables


class AlreadyRecorded(Exception):
    """Carries an error whose failure was recorded where it was raised."""

    def __init__(self, error: PgTrickleError) -> None:
        super().__init__(str(error))
        self.error = error


def _analysis_key(st: StreamTable) -> tuple[int, str, bool]:
    """A mode decision's cache key: the table, its query, and whether hidden state tables may be
    kept (refresh_mode DIFFERENTIAL only: dvm/layout.decide_mode)."""
    return st.pgt_id, st.normalized_query, st.refresh_mode == "DIFFERENTIAL"


class RefreshModes:
    """The mode decisions of one refresher (used by the engine)."""

    def __init__(
        self,
        refresher: RefreshContext,
        analyses: dict[tuple[int, str, bool], DeltaMode],
        layouts: dict[int, tuple],
    ) -> None:
        self.r = refresher
        self._analyses = analyses
        """Per (pgt_id, query text, hidden state tables allowed): the decision (shared per database)."""
        self._layouts = layouts
        """Per pgt_id: the layout last made to match (shared per database)."""
        self._recorded_modes: dict[int, tuple[str, str]] = {}

    @property
    def conn(self) -> psycopg.Connection:
        """The refresher's catalog connection (a new one after a reconnect)."""
        return self.r.conn

    def analysis(self, st: StreamTable) -> DeltaMode:
        """The refresh-mode decision of ``st``'s query (cached per query text): see dvm/layout.py."""
        key = _analysis_key(st)
        keep_state = key[2]
        cached = self._analyses.get(key)
        if cached is None:
            schema = {f"{s.schema}.{s.name}": [c for c, _ in s.column_types] for s in st.sources}
            types = {f"{s.schema}.{s.name}": dict(s.column_types) for s in st.sources}
            cached = decide_mode(st.normalized_query, schema, types, visible_columns(st), keep_state)
            self._analyses[key] = cached
        return cached

    def demote(self, st: StreamTable, reason: str) -> None:
        """Analyse ``st``'s query as FULL-only from now on (its differential plan failed on Spark)."""
        self._analyses[_analysis_key(st)] = DeltaMode(False, reason)
        self.record(st, "FULL", reason)

    def prepare(self, st: StreamTable, initiated_by: str) -> tuple[DeltaMode, bool, Layout, bool]:
        """Analyse the query, record the effective mode, and make the table's layout match it."""
        denied = self.conn.execute("SELECT pgtrickle._owner_cannot_read(%s)", (st.pgt_id,)).fetchone()
        if denied and denied[0]:
            raise RefreshError(str(denied[0]))
        require_capture(self.conn, st)
        analysis = self.analysis(st)
        if st.refresh_mode == "DIFFERENTIAL" and not analysis.differential:
            message = (
                f"refresh_mode DIFFERENTIAL is not possible for {st.display}: {analysis.reason}; "
                "use refresh_mode => 'AUTO' or 'FULL'"
            )
            self.record(st, "FULL", message)
            plan = RefreshPlan(Action.FULL, message, 0)
            history_id = history.start_history(self.conn, st, plan, initiated_by)
            history.record_failure(self.conn, st, history_id, message, fatal=True)
            raise AlreadyRecorded(UnsupportedQueryError(message))
        differential = analysis.differential and st.refresh_mode != "FULL"
        self.record(
            st,
            "DIFFERENTIAL" if differential else "FULL",
            READS_CLOCK_REASON
            if st.reads_clock
            else analysis.reason
            if st.refresh_mode != "FULL"
            else "refresh_mode is FULL",
        )
        layout = plan_layout(
            visible_columns(st),
            {c.name: c.type for c in st.columns},
            st.qualified,
            analysis,
            differential,
            pgt_id=st.pgt_id,
            relations={f"{s.schema}.{s.name}": (s.schema, s.name) for s in st.sources},
            column_types={f"{s.schema}.{s.name}": dict(s.column_types) for s in st.sources},
        )
        kept = tuple(t.name for t in layout.state_tables)
        key = (st.pgt_id, st.normalized_query, layout.columns, differential, kept)
        changed = False
        if self._layouts.get(st.pgt_id) != key:
            changed = ensure_layout(self.conn, st, layout)
            with self.conn.transaction():
                # New hidden state tables are empty: the table is recomputed (FULL) to fill them.
                changed = bool(ensure_state_tables(self.conn, st.pgt_id, layout.state_tables)) or changed
            self._layouts[st.pgt_id] = key
        return analysis, differential, layout, changed

    def record(self, st: StreamTable, mode: str, reason: str) -> None:
        # Recorded once per change, not on every refresh (this is the refresh path).
        if self._recorded_modes.get(st.pgt_id) == (mode, reason):
            return
        self._recorded_modes[st.pgt_id] = (mode, reason)
        self.conn.execute(
            """
            UPDATE pgtrickle.pgt_stream_tables
               SET mode_effective = %(m)s, mode_reason = %(r)s, mode_analyzed_at = now()
             WHERE pgt_id = %(id)s
               AND (mode_effective, mode_reason) IS DISTINCT FROM (%(m)s, %(r)s)
            """,
            {"m": mode, "r": reason, "id": st.pgt_id},
        )


def mode_figures(conn: psycopg.Connection, st: StreamTable, changes: int) -> tuple[float, float]:
    """(rows of all sources, fallback ratio) for the adaptive fallback.

    Planner statistics where the source has them; a source never analysed
    (``reltuples`` = -1, common right after a bulk load) is counted, but
    only up to the size that would keep this refresh differential.
    """
    setting = conn.execute(
        "SELECT value::float8 FROM pgtrickle.pgt_settings WHERE name = 'differential_fallback_ratio'"
    ).fetchone()
    ratio = st.diff_fallback_ratio or (
        setting[0] if setting and setting[0] is not None else DEFAULT_FALLBACK_RATIO
    )
    enough = int(changes / ratio) + 1
    total = 0.0
    for source in st.sources:
        row = conn.execute(
            "SELECT reltuples, pg_stat_get_live_tuples(oid) FROM pg_class WHERE oid = %s", (source.relid,)
        ).fetchone()
        if row is None:
            continue
        if row[0] >= 0:
            total += max(float(row[0]), float(row[1]))
        else:
            counted = conn.execute(
                sql.SQL("SELECT count(*) FROM (SELECT FROM {} LIMIT %s) s").format(sql.SQL(source.qualified)),
                (enough,),
            ).fetchone()
            total += float(counted[0]) if counted else 0.0
    return total, float(ratio)


def visible_columns(st: StreamTable) -> tuple[str, ...]:
    """The names of ``st``'s visible columns, in table order."""
    return tuple(c.name for c in st.columns)
