"""Prometheus metrics of the daemon (``prometheus-client``), served over HTTP when a port is set.

Two kinds of series:

* **events**, recorded as refreshes happen: refresh duration, rows, Spark
  job time by stream table and mode; refreshes by action; skips by reason;
  failures (counters and histograms);
* **state**, read from the catalog by the daemon every few seconds and
  exposed as one consistent snapshot: status, staleness, circuit breaker,
  consecutive errors per stream table; change buffer sizes per source;
  whether a source's change capture is broken (objects dropped by hand);
  replication slot lag.

Each :class:`Metrics` has its own registry, so several daemons in one
process (tests) do not mix their series.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

import psycopg
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pgtrickle.ops import health

log = logging.getLogger(__name__)

UPDATE_EVERY_SECONDS = 5.0
"""How often the daemon re-reads the catalog for the state series."""

_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, float("inf"))
_JOB_BUCKETS = (1, 2, 3, 5, 8, 13, 21, 34, float("inf"))
"""Jobs per refresh: one plan per refresh should be one job (docs/OPERATIONS.md)."""


@dataclass
class CatalogSnapshot:
    """The state series, as of one read of the catalog."""

    stream_tables: list[tuple[str, str, float | None, bool, int]] = field(default_factory=list)
    """(name, status, staleness seconds or None, breaker open, consecutive errors)."""
    buffers: list[tuple[str, float, float]] = field(default_factory=list)
    """(source, rows (statistics estimate), bytes)."""
    slots: list[tuple[str, float]] = field(default_factory=list)
    """(slot, retained WAL bytes)."""
    capture: list[tuple[str, bool]] = field(default_factory=list)
    """(source, change capture broken) for every source, stream tables' own buffers included."""
    taken_at: float = 0.0


class _StateCollector(Collector):
    def __init__(self) -> None:
        self.snapshot = CatalogSnapshot()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap = self.snapshot  # one reference: a scrape sees one consistent snapshot
        status = GaugeMetricFamily(
            "pgtrickle_stream_table_status",
            "1 for the stream table's current status",
            labels=["st", "status"],
        )
        stale = GaugeMetricFamily(
            "pgtrickle_staleness_seconds",
            "age of the stream table's data (absent when never refreshed)",
            labels=["st"],
        )
        breaker = GaugeMetricFamily(
            "pgtrickle_circuit_breaker_open",
            "1 when the stream table's circuit breaker is open",
            labels=["st"],
        )
        errors = GaugeMetricFamily("pgtrickle_consecutive_errors", "failed refreshes in a row", labels=["st"])
        for name, st_status, staleness, cb_open, consecutive in snap.stream_tables:
            for value in health.STATUSES:
                status.add_metric([name, value], 1.0 if st_status == value else 0.0)
            if staleness is not None:
                stale.add_metric([name], staleness)
            breaker.add_metric([name], 1.0 if cb_open else 0.0)
            errors.add_metric([name], float(consecutive))
        rows = GaugeMetricFamily(
            "pgtrickle_change_buffer_rows",
            "rows in a source's change buffer (statistics estimate; consumed rows stay until cleanup)",
            labels=["source"],
        )
        size = GaugeMetricFamily(
            "pgtrickle_change_buffer_bytes", "size of a source's change buffer", labels=["source"]
        )
        for source, n, nbytes in snap.buffers:
            rows.add_metric([source], n)
            size.add_metric([source], nbytes)
        lag = GaugeMetricFamily(
            "pgtrickle_slot_lag_bytes", "WAL retained by pgtrickle's replication slot", labels=["slot"]
        )
        for slot, lag_bytes in snap.slots:
            lag.add_metric([slot], lag_bytes)
        broken = GaugeMetricFamily(
            "pgtrickle_change_capture_broken",
            "1 when a capture object of the source is missing or disabled "
            "(changes may be lost; `pgtrickle install` repairs it)",
            labels=["source"],
        )
        for source, is_broken in snap.capture:
            broken.add_metric([source], 1.0 if is_broken else 0.0)
        age = GaugeMetricFamily(
            "pgtrickle_catalog_snapshot_age_seconds",
            "seconds since these state series were read from the catalog",
        )
        age.add_metric([], time.time() - snap.taken_at if snap.taken_at else float("nan"))
        yield from (status, stale, breaker, errors, rows, size, lag, broken, age)


