"""The pgtrickle daemon: refresh due stream tables in dependency order.

Each tick reads the catalog (the only state; a restart rebuilds everything
from it), builds the DAG, decides which stream tables are due, and refreshes
them upstream first: up to ``max_parallel_refreshes`` at once, each stream
table (or atomic group) as soon as every upstream of it finished in the tick
(daemon/workers.py). ``LISTEN pgtrickle_refresh`` wakes it as soon as a
refresh is requested or a stream table is created; ``LISTEN
pgtrickle_changes`` when a source changed, at the first due time of the
stream tables reading it (scheduler/wake.py). A per-stream-table advisory
lock keeps two daemons (or a daemon and ``pgtrickle refresh``) from
refreshing the same stream table at once.

Losing PostgreSQL (a restart, a network cut): the daemon logs it and
reconnects with exponential backoff (0.5 s doubling to 30 s, for as long as
it takes; :func:`~pgtrickle.scheduler.policy.reconnect_delay`). A refresh
cut off by the loss is rolled back by PostgreSQL; its history row, left
``RUNNING``, is marked ``ABANDONED`` after reconnecting, and the stream table
is refreshed again on its next turn. The WAL decoder thread reconnects on
its own and resumes from its slot.

Stopping: the first SIGINT/SIGTERM lets the refresh in progress finish and
then exits; a second one abandons it (its Spark jobs are cancelled and
nothing is applied — the stream table keeps its previous contents).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import suppress
from datetime import datetime, timedelta

import psycopg

from pgtrickle.catalog.install import require_installed
from pgtrickle.catalog.store import (
    StreamTable,
    load_refresh_groups,
    load_requests,
    load_stream_tables,
    upstream_ids,
)
from pgtrickle.cdc.buffers import cleanup_buffers
from pgtrickle.cdc.modes import CaptureManager
from pgtrickle.cdc.wal import DecoderThread, decoder_slot, wait_for_decoder
from pgtrickle.config import Settings
from pgtrickle.daemon.units import (
    LOCK_NAMESPACE,
    LockedElsewhere,
    StreamTableLocks,
    TickReport,
    Worker,
    group_nodes,
    refresh_batch_unit,
    refresh_group_locked,
    refresh_group_unit,
    refresh_one,
)
from pgtrickle.daemon.wake import Wakes
from pgtrickle.daemon.workers import Job, WorkerPool, inline, run_units, tick_batching
from pgtrickle.db.connection import connect
from pgtrickle.db.query import scalar
from pgtrickle.db.redaction import scrub
from pgtrickle.errors import PgTrickleError, ScheduleError
from pgtrickle.gates import watermark_gate
from pgtrickle.ops import alerts
from pgtrickle.ops.metrics import Metrics
from pgtrickle.refresh.engine import Cancelled, Refresher, RefreshOutcome
from pgtrickle.refresh.plan import Action
from pgtrickle.scheduler.dag import (
    DEFAULT_CALCULATED_SCHEDULE,
    StreamTableNode,
    resolve_calculated,
    topological_order,
)
from pgtrickle.scheduler.groups import RefreshGroup, refresh_groups
from pgtrickle.scheduler.policy import DueReason, DueState, due_reason, next_due_at, reconnect_delay
from pgtrickle.scheduler.ready import ReadySet, Unit, plan_units, unit_dependencies
from pgtrickle.scheduler.schedule import CalculatedSchedule, IntervalSchedule, Schedule, schedule_from_parsed
from pgtrickle.scheduler.wake import CHANGES_CHANNEL, readers_of

__all__ = [
    "LOCK_NAMESPACE",
    "LockedElsewhere",
    "Scheduler",
    "StreamTableLocks",
    "TickReport",
    "effective_groups",
    "group_nodes",
    "ordered",
]

log = logging.getLogger(__name__)

NOTIFY_CHANNEL = "pgtrickle_refresh"
MAINTENANCE_EVERY_SECONDS = 60.0


def _schedules(
    sts: dict[int, StreamTable], default: Schedule, now: datetime
) -> tuple[dict[int, Schedule], dict[int, str]]:
    """Effective schedules, and the stream tables whose stored schedule the grammar refuses."""
    parsed: dict[int, Schedule] = {}
    broken: dict[int, str] = {}
    for st in sts.values():
        try:
            parsed[st.pgt_id] = schedule_from_parsed(st.schedule_parsed)
        except ScheduleError as exc:
            broken[st.pgt_id] = str(exc)
            parsed[st.pgt_id] = default
    ups = upstream_ids(sts)
    nodes = [StreamTableNode(i, sts[i].display, parsed[i], ups[i]) for i in sts]
    return resolve_calculated(nodes, now, default=default), broken


def effective_groups(conn: psycopg.Connection, sts: dict[int, StreamTable]) -> list[RefreshGroup]:
    """The atomic refresh groups in force: diamonds (of ``atomic`` fan-ins) and explicit groups."""
    return refresh_groups(group_nodes(sts), load_refresh_groups(conn))


def ordered(sts: dict[int, StreamTable]) -> list[int]:
    ups = upstream_ids(sts)
    nodes = [StreamTableNode(i, sts[i].display, IntervalSchedule(60), ups[i]) for i in sts]
    return topological_order(nodes)


class Scheduler:
    """Runs ticks against one database."""

    def __init__(
        self,
        settings: Settings,
        dsn: str,
        *,
        progress: Callable[[str], None] | None = None,
        on_outcome: Callable[[RefreshOutcome], None] | None = None,
    ) -> None:
        self.settings = settings
        self.dsn = dsn
        self.progress = progress or (lambda msg: None)
        self.on_outcome = on_outcome or (lambda outcome: None)
        self.conn = connect(dsn, application_name="pgtrickle-scheduler")
        require_installed(self.conn)
        self.locks = StreamTableLocks(self.conn)
        self.refresher = Refresher(settings, dsn, progress=self.progress)
        self.pool = WorkerPool(settings, dsn, settings.max_parallel_refreshes, self.progress)
        """Parallel refresh workers (made on the first tick with more than one unit to run)."""
        self.wakes = Wakes()
        self.stop_requested = False
        self._last_maintenance = 0.0
        self.decoder: DecoderThread | None = None
        self.capture = CaptureManager(self.conn, self.ensure_decoder)
        self._slot_lag_alerted = False
        self.metrics = Metrics()

    def close(self) -> None:
        self.metrics.close()
        self.stop_decoder()
        self.pool.close()
        self.refresher.close()
        self.conn.close()

    # ------------------------------------------------------- connection loss
    def connection_lost(self, *others: psycopg.Connection | None) -> bool:
        """Whether the catalog, refresh (or one of ``others``) connection to PostgreSQL is gone."""
        return any(
            c is not None and (c.broken or c.closed)
            for c in (self.conn, self.refresher.conn, *self.pool.connections(), *others)
        )

    def reconnect(self) -> None:
        """New catalog and refresh connections (raises when PostgreSQL is still unreachable).

        Session advisory locks died with the old connections, so refreshes
        the loss cut off are marked ``ABANDONED`` right away.
        """
        for old in (self.conn, self.refresher.conn):
            with suppress(psycopg.Error):
                old.close()
        self.pool.close()  # its workers reconnect when next used
        self.conn = connect(self.dsn, application_name="pgtrickle-scheduler")
        require_installed(self.conn)
        self.locks = StreamTableLocks(self.conn)
        self.capture = CaptureManager(self.conn, self.ensure_decoder)
        self.refresher.reconnect()
        abandoned = self.abandon_stale_history()
        if abandoned:
            log.warning("%d refresh(es) cut off by the connection loss marked ABANDONED", abandoned)

    def _wait_for_postgres(self, exc: BaseException) -> psycopg.Connection | None:
        """After a lost connection: back off, reconnect, repeat until connected (returns the new
        listener connection) or stopped (``None``)."""
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        attempt = 0
        lost_at = time.monotonic()
        while not self.stop_requested:
            delay = reconnect_delay(attempt)
            attempt += 1
            log.warning(
                "lost the connection to PostgreSQL (%s); reconnecting in %.1fs (attempt %d)",
                first_line,
                delay,
                attempt,
            )
            self._sleep(delay)
            if self.stop_requested:
                return None
            try:
                self.reconnect()
                listener = self._listen()
            except (PgTrickleError, psycopg.Error) as again:
                first_line = (str(again).strip().splitlines() or [type(again).__name__])[0]
                continue
            log.warning(
                "reconnected to PostgreSQL after %d attempt(s), %.1fs", attempt, time.monotonic() - lost_at
            )
            return listener
        return None

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stop_requested and time.monotonic() < deadline:
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def start_metrics(self) -> int | None:
        """Serve Prometheus metrics when a port is configured; returns the port (``None``: off)."""
        if self.settings.metrics_port is None or self.metrics.port is not None:
            return self.metrics.port
        # Published before the server starts: a first scrape never sees an empty catalog.
        self.metrics.update_from_catalog(self.conn)
        port = self.metrics.serve(self.settings.metrics_port, self.settings.metrics_address)
        return port

    # ---------------------------------------------------------- WAL decoder
    def ensure_decoder(self) -> None:
        """Run a decoder thread when this database has WAL capture set up."""
        slot = decoder_slot(self.conn)
        if slot is None:
            return
        if self.decoder is None or not self.decoder.alive:
            self.decoder = DecoderThread(self.dsn, slot)
            self.decoder.start()
            log.info("WAL decoder started on slot %s", slot)

    def stop_decoder(self) -> None:
        if self.decoder is not None:
            self.decoder.stop()
            self.decoder = None

    # -------------------------------------------------------------- ticks
    def _db_now(self) -> datetime:
        row = self.conn.execute("SELECT now()").fetchone()
        assert row is not None
        return row[0]

    def default_schedule(self) -> Schedule:
        """The ``default_schedule`` setting, for calculated stream tables with nothing scheduled
        downstream: 1m when it is missing, refused by the grammar, or itself ``calculated``."""
        row = self.conn.execute(
            "SELECT pgtrickle._parse_schedule_or_error(value) FROM pgtrickle.pgt_settings"
            " WHERE name = 'default_schedule'"
        ).fetchone()
        try:
            default = schedule_from_parsed(row[0]) if row else DEFAULT_CALCULATED_SCHEDULE
        except ScheduleError:
            return DEFAULT_CALCULATED_SCHEDULE
        return DEFAULT_CALCULATED_SCHEDULE if isinstance(default, CalculatedSchedule) else default

    def tick(self, changed_relids: Iterable[int | None] = ()) -> TickReport:
        """Refresh every due stream table, upstream first, up to ``max_parallel_refreshes`` at once.

        ``changed_relids``: sources notified as changed since the last tick (their readers that
        are not due yet become :attr:`pending`, as do downstreams of stream tables refreshed now).
        """
        report = TickReport()
        self.ensure_decoder()
        now = self._db_now()
        started = time.monotonic()
        sts = load_stream_tables(self.conn)
        if not sts:
            self.wakes.forget()
            return report
        requests = load_requests(self.conn)
        requested: dict[int, list[int]] = {}
        forced: set[int] = set()
        manual: set[int] = set()
        for req in requests:
            requested.setdefault(req.pgt_id, []).append(req.request_id)
            if req.force:
                forced.add(req.pgt_id)
            if req.kind == "REFRESH":
                manual.add(req.pgt_id)
        schedules, broken = _schedules(sts, self.default_schedule(), now)
        for pgt_id, message in broken.items():
            self._mark_error(sts[pgt_id], message)

        def due(pgt_id: int, at: datetime) -> DueReason | None:
            return None if pgt_id in broken else due_reason(state(pgt_id), schedules[pgt_id], at)

        def clock() -> datetime:  # the database's time now (one round trip saved per unit)
            return now + timedelta(seconds=time.monotonic() - started)

        ups = upstream_ids(sts)
        readers = readers_of({i: [s.relid for s in st.sources] for i, st in sts.items()})
        notified = {m for relid in changed_relids if relid is not None for m in readers.get(relid, ())}
        changed: set[int] = set()  # stream tables that committed new rows in this tick
        inflowing: set[int] = set()  # ... or started with new input (a batch's followers read them)

        def new_input(pgt_id: int) -> bool:
            inputs = ups[pgt_id] & (changed | inflowing)
            return bool(inputs) or pgt_id in notified or pgt_id in self.wakes.pending

        def state(pgt_id: int) -> DueState:
            st = sts[pgt_id]
            return DueState(
                st.status,
                st.frontier is not None,
                st.last_refresh_at,
                st.last_attempt_at,
                pgt_id in requested,
                st.created_at,
                pgt_id in manual,
                new_input(pgt_id),
                self.wakes.applied.get(pgt_id),
            )

        groups = {g.members: g for g in effective_groups(self.conn, sts)}
        units = plan_units(ordered(sts), groups)
        ready = ReadySet(units, unit_dependencies(units, ups), self.settings.max_parallel_refreshes)
        ended: dict[int, datetime] = {}  # stream tables refreshed or attempted in this tick: when
        results: dict[int, TickReport] = {}
        pending: dict[int, datetime] = {}
        due_now: dict[int, DueReason] = {}  # why each stream table started in this tick is due

        def prepare(unit: Unit, ahead: float = 0.0) -> Job | None:
            at = clock()
            reasons = {m: due(m, at + timedelta(seconds=ahead)) for m in unit.members}
            due_now.update((m, r) for m, r in reasons.items() if r is not None)
            inflowing.update(m for m, r in reasons.items() if r is not None and new_input(m))
            if not any(reasons.values()):
                for m in unit.members:
                    if new_input(m) and m not in broken:
                        when = next_due_at(state(m), schedules[m], at)
                        if when is not None:
                            pending[m] = when
                return None
            if unit.group:
                group = groups[frozenset(unit.members)]
                members = list(unit.members)
                return lambda w: refresh_group_unit(w, group, members, sts, reasons, requested, forced)
            st, reason = sts[unit.key], reasons[unit.key]
            assert reason is not None
            return lambda w: refresh_one(
                w, st, reason, requested.get(st.pgt_id, []), force=st.pgt_id in forced
            )

        def done(unit: Unit, result: TickReport) -> None:
            results[unit.key] = result
            at = clock()
            for outcome in result.refreshed:
                ended[outcome.st.pgt_id] = at
                if outcome.action in (Action.FULL, Action.DIFFERENTIAL):
                    changed.add(outcome.st.pgt_id)
                self.wakes.ended(outcome.st.pgt_id, outcome.action.value, at)
                self.metrics.observe_outcome(outcome)
                self.on_outcome(outcome)
            for st, _ in result.failed:
                ended[st.pgt_id] = at
                self.wakes.ended(st.pgt_id, "FAILED", at)
                self.metrics.observe_failure(st.display)

        batching = tick_batching(
            self.settings,
            sts,
            lambda units: (
                lambda w: refresh_batch_unit(w, [sts[u.key] for u in units], due_now, requested, forced)
            ),
            # A follower due before the next tick joins now: ticks quantize due times anyway, and
            # stream tables refreshed apart by milliseconds would otherwise fall due a tick apart.
            lambda unit: prepare(unit, self.settings.tick_seconds),
        )
        if self.settings.max_parallel_refreshes > 1 and len(units) > 1:
            self.pool.run(ready, prepare, done, lambda: self.stop_requested, batching)
        else:
            worker = Worker(0, self.refresher, self.conn)
            worker.locks = self.locks
            run_units(ready, prepare, done, lambda: self.stop_requested, inline(worker), batching)
        for unit in units:  # in dependency order, whichever finished first
            if unit.key in results:
                report.extend(results[unit.key])
        self.wakes.remember(sts, schedules, state, ended, pending, readers, notified, clock())
        if not self.stop_requested:
            for name, move, why in self.capture.reconcile():
                log.warning("%s: change capture %s (%s)", name, move.value, why)
        self._check_staleness(schedules)
        try:
            self._maintenance()
        except psycopg.Error:
            if self.conn.broken or self.conn.closed:
                raise  # the run loop reconnects
            log.exception("maintenance (buffer cleanup, metrics, pruning) failed; the next tick tries again")
        return report

    def _check_staleness(self, schedules: dict[int, Schedule]) -> None:
        try:
            alerts.check_staleness(self.conn, schedules, self._db_now())
        except psycopg.Error:  # an alert must not stop the daemon
            log.exception("checking stream tables for stale data failed")

    def refresh_group_locked(
        self,
        group: RefreshGroup,
        members: list[int],
        initiated_by: Callable[[StreamTable], str],
        requested: dict[int, list[int]],
        force: bool = False,
        record_no_data: bool = False,
    ) -> list[RefreshOutcome]:
        """Refresh ``group`` on the daemon's own refresher, under every member's advisory lock
        (:func:`~pgtrickle.daemon.units.refresh_group_locked`)."""
        worker = Worker(0, self.refresher, self.conn)
        worker.locks = self.locks
        return refresh_group_locked(worker, group, members, initiated_by, requested, force, record_no_data)

    def _mark_error(self, st: StreamTable, message: str) -> None:
        message = scrub(message)
        if st.status == "ERROR" and st.last_error == message:
            return
        self.conn.execute(
            "UPDATE pgtrickle.pgt_stream_tables SET status = 'ERROR', last_error = %s WHERE pgt_id = %s",
            (message, st.pgt_id),
        )

    def _maintenance(self, force: bool = False) -> None:
        self._check_slot_lag()
        watermark_gate.send_stale_alerts(self.conn)
        if self.metrics.port is not None and (force or self.metrics.due_for_update()):
            self.metrics.update_from_catalog(self.conn)
        if not force and time.monotonic() - self._last_maintenance < MAINTENANCE_EVERY_SECONDS:
            return
        self._last_maintenance = time.monotonic()
        self._drop_unused_wal_capture()
        deleted = cleanup_buffers(self.conn)
        if deleted:
            log.info("removed %d consumed change buffer rows", deleted)
        history, alert_rows = alerts.prune(self.conn)
        if history or alert_rows:
            log.info("pruned %d refresh history rows and %d alerts past their retention", history, alert_rows)
        # Watermark advancements: the latest per source and each group's aligned point are kept.
        self.conn.execute(
            """
            DELETE FROM pgtrickle.pgt_watermark_history h
             WHERE advanced_at < now() - (SELECT value::interval FROM pgtrickle.pgt_settings
                                           WHERE name = 'watermark_history_retention')
               AND NOT EXISTS (SELECT 1 FROM pgtrickle.pgt_watermarks w WHERE w.advancement_id = h.advancement_id)
               AND NOT EXISTS (SELECT 1 FROM pgtrickle.pgt_watermark_group_sources m
                                WHERE m.aligned_advancement = h.advancement_id)
            """
        )

    def _check_slot_lag(self) -> None:
        """Alert ``slot_lag_warning`` once when the slot retains too much WAL (again after recovery)."""
        row = self.conn.execute(
            """
            SELECT s.slot_name, pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint,
                   (SELECT value::bigint FROM pgtrickle.pgt_settings WHERE name = 'slot_lag_alert_bytes')
              FROM pgtrickle.pgt_decoder_state d JOIN pg_replication_slots s USING (slot_name)
            """
        ).fetchone()
        if row is None or row[1] is None:
            return
        slot, lag, limit = row
        if lag > limit and not self._slot_lag_alerted:
            self._slot_lag_alerted = True
            alerts.send_alert(
                self.conn,
                "slot_lag_warning",
                {"slot": slot, "lag_bytes": int(lag), "threshold_bytes": int(limit)},
            )
            log.warning("replication slot %s retains %d bytes of WAL (alert above %d)", slot, lag, limit)
        elif lag <= limit:
            self._slot_lag_alerted = False

    def _drop_unused_wal_capture(self) -> None:
        """No WAL source left: stop the decoder (after it has caught up) and drop slot and publication."""
        row = self.conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pgtrickle.pgt_decoder_state),"
            " EXISTS (SELECT 1 FROM pgtrickle.pgt_change_sources WHERE cdc_mode = 'wal')"
        ).fetchone()
        if not row or not row[0] or row[1]:
            return
        wait_for_decoder(self.conn, self.dsn)
        self.stop_decoder()
        # The walsender leaves the slot a moment after the decoder disconnects; an active
        # slot is not dropped (the next maintenance would try again).
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and scalar(
            self.conn,
            "SELECT EXISTS (SELECT 1 FROM pg_replication_slots s JOIN pgtrickle.pgt_decoder_state d"
            " USING (slot_name) WHERE s.active)",
        ):
            time.sleep(0.05)
        if scalar(self.conn, "SELECT pgtrickle._drop_wal_infrastructure_if_unused()"):
            log.info("no source uses WAL capture any more: replication slot and publication dropped")

    def abandon_stale_history(self) -> int:
        """Mark RUNNING history rows of refreshes no process is running as ABANDONED."""
        rows = self.conn.execute(
            "SELECT DISTINCT pgt_id FROM pgtrickle.pgt_refresh_history WHERE status = 'RUNNING'"
        ).fetchall()
        count = 0
        for (pgt_id,) in rows:
            if self.locks.try_lock(pgt_id):
                try:
                    cur = self.conn.execute(
                        "UPDATE pgtrickle.pgt_refresh_history SET status = 'ABANDONED',"
                        " end_time = clock_timestamp(), error_message = 'the refreshing process stopped'"
                        " WHERE pgt_id = %s AND status = 'RUNNING'",
                        (pgt_id,),
                    )
                    count += cur.rowcount or 0
                finally:
                    self.locks.unlock(pgt_id)
        return count

    # --------------------------------------------------------------- loop
    def run(self, max_ticks: int | None = None, install_signal_handlers: bool = True) -> None:
        """Tick until stopped. Wakes on NOTIFY, else every ``tick_seconds``."""
        if install_signal_handlers:
            self._install_signal_handlers()
        listener: psycopg.Connection | None = self._listen()
        self.abandon_stale_history()
        self.start_metrics()
        ticks = 0
        changed: set[int | None] = set()
        try:
            while not self.stop_requested and listener is not None:
                try:
                    self.tick(changed)
                    ticks += 1
                    if max_ticks is not None and ticks >= max_ticks:
                        break
                    changed = self.wait(listener)
                except Cancelled:
                    break
                except Exception as exc:
                    if not self.connection_lost(listener):
                        raise
                    listener.close()
                    listener = self._wait_for_postgres(exc)
        finally:
            if listener is not None:
                listener.close()

    def wait(self, listener: psycopg.Connection) -> set[int | None]:
        """Wait for the next tick; returns the sources notified as changed meanwhile (daemon/wake.py)."""
        return self.wakes.wait(listener, self.settings.tick_seconds, lambda: self.stop_requested)

    @property
    def pending(self) -> dict[int, datetime]:
        """Stream tables with new input not refreshed yet (their schedule did not allow it): when each is due."""
        return self.wakes.pending

    def _listen(self) -> psycopg.Connection:
        listener = connect(self.dsn, application_name="pgtrickle-listener")
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        listener.execute(f"LISTEN {CHANGES_CHANNEL}")
        self.on_listen(listener)
        return listener

    def on_listen(self, listener: psycopg.Connection) -> None:
        """Hook: the listener connection was opened (at start, and again after a lost connection).

        The serving daemon (daemon/serve.py) registers itself on it.
        """

    def cancel(self) -> None:
        """Abandon the refreshes in progress: their Spark jobs are cancelled, nothing is applied."""
        self.refresher.cancel()
        self.pool.cancel()

    def _install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: object) -> None:
            if self.stop_requested:
                log.warning("second stop signal: abandoning the refresh in progress")
                threading.Thread(target=self.cancel, daemon=True).start()
            else:
                log.warning(
                    "stop signal %s: finishing the refresh in progress, then exiting "
                    "(send it again to abandon it)",
                    signal.Signals(signum).name,
                )
                self.stop_requested = True

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)
