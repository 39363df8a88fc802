"""Soak: 50 stream tables over 10 sources under steady writes and bursts, for a while.

A daemon (``pgtrickle run``, its own process with its own Spark driver JVM)
keeps a mix of stream tables fresh — aggregates, filters, joins, MIN/MAX,
DISTINCT and stream tables over stream tables; DIFFERENTIAL, FULL and AUTO;
schedules from 30 s to 5 min — while writers change the sources steadily and,
every ``--burst-every`` seconds, in one big transaction. Every
``--sample-every`` seconds it samples:

* staleness of every stream table against its schedule (is the scheduler keeping up?),
* RSS of the daemon process and of its Spark driver JVM,
* change-buffer rows (and the age of the oldest one: are buffers cleaned?),
* refreshes completed and failed since the last sample.

At the end the writers stop, every stream table refreshes once more, and each
is checked against its defining query (two-way EXCEPT ALL): nothing lost,
nothing applied twice. It prints a table, writes JSON, and exits 1 when a
check fails:

* no refresh failed, no stream table is in ERROR or SUSPENDED;
* staleness <= schedule period + ``--grace`` (default 60 s) for every stream table at every sample;
* the oldest buffer row is younger than the longest period + buffer cleanup interval + grace;
* RSS (daemon, JVM) of the last quarter of the run is within ``--daemon-growth-mb`` /
  ``--jvm-growth-mb`` of the second quarter (flat, not growing);
* every stream table equals its query at the end.

    .venv/bin/python benchmarks/soak.py [--duration 1800] [--dsn ADMIN_DSN] [--json PATH] [--keep]

Works in a database of its own, ``pgtrickle_soak_<pid>`` (created, and dropped
at the end unless --keep), on the embedded PostgreSQL unless --dsn names a
server (any database on it; the soak database is created next to it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from pgtrickle.catalog.install import install  # noqa: E402
from pgtrickle.config import Settings  # noqa: E402
from pgtrickle.db.connection import resolve_dsn  # noqa: E402
from pgtrickle.refresh.verify import verify  # noqa: E402
from pgtrickle.daemon.loop import MAINTENANCE_EVERY_SECONDS  # noqa: E402
from pgtrickle.scheduler.schedule import interval_seconds, schedule_from_parsed  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SCHEDULES = ("30s", "1m", "2m", "3m", "5m")


@dataclass
class SoakConfig:
    dsn: str | None = None
    duration: float = 1800.0
    sample_every: float = 10.0
    stream_tables: int = 50
    sources: int = 10
    seed_rows: int = 2000
    writes_per_second: float = 20.0
    burst_every: float = 30.0
    burst_rows: int = 3000
    spark_master: str = "local[2]"
    tick: float = 0.5
    schedules: tuple[str, ...] = SCHEDULES
    grace: float = 60.0
    daemon_growth_mb: float = 64.0
    jvm_growth_mb: float = 256.0
    init_timeout: float = 900.0
    drain_timeout: float = 600.0
    keep: bool = False
    quiet: bool = False


@dataclass(frozen=True)
class StreamTableSpec:
    name: str
    query: str
    schedule: str
    mode: str
    shape: str


def stream_table_specs(
    count: int, sources: int, schedules: Sequence[str] = SCHEDULES
) -> list[StreamTableSpec]:
    """The stream tables of the soak (pure): five shapes in turn, each over every schedule."""
    specs = []
    reading = 0  # the stream tables that read sources, spread evenly over them
    for k in range(count):
        shape = ("aggregate", "filter", "join", "min_max", "downstream")[k % 5]
        i, j = reading % sources, (reading + 1) % sources
        reading += shape != "downstream"
        schedule = schedules[(k // 5) % len(schedules)]
        src, other = f"soak.src_{i}", f"soak.src_{j}"
        if shape == "aggregate":
            query, mode = (
                f"SELECT grp, count(*) AS n, sum(val) AS total FROM {src} GROUP BY grp",
                "DIFFERENTIAL",
            )
        elif shape == "filter":
            query, mode = f"SELECT id, grp, val FROM {src} WHERE val > 500", "DIFFERENTIAL"
        elif shape == "join":
            query = (
                f"SELECT a.grp, count(*) AS n, sum(b.val) AS v FROM {src} a JOIN {other} b ON b.id = a.id "
                "GROUP BY a.grp"
            )
            mode = "DIFFERENTIAL"
        elif shape == "min_max":
            query, mode = f"SELECT grp, min(val) AS lo, max(val) AS hi FROM {src} GROUP BY grp", "FULL"
        else:  # over the aggregate stream table four places up
            query, mode = (
                f"SELECT count(*) AS groups, sum(n) AS n, sum(total) AS total FROM soak.st_{k - 4:02d}",
                "AUTO",
            )
        specs.append(StreamTableSpec(f"soak.st_{k:02d}", query, schedule, mode, shape))
    return specs


# ---------------------------------------------------------------- processes


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        fields = text[text.rindex(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def jvm_pids(pid: int) -> list[int]:
    """The Spark driver JVM(s) the daemon started."""
    found = []
    for child in _descendants(pid):
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError):
            continue
        if cmd and cmd[0].endswith(b"java"):
            found.append(child)
    return found


# ---------------------------------------------------------------- writers


class Writers(threading.Thread):
    """Steady single-row-ish writes across the sources, and a big transaction every ``burst_every``."""

    def __init__(self, dsn: str, cfg: SoakConfig, next_ids: dict[int, int]) -> None:
        super().__init__(daemon=True)
        self.dsn, self.cfg, self.next_ids = dsn, cfg, next_ids
        self.stop = threading.Event()
        self.statements = 0
        self.rows_changed = 0
        self.bursts = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(7)
        try:
            with psycopg.connect(self.dsn, autocommit=True, application_name="pgtrickle-soak-writer") as conn:
                started = last_burst = time.monotonic()
                while not self.stop.is_set():
                    now = time.monotonic()
                    if now - last_burst >= self.cfg.burst_every:
                        self._burst(conn, rng)
                        last_burst = now
                    self._one(conn, rng)
                    self.statements += 1
                    ahead = started + self.statements / self.cfg.writes_per_second - time.monotonic()
                    if ahead > 0:
                        self.stop.wait(ahead)
        except BaseException as exc:  # noqa: BLE001 - reported as a problem of the run
            self.error = exc

    def _one(self, conn: psycopg.Connection, rng: random.Random) -> None:
        i = rng.randrange(self.cfg.sources)
        top = self.next_ids[i]
        roll = rng.random()
        if roll < 0.5:
            lo = rng.randrange(1, top)
            cur = conn.execute(
                f"UPDATE soak.src_{i} SET val = (val * 7 + 13) %% 1000, grp = (grp + 1) %% 50"
                " WHERE id BETWEEN %s AND %s",
                (lo, lo + rng.randrange(5)),
            )
        elif roll < 0.8:
            n = rng.randrange(1, 6)
            cur = conn.execute(
                f"INSERT INTO soak.src_{i} SELECT g, g %% 50, (g * 31) %% 1000"
                " FROM generate_series(%s::bigint, %s::bigint) g",
                (top, top + n - 1),
            )
            self.next_ids[i] = top + n
        else:
            lo = rng.randrange(1, top)
            cur = conn.execute(
                f"DELETE FROM soak.src_{i} WHERE id BETWEEN %s AND %s", (lo, lo + rng.randrange(3))
            )
        self.rows_changed += max(cur.rowcount, 0)

    def _burst(self, conn: psycopg.Connection, rng: random.Random) -> None:
        i = rng.randrange(self.cfg.sources)
        top, n = self.next_ids[i], self.cfg.burst_rows
        with conn.transaction():
            conn.execute(
                f"INSERT INTO soak.src_{i} SELECT g, g %% 50, (g * 17) %% 1000"
                " FROM generate_series(%s::bigint, %s::bigint) g",
                (top, top + n - 1),
            )
            # ... and half of them gone again in the same burst (the buffers see both)
            conn.execute(
                f"DELETE FROM soak.src_{i} WHERE id BETWEEN %s AND %s AND id %% 2 = 0", (top, top + n - 1)
            )
        self.next_ids[i] = top + n
        self.rows_changed += n + n // 2
        self.bursts += 1


# ---------------------------------------------------------------- sampling


@dataclass
class Sample:
    t: float
    daemon_rss_mb: float | None
    jvm_rss_mb: float | None
    buffer_rows: int
    oldest_buffer_row_s: float | None
    max_staleness_ratio: float
    late: list[str]
    refreshes: int
    failed: int
    statuses: dict[str, int]


def _sample(
    conn: psycopg.Connection,
    t: float,
    daemon_pid: int,
    periods: dict[str, float],
    grace: float,
    since_refresh_id: int,
) -> tuple[Sample, int]:
    rows = conn.execute(
        "SELECT name, status, extract(epoch FROM staleness) FROM pgtrickle.stream_tables_info"
    ).fetchall()
    late, worst, statuses = [], 0.0, {}
    for name, status, staleness in rows:
        statuses[status] = statuses.get(status, 0) + 1
        period = periods[name]
        stale = float(staleness) if staleness is not None else float("inf")
        worst = max(worst, stale / period)
        if stale > period + grace:
            late.append(f"{name} {stale:.0f}s > {period:.0f}s + {grace:.0f}s")
    buffer_rows, oldest = 0, None
    for (buffer,) in conn.execute("SELECT buffer_name FROM pgtrickle.pgt_change_sources").fetchall():
        n, age = conn.execute(
            psycopg.sql.SQL(
                "SELECT count(*), extract(epoch FROM now() - min(captured_at)) FROM pgtrickle_changes.{}"
            ).format(psycopg.sql.Identifier(buffer))
        ).fetchone()  # type: ignore[misc]
        buffer_rows += int(n)
        if age is not None:
            oldest = max(oldest or 0.0, float(age))
    done, failed, last_id = conn.execute(
        "SELECT count(*) FILTER (WHERE status = 'COMPLETED' AND action <> 'NO_DATA'),"
        " count(*) FILTER (WHERE status = 'FAILED'), coalesce(max(refresh_id), %s)"
        " FROM pgtrickle.pgt_refresh_history WHERE refresh_id > %s AND status <> 'RUNNING'",
        (since_refresh_id, since_refresh_id),
    ).fetchone()  # type: ignore[misc]
    jvms = jvm_pids(daemon_pid)
    jvm = sum(_rss_mb(p) or 0 for p in jvms) if jvms else None
    return Sample(
        round(t, 1),
        _rss_mb(daemon_pid),
        jvm,
        buffer_rows,
        oldest,
        round(worst, 2),
        late,
        int(done),
        int(failed),
        statuses,
    ), int(last_id)


def _fmt(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def print_sample(s: Sample) -> None:
    print(
        f"{s.t:7.0f}s  daemon {_fmt(s.daemon_rss_mb):>5} MB  jvm {_fmt(s.jvm_rss_mb):>5} MB  "
        f"buffers {s.buffer_rows:>7,} rows (oldest {_fmt(s.oldest_buffer_row_s)}s)  "
        f"staleness/period max {s.max_staleness_ratio:5.2f}  late {len(s.late):>2}  "
        f"refreshes +{s.refreshes:<4} failed +{s.failed}",
        flush=True,
    )


# ---------------------------------------------------------------- the run


@dataclass
class SoakReport:
    config: dict[str, Any]
    started_at: str
    init_seconds: float = 0.0
    samples: list[dict[str, Any]] = field(default_factory=list)
    writes: dict[str, int] = field(default_factory=dict)
    refresh_lag_s: dict[str, float] = field(default_factory=dict)
    verified: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def _wait(predicate, timeout: float, every: float = 1.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return bool(predicate())


def _quarter_growth(values: list[float | None]) -> tuple[float | None, float | None, float | None]:
    """(median of the second quarter, median of the last quarter, growth) of a series."""
    got = [v for v in values if v is not None]
    if len(got) < 8:
        return None, None, None
    q = len(got) // 4
    second, last = statistics.median(got[q : 2 * q]), statistics.median(got[-q:])
    return round(second, 1), round(last, 1), round(last - second, 1)


def run_soak(cfg: SoakConfig) -> SoakReport:
    settings = Settings.from_env().with_overrides(dsn=cfg.dsn, spark_master=cfg.spark_master)
    admin_dsn = resolve_dsn(settings)
    dbname = f"pgtrickle_soak_{os.getpid()}"
    dsn = make_conninfo("", **{**conninfo_to_dict(admin_dsn), "dbname": dbname})
    report = SoakReport(
        config=asdict(cfg) | {"dsn": None}, started_at=dt.datetime.now().isoformat(timespec="seconds")
    )
    say = (lambda *a: None) if cfg.quiet else (lambda *a: print(*a, flush=True))
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{dbname}"')
    work = Path(tempfile.mkdtemp(prefix="pgtrickle-soak-"))
    daemon: subprocess.Popen[bytes] | None = None
    writers: Writers | None = None
    try:
        specs = stream_table_specs(cfg.stream_tables, cfg.sources, cfg.schedules)
        next_ids = {}
        with psycopg.connect(dsn, autocommit=True) as conn:
            install(conn)
            conn.execute("CREATE SCHEMA soak")
            for i in range(cfg.sources):
                conn.execute(
                    f"CREATE TABLE soak.src_{i} (id bigint PRIMARY KEY, grp int NOT NULL, val int NOT NULL)"
                )
                conn.execute(
                    f"INSERT INTO soak.src_{i} SELECT g, g %% 50, (g * 37 + {i}) %% 1000"
                    " FROM generate_series(1, %s) g",
                    (cfg.seed_rows,),
                )
                conn.execute(f"ANALYZE soak.src_{i}")
                next_ids[i] = cfg.seed_rows + 1
            for s in specs:
                conn.execute(
                    "SELECT pgtrickle.create_stream_table(%s, %s, schedule => %s, refresh_mode => %s)",
                    (s.name, s.query, s.schedule, s.mode),
                )
            # Each schedule's period, from its form parsed by the catalog (the one schedule grammar).
            now = dt.datetime.now(dt.UTC)
            periods = {
                name: interval_seconds(schedule_from_parsed(parsed), now)
                for name, parsed in conn.execute(
                    "SELECT pgtrickle._display_name(pgt_schema, pgt_name), schedule_parsed"
                    " FROM pgtrickle.pgt_stream_tables"
                ).fetchall()
            }
        say(
            f"{len(specs)} stream tables over {cfg.sources} sources; starting the daemon (Spark {cfg.spark_master})"
        )
        # The DSN (with its password) goes in the environment, not on the command line, where `ps` shows it.
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT / "src"),
            "PGTRICKLE_DATA_DIR": str(work),
            "PGTRICKLE_SPARK_MASTER": cfg.spark_master,
            "PGTRICKLE_DSN": dsn,
        }
        log = (work / "daemon.log").open("wb")
        daemon = subprocess.Popen(
            [sys.executable, "-m", "pgtrickle", "--verbose", "run", "--tick", str(cfg.tick)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=work,
        )
        conn = psycopg.connect(dsn, autocommit=True, application_name="pgtrickle-soak-sampler")
        started = time.monotonic()
        initialized = _wait(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM pgtrickle.pgt_stream_tables WHERE data_timestamp IS NOT NULL"
                ).fetchone()[0]  # type: ignore[index]
                == len(specs)
                or daemon.poll() is not None
            ),
            cfg.init_timeout,
        )
        report.init_seconds = round(time.monotonic() - started, 1)
        if not initialized or daemon.poll() is not None:
            report.problems.append(
                f"not every stream table was initialized within {cfg.init_timeout:.0f}s"
                f" (daemon exit code {daemon.poll()})"
            )
            return report
        say(f"initialized in {report.init_seconds}s; writing for {cfg.duration:.0f}s")
        last_id = int(
            conn.execute("SELECT coalesce(max(refresh_id), 0) FROM pgtrickle.pgt_refresh_history").fetchone()[
                0
            ]
        )  # type: ignore[index]
        first_id = last_id
        writers = Writers(dsn, cfg, next_ids)
        writers.start()
        load_started = time.monotonic()
        samples: list[Sample] = []
        while (elapsed := time.monotonic() - load_started) < cfg.duration - 0.5:
            time.sleep(min(cfg.sample_every, max(0.0, cfg.duration - elapsed)))
            sample, last_id = _sample(
                conn, time.monotonic() - load_started, daemon.pid, periods, cfg.grace, last_id
            )
            samples.append(sample)
            if not cfg.quiet:
                print_sample(sample)
            if daemon.poll() is not None:
                report.problems.append(f"the daemon exited (code {daemon.returncode})")
                break
            if writers.error is not None:
                report.problems.append(f"writers failed: {writers.error}")
                break
        writers.stop.set()
        writers.join(timeout=30)
        report.writes = {
            "statements": writers.statements,
            "rows_changed": writers.rows_changed,
            "bursts": writers.bursts,
        }
        report.samples = [asdict(s) for s in samples]
        # Refresh lag: how much later than its period each scheduled refresh came.
        lags = _refresh_lags(conn, periods, first_id)
        if lags:
            lags.sort()
            report.refresh_lag_s = {
                "p50": round(lags[len(lags) // 2], 2),
                "p95": round(lags[min(len(lags) - 1, int(len(lags) * 0.95))], 2),
                "max": round(lags[-1], 2),
                "count": len(lags),
            }
        # Drain: after the last write every stream table refreshes (on request, upstream first), then
        # the ones over other stream tables once more; then each must equal its query.
        stop_at = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        longest = max(periods.values())
        drain_started = time.monotonic()
        for s in specs:
            conn.execute("SELECT pgtrickle.refresh_stream_table(%s)", (s.name,))
        drained = _wait(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM pgtrickle.pgt_stream_tables WHERE data_timestamp < %s OR data_timestamp IS NULL",
                    (stop_at,),
                ).fetchone()[0]
                == 0
            ),
            cfg.drain_timeout,
        )  # type: ignore[index]
        if drained:
            upstream_done = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
            downstream = [s.name for s in specs if s.shape == "downstream"]
            for name in downstream:
                conn.execute("SELECT pgtrickle.refresh_stream_table(%s)", (name,))
            drained = _wait(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FROM pgtrickle.pgt_stream_tables WHERE pgt_relid = ANY(%s::regclass[]::oid[])"
                        " AND data_timestamp < %s",
                        (downstream, upstream_done),
                    ).fetchone()[0]
                    == 0
                ),  # type: ignore[index]
                cfg.drain_timeout,
            )
        report.summary["drain_seconds"] = round(time.monotonic() - drain_started, 1)
        if not drained:
            report.problems.append(
                f"after the writes stopped, not every stream table refreshed within {cfg.drain_timeout:.0f}s"
            )
        else:
            for s in specs:
                result = verify(conn, s.name)
                report.verified[s.name] = (
                    "ok" if result.ok else f"{result.missing} missing, {result.extra} extra"
                )
                if not result.ok:
                    report.problems.append(f"{s.name} differs from its query: {report.verified[s.name]}")
        _judge(report, samples, cfg, longest)
        conn.close()
        return report
    finally:
        if writers is not None:
            writers.stop.set()
        if daemon is not None and daemon.poll() is None:
            daemon.terminate()
            try:
                daemon.wait(timeout=60)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        tail = (
            (work / "daemon.log").read_text(errors="replace").splitlines()[-40:]
            if (work / "daemon.log").exists()
            else []
        )
        report.summary["daemon_log_tail"] = tail
        if not cfg.keep:
            with psycopg.connect(admin_dsn, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
            for path in sorted(work.rglob("*"), reverse=True):
                path.unlink() if path.is_file() or path.is_symlink() else path.rmdir()
            work.rmdir()


def _refresh_lags(conn: psycopg.Connection, periods: dict[str, float], since_id: int) -> list[float]:
    """For consecutive scheduled refreshes of one stream table: (gap between starts) - period, in seconds."""
    rows = conn.execute(
        "SELECT pgtrickle._display_name(s.pgt_schema, s.pgt_name),"
        " extract(epoch FROM h.start_time - lag(h.start_time) OVER (PARTITION BY h.pgt_id ORDER BY h.refresh_id))"
        " FROM pgtrickle.pgt_refresh_history h JOIN pgtrickle.pgt_stream_tables s USING (pgt_id)"
        " WHERE h.refresh_id > %s AND h.initiated_by = 'SCHEDULER' AND h.status = 'COMPLETED'",
        (since_id,),
    ).fetchall()
    return [max(0.0, float(gap) - periods[name]) for name, gap in rows if gap is not None]


def _judge(report: SoakReport, samples: list[Sample], cfg: SoakConfig, longest: float) -> None:
    failed = sum(s.failed for s in samples)
    if failed:
        report.problems.append(f"{failed} refreshes failed")
    broken = {k: v for s in samples[-1:] for k, v in s.statuses.items() if k in ("ERROR", "SUSPENDED")}
    if broken:
        report.problems.append(f"stream tables not healthy at the end: {broken}")
    late = [(s.t, name) for s in samples for name in s.late]
    if late:
        report.problems.append(
            f"{len(late)} staleness readings beyond schedule + {cfg.grace:.0f}s, first at "
            f"{late[0][0]:.0f}s: {late[0][1]}"
        )
    bound = longest + MAINTENANCE_EVERY_SECONDS + cfg.grace
    old = [s for s in samples if s.oldest_buffer_row_s is not None and s.oldest_buffer_row_s > bound]
    if old:
        report.problems.append(
            f"change buffers not cleaned: a row {old[0].oldest_buffer_row_s:.0f}s old at "
            f"{old[0].t:.0f}s (bound {bound:.0f}s)"
        )
    for key, limit in (("daemon_rss_mb", cfg.daemon_growth_mb), ("jvm_rss_mb", cfg.jvm_growth_mb)):
        second, last, growth = _quarter_growth([getattr(s, key) for s in samples])
        report.summary[key] = {
            "second_quarter_median": second,
            "last_quarter_median": last,
            "growth": growth,
            "min": min((getattr(s, key) for s in samples if getattr(s, key)), default=None),
            "max": max((getattr(s, key) for s in samples if getattr(s, key)), default=None),
        }
        if growth is not None and growth > limit:
            report.problems.append(
                f"{key} grew {growth:.0f} MB from the second to the last quarter (limit {limit:.0f} MB)"
            )
        if growth is None:
            report.problems.append(f"too few samples of {key} to judge memory (need 8)")
    report.summary["max_staleness_ratio"] = max((s.max_staleness_ratio for s in samples), default=None)
    report.summary["buffer_rows_max"] = max((s.buffer_rows for s in samples), default=None)
    report.summary["buffer_rows_last"] = samples[-1].buffer_rows if samples else None
    report.summary["oldest_buffer_row_max_s"] = max(
        (s.oldest_buffer_row_s or 0 for s in samples), default=None
    )
    report.summary["refreshes"] = sum(s.refreshes for s in samples)
    report.summary["failed_refreshes"] = failed


def print_report(report: SoakReport) -> None:
    s = report.summary
    print()
    print(
        f"init {report.init_seconds}s; writes {report.writes}; refreshes {s.get('refreshes')} "
        f"(failed {s.get('failed_refreshes')}); refresh lag {report.refresh_lag_s}"
    )
    for key in ("daemon_rss_mb", "jvm_rss_mb"):
        print(f"{key}: {s.get(key)}")
    print(
        f"max staleness/period {s.get('max_staleness_ratio')}; buffer rows max {s.get('buffer_rows_max')}, "
        f"last {s.get('buffer_rows_last')}; oldest buffer row max {s.get('oldest_buffer_row_max_s')}s"
    )
    ok = sum(1 for v in report.verified.values() if v == "ok")
    print(f"verified {ok}/{len(report.verified)} stream tables against their queries")
    for problem in report.problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    print("OK" if not report.problems else f"{len(report.problems)} problem(s)")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = SoakConfig()
    p.add_argument("--dsn", default=None, help="a DSN of the server to use (default: the embedded one)")
    p.add_argument("--duration", type=float, default=d.duration, help="seconds of writes (default 1800)")
    p.add_argument("--sample-every", type=float, default=d.sample_every)
    p.add_argument("--stream-tables", type=int, default=d.stream_tables)
    p.add_argument("--sources", type=int, default=d.sources)
    p.add_argument("--seed-rows", type=int, default=d.seed_rows)
    p.add_argument("--writes-per-second", type=float, default=d.writes_per_second)
    p.add_argument("--burst-every", type=float, default=d.burst_every)
    p.add_argument("--burst-rows", type=int, default=d.burst_rows)
    p.add_argument("--spark-master", default=d.spark_master)
    p.add_argument(
        "--schedules",
        default=",".join(d.schedules),
        help=f"schedules given to the stream tables in turn (default {','.join(d.schedules)})",
    )
    p.add_argument(
        "--grace", type=float, default=d.grace, help="seconds of staleness allowed beyond a schedule"
    )
    p.add_argument("--daemon-growth-mb", type=float, default=d.daemon_growth_mb)
    p.add_argument("--jvm-growth-mb", type=float, default=d.jvm_growth_mb)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--keep", action="store_true", help="keep the soak database")
    return p.parse_args(argv)


def _stop_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(f"stopped by signal {signum}")  # unwinds through run_soak's clean-up


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop_on_signal)
    cfg = SoakConfig(
        dsn=args.dsn,
        duration=args.duration,
        sample_every=args.sample_every,
        stream_tables=args.stream_tables,
        sources=args.sources,
        seed_rows=args.seed_rows,
        writes_per_second=args.writes_per_second,
        burst_every=args.burst_every,
        burst_rows=args.burst_rows,
        spark_master=args.spark_master,
        grace=args.grace,
        schedules=tuple(x.strip() for x in args.schedules.split(",") if x.strip()),
        daemon_growth_mb=args.daemon_growth_mb,
        jvm_growth_mb=args.jvm_growth_mb,
        keep=args.keep,
    )
    report = run_soak(cfg)
    print_report(report)
    path = args.json or RESULTS / f"soak-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(report), indent=2, default=str))
    print(f"figures written to {path}")
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