class Metrics:
    """The daemon's metrics: record events, refresh the state snapshot, serve over HTTP."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.refresh_seconds = Histogram(
            "pgtrickle_refresh_duration_seconds",
            "wall time of a refresh that ran (FULL or DIFFERENTIAL)",
            ["st", "mode"],
            registry=r,
            buckets=_DURATION_BUCKETS,
        )
        self.spark_seconds = Histogram(
            "pgtrickle_spark_job_seconds",
            "Spark job time of a refresh",
            ["st", "mode"],
            registry=r,
            buckets=_DURATION_BUCKETS,
        )
        self.spark_jobs = Histogram(
            "pgtrickle_refresh_spark_jobs",
            "Spark jobs a refresh ran (not observed where they cannot be counted: Spark Connect)",
            ["st", "mode"],
            registry=r,
            buckets=_JOB_BUCKETS,
        )
        self.rows = Counter(
            "pgtrickle_refresh_rows",
            "rows a refresh inserted or deleted",
            ["st", "mode", "change"],
            registry=r,
        )
        self.refreshes = Counter(
            "pgtrickle_refreshes", "refresh outcomes by action", ["st", "action"], registry=r
        )
        self.skips = Counter(
            "pgtrickle_refresh_skips", "refreshes a gate skipped, by reason", ["st", "reason"], registry=r
        )
        self.failures = Counter("pgtrickle_refresh_failures", "failed refreshes", ["st"], registry=r)
        self._state = _StateCollector()
        r.register(self._state)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    # ------------------------------------------------------------- events
    def observe_outcome(self, outcome) -> None:
        """Record one refresh outcome (pgtrickle.refresh.engine.RefreshOutcome)."""
        st, action = outcome.st.display, outcome.action.value
        self.refreshes.labels(st, action).inc()
        if action == "SKIP":
            self.skips.labels(st, health.skip_category(outcome.reason)).inc()
        if action in ("FULL", "DIFFERENTIAL"):
            self.refresh_seconds.labels(st, action).observe(outcome.seconds)
            self.spark_seconds.labels(st, action).observe(outcome.spark_seconds)
            if getattr(outcome, "spark_jobs", None) is not None:
                self.spark_jobs.labels(st, action).observe(outcome.spark_jobs)
            self.rows.labels(st, action, "inserted").inc(outcome.rows_inserted)
            self.rows.labels(st, action, "deleted").inc(outcome.rows_deleted)

    def observe_failure(self, st_display: str) -> None:
        self.failures.labels(st_display).inc()

    # -------------------------------------------------------------- state
    def update_from_catalog(self, conn: psycopg.Connection) -> CatalogSnapshot:
        """Read the state series from the catalog (a few small queries) and publish them."""
        snap = CatalogSnapshot(taken_at=time.time())
        for name, status, staleness, cb_open, consecutive in conn.execute(
            "SELECT pgtrickle._display_name(pgt_schema, pgt_name), status,"
            " extract(epoch FROM now() - data_timestamp)::float8, cb_state = 'open', consecutive_errors"
            " FROM pgtrickle.pgt_stream_tables ORDER BY 1"
        ).fetchall():
            snap.stream_tables.append((name, status, staleness, bool(cb_open), int(consecutive)))
        for source, n, nbytes in conn.execute(
            "SELECT pgtrickle._display_name(c.source_schema, c.source_name),"
            " pg_stat_get_live_tuples(r.oid)::float8 + pgtrickle._batched_changes(c.buffer_name),"
            " (pg_total_relation_size(r.oid) + coalesce(pg_total_relation_size(b.oid), 0))::float8"
            " FROM pgtrickle.pgt_change_sources c"
            " JOIN pg_class r ON r.relname = c.buffer_name || '_rows'"
            " AND r.relnamespace = 'pgtrickle_changes'::regnamespace"
            " LEFT JOIN pg_class b ON b.relname = c.buffer_name || '_batches'"
            " AND b.relnamespace = 'pgtrickle_changes'::regnamespace"
            " WHERE c.source_kind = 'TABLE' ORDER BY 1"
        ).fetchall():
            snap.buffers.append((source, float(n), float(nbytes)))
        for slot, lag in conn.execute(
            "SELECT d.slot_name, pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::float8"
            " FROM pgtrickle.pgt_decoder_state d JOIN pg_replication_slots s USING (slot_name)"
        ).fetchall():
            if lag is not None:
                snap.slots.append((slot, float(lag)))
        for source, is_broken in conn.execute(
            "SELECT pgtrickle._display_name(source_schema, source_name),"
            " cardinality(pgtrickle._capture_problems(source_relid)) > 0"
            " FROM pgtrickle.pgt_change_sources ORDER BY 1"
        ).fetchall():
            snap.capture.append((source, bool(is_broken)))
        self._state.snapshot = snap
        return snap

    def due_for_update(self) -> bool:
        return time.time() - self._state.snapshot.taken_at >= UPDATE_EVERY_SECONDS

    # ------------------------------------------------------------ serving
    def serve(self, port: int, address: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``address:port`` (0: a free port) in a background thread; returns the port."""
        self._server, self._thread = start_http_server(port, addr=address, registry=self.registry)
        self.port = int(self._server.server_address[1])
        log.info("Prometheus metrics on http://%s:%d/metrics", address, self.port)
        return self.port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
            self._thread = None

    def render(self) -> bytes:
        """The exposition text (what a scrape returns)."""
        return generate_latest(self.registry)
