"""What the fault-injection tests share: a daemon process to kill, writers to pause, the catch-up wait.

* :class:`DaemonProcess` — ``pgtrickle run`` in its own process group (with
  its Spark JVM and, in local-cluster mode, the executor JVMs), output to a
  log file; killed with SIGKILL by process group.
* :class:`Writers` — threads doing mixed INSERT / UPDATE / DELETE (and some
  rollbacks) on the workload's sources until paused; optionally riding
  through a PostgreSQL restart by reconnecting.
* :func:`wait_caught_up` — every stream table's frontier covers a
  transaction committed after the writers paused (twice, so stream tables
  over stream tables have caught up with their upstream's last refresh).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psycopg

from tests.conftest import Database

SRC = str(Path(__file__).resolve().parents[2] / "src")

# ---------------------------------------------------------------------------- workload

WORKLOAD_TABLES = """
CREATE TABLE accounts (id int PRIMARY KEY, region int NOT NULL, balance int NOT NULL);
INSERT INTO accounts SELECT g, g % 5, g FROM generate_series(1, 400) g;
CREATE TABLE events (id bigint PRIMARY KEY, account int NOT NULL, amount int NOT NULL);
INSERT INTO events SELECT g, 1 + g % 400, g % 100 FROM generate_series(1, 2000) g;
"""

STREAM_TABLES: dict[str, tuple[str, str]] = {
    # name: (defining query, refresh_mode)
    "acct_by_region": (
        "SELECT region, count(*) AS n, sum(balance) AS total FROM accounts GROUP BY region",
        "DIFFERENTIAL",
    ),
    "big_events": ("SELECT id, account, amount FROM events WHERE amount > 50", "DIFFERENTIAL"),
    "event_totals": (
        "SELECT a.region, count(*) AS n, sum(e.amount) AS total FROM events e "
        "JOIN accounts a ON a.id = e.account GROUP BY a.region",
        "DIFFERENTIAL",
    ),
    "region_top": ("SELECT region, max(balance) AS top, count(*) AS n FROM accounts GROUP BY region", "FULL"),
    "region_summary": ("SELECT sum(n) AS n, sum(total) AS total FROM acct_by_region", "DIFFERENTIAL"),
}


def create_workload(db: Database, *, wal_source: str | None = "events", schedule: str = "1s") -> list[str]:
    """The sources and stream tables of the fault tests; ``wal_source`` is captured from the WAL."""
    db.sql(WORKLOAD_TABLES)
    # Keep the differential stream tables differential under the writers' churn (no adaptive FULL).
    db.sql("UPDATE pgtrickle.pgt_settings SET value = '1000' WHERE name = 'differential_fallback_ratio'")
    for name, (query, mode) in STREAM_TABLES.items():
        db.sql(
            "SELECT pgtrickle.create_stream_table(%s, %s, schedule => %s, refresh_mode => %s)",
            (name, query, schedule, mode),
        )
    if wal_source:
        db.sql("UPDATE pgtrickle.pgt_settings SET value = '30 seconds' WHERE name = 'wal_transition_timeout'")
        db.sql("SELECT pgtrickle.set_cdc_mode(%s, 'wal')", (wal_source,))
    return list(STREAM_TABLES)


class Writers:
    """Mixed INSERT / UPDATE / DELETE on ``accounts`` and ``events``, one thread each, until paused.

    ``reconnect``: a lost connection (a PostgreSQL restart) is survived by
    reconnecting; whether the transaction in flight committed does not
    matter, the oracle compares with whatever the sources hold.
    """

    def __init__(self, dsn: str, seed: int, reconnect: bool = False) -> None:
        self.dsn = dsn
        self.reconnect = reconnect
        self.running = threading.Event()
        self.stop = threading.Event()
        self.idle = [threading.Event(), threading.Event()]
        self.errors: list[BaseException] = []
        self.committed = 0
        self.reconnects = 0
        self.threads = [
            threading.Thread(
                target=self._loop, args=(i, random.Random(seed + i)), daemon=True, name=f"writer-{i}"
            )
            for i in range(2)
        ]

    def start(self) -> None:
        self.running.set()
        for thread in self.threads:
            thread.start()

    def pause(self, timeout: float = 60) -> None:
        """Return once no writer has a transaction open."""
        self.running.clear()
        for idle in self.idle:
            assert idle.wait(timeout), "a writer did not pause"
        self.check()

    def resume(self) -> None:
        self.check()
        self.running.set()

    def close(self) -> None:
        self.stop.set()
        self.running.set()
        for thread in self.threads:
            thread.join(timeout=60)

    def check(self) -> None:
        assert not self.errors, f"a writer failed: {self.errors[0]!r}"

    def _loop(self, which: int, rng: random.Random) -> None:
        step = self._accounts if which == 0 else self._events
        conn: psycopg.Connection | None = None
        try:
            while not self.stop.is_set():
                if not self.running.is_set():
                    self.idle[which].set()
                    self.running.wait()
                    continue
                self.idle[which].clear()
                try:
                    if conn is None or conn.closed:
                        conn = psycopg.connect(self.dsn, application_name=f"fault-writer-{which}")
                    step(conn, rng)
                    if rng.random() < 0.1:
                        conn.rollback()
                    else:
                        conn.commit()
                        self.committed += 1
                except psycopg.OperationalError:
                    if not self.reconnect:
                        raise
                    self.reconnects += 1
                    if conn is not None:
                        conn.close()
                    conn = None
                    time.sleep(0.2)
                time.sleep(rng.uniform(0.01, 0.1))
        except BaseException as exc:  # noqa: BLE001 - reported by check()
            self.errors.append(exc)
        finally:
            self.idle[which].set()
            if conn is not None:
                conn.close()

    @staticmethod
    def _accounts(conn: psycopg.Connection, rng: random.Random) -> None:
        r = rng.random()
        if r < 0.35:
            conn.execute(
                "INSERT INTO accounts SELECT coalesce(max(id), 0) + g, %s, %s FROM accounts, "
                "generate_series(1, %s) g GROUP BY g",
                (rng.randrange(5), rng.randrange(1000), rng.randint(1, 3)),
            )
        elif r < 0.75:
            conn.execute(
                "UPDATE accounts SET balance = balance + %s WHERE id %% 97 = %s",
                (rng.randint(-50, 50), rng.randrange(97)),
            )
        elif r < 0.85:
            conn.execute(
                "UPDATE accounts SET region = (region + 1) % 5 WHERE id = "
                "(SELECT id FROM accounts ORDER BY random() LIMIT 1)"
            )
        else:
            conn.execute(
                "DELETE FROM accounts WHERE id IN (SELECT id FROM accounts ORDER BY random() LIMIT 2)"
            )

    @staticmethod
    def _events(conn: psycopg.Connection, rng: random.Random) -> None:
        r = rng.random()
        if r < 0.45:
            conn.execute(
                "INSERT INTO events SELECT coalesce(max(id), 0) + g, 1 + (random() * 450)::int, "
                "(random() * 100)::int FROM events, generate_series(1, %s) g GROUP BY g",
                (rng.randint(1, 5),),
            )
        elif r < 0.8:
            conn.execute(
                "UPDATE events SET amount = (amount + %s) %% 101 WHERE id %% 53 = %s",
                (rng.randint(1, 30), rng.randrange(53)),
            )
        else:
            conn.execute("DELETE FROM events WHERE id IN (SELECT id FROM events ORDER BY random() LIMIT 3)")


# ---------------------------------------------------------------------------- waiting


def poll(
    condition: Callable[[], bool],
    what: str,
    timeout: float,
    check: Callable[[], None] = lambda: None,
    interval: float = 0.1,
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        check()
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(interval)


def marker_xid(dsn: str) -> str:
    """The xid of a transaction committed now (every earlier commit is visible to whoever sees it)."""
    with psycopg.connect(dsn) as conn:
        xid = conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0]  # type: ignore[index]
        conn.commit()
    return str(xid)


def behind(db: Database, names: Sequence[str], xid: str) -> list[str]:
    """The stream tables whose frontier does not cover ``xid`` yet."""
    rows = db.sql(
        "SELECT pgt_name FROM pgtrickle.pgt_stream_tables WHERE pgt_name = ANY(%s) AND"
        " (frontier IS NULL OR NOT pg_visible_in_snapshot(%s::xid8, frontier))",
        (list(names), xid),
    )
    return [r[0] for r in rows]


def wait_caught_up(
    db: Database,
    names: Sequence[str],
    timeout: float,
    check: Callable[[], None] = lambda: None,
    step: Callable[[], None] = lambda: None,
) -> None:
    """Every frontier covers everything committed before this call (``step`` refreshes, when no daemon does)."""
    for _ in range(2):  # the second round: downstream of a stream table refreshed late in the first
        xid = marker_xid(db.dsn)

        def done() -> bool:
            step()
            return not behind(db, names, xid)

        poll(done, f"stream tables {behind(db, names, xid)} to cover xid {xid}", timeout, check)


def populate(db: Database, names: Sequence[str], writers: Writers, wal_source: str = "events") -> None:
    """Initial population and the move of ``wal_source`` to WAL capture, in this process, before any writer."""
    from pgtrickle.daemon.loop import Scheduler

    scheduler = Scheduler(db.settings, db.dsn)
    try:

        def moved() -> bool:
            scheduler.tick()
            return (
                db.scalar(
                    "SELECT cdc_mode FROM pgtrickle.pgt_change_sources WHERE source_name = %s", (wal_source,)
                )
                == "wal"
            )

        poll(moved, f"{wal_source} to move to WAL capture", 120)
        wait_caught_up(db, names, 120, writers.check, step=lambda: scheduler.tick())
    finally:
        scheduler.close()


def assert_windows_consumed_once(db: Database) -> None:
    """No two completed refreshes of a stream table ended at the same frontier; none still RUNNING."""
    twice = db.sql(
        "SELECT pgt_id, frontier::text, count(*) FROM pgtrickle.pgt_refresh_history"
        " WHERE status = 'COMPLETED' GROUP BY 1, 2 HAVING count(*) > 1"
    )
    assert twice == [], f"a window was applied twice: {twice}"
    running = db.sql("SELECT pgt_id, refresh_id FROM pgtrickle.pgt_refresh_history WHERE status = 'RUNNING'")
    assert running == [], f"refreshes left RUNNING after recovery: {running}"


# ---------------------------------------------------------------------------- the daemon


class DaemonProcess:
    """``pgtrickle run`` in its own process group, output to a log file."""

    def __init__(self, dsn: str, tmp_path: Path, **env: str) -> None:
        self.env = dict(
            os.environ,
            PYTHONPATH=SRC,
            PGTRICKLE_DSN=dsn,
            PGTRICKLE_DATA_DIR=str(tmp_path / "daemon-data"),
            PGTRICKLE_SPARK_MASTER="local[1]",
            PGTRICKLE_TICK_SECONDS="0.3",
            SPARK_LOCAL_IP="127.0.0.1",
        )
        self.env.pop("PGTRICKLE_FAULT_POINT", None)
        self.env.update(env)
        self.tmp_path = tmp_path
        self.runs = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = tmp_path / "daemon-0.log"

    def start(self, fault: str | None = None, *args: str) -> None:
        self.runs += 1
        self.log_path = self.tmp_path / f"daemon-{self.runs}.log"
        env = dict(self.env)
        if fault:
            env["PGTRICKLE_FAULT_POINT"] = fault
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pgtrickle", "-v", "run", *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self, tail: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        assert self.alive(), (
            f"the daemon exited ({self.proc.returncode if self.proc else None}):\n{self.output()}"
        )

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the daemon did not exit within {timeout:.0f}s:\n{self.output()}") from None
        finally:
            self.kill_group()

    def kill(self) -> None:
        """SIGKILL the daemon and everything in its process group (its Spark JVMs)."""
        assert self.proc is not None
        self.kill_group()
        self.proc.wait(timeout=60)

    def kill_group(self) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def descendants(self) -> list[tuple[int, str]]:
        """(pid, command line) of every process below the daemon."""
        assert self.proc is not None
        children: dict[int, list[int]] = {}
        cmdlines: dict[int, str] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    cmdlines[int(entry)] = fh.read().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
        found: list[tuple[int, str]] = []
        todo = [self.proc.pid]
        while todo:
            for child in children.get(todo.pop(), []):
                found.append((child, cmdlines.get(child, "")))
                todo.append(child)
        return found
