"""PostgreSQL restarts (``pg_ctl restart -m fast`` and ``-m immediate``) under a running daemon.

The test runs its own PostgreSQL (restarting the shared test server would
break the other tests). ``pgtrickle run`` refreshes the fault workload
(:mod:`tests.integration.faultkit`: five stream tables, ``events`` captured
from the WAL) while writers write and reconnect across the restarts. Each
restart is either at a random moment or with a refresh cut off in its apply
transaction: the test holds a lock on ``big_events`` so the daemon's apply
waits inside its transaction, then restarts the server.

After each restart: the same daemon process is still running (it did not
exit or crash-loop), it logged the loss and reconnected with backoff, the
WAL decoder resumed from its slot, a cut-off refresh is ``ABANDONED`` in the
history (not half-applied: the oracle holds after the next refresh), and
once the writers pause every stream table equals its defining query.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from pgtrickle.config import Settings
from pgtrickle.db.embedded import EmbeddedPostgres
from tests.conftest import Database, _free_port
from tests.integration.faultkit import (
    DaemonProcess,
    Writers,
    assert_windows_consumed_once,
    create_workload,
    poll,
    populate,
    wait_caught_up,
)
from tests.integration.helpers import assert_oracle

pytestmark = [pytest.mark.integration, pytest.mark.stress, pytest.mark.usefixtures("spark")]


@pytest.fixture
def own_server() -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL of this test's own, so restarting it disturbs no other test."""
    root = Path(tempfile.mkdtemp(prefix="pgtrickle-test-restart-", dir="/tmp"))
    root.chmod(0o755)
    server = EmbeddedPostgres(root, _free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def restart_db(own_server: EmbeddedPostgres, base_settings: Settings) -> Iterator[Database]:
    from pgtrickle.catalog.install import install

    dsn = own_server.dsn()
    conn = psycopg.connect(dsn, autocommit=True)
    install(conn)
    db = Database(dsn=dsn, settings=replace(base_settings, dsn=dsn), conn=conn)
    try:
        yield db
    finally:
        db.conn.close()


def reopen(db: Database) -> None:
    """The test's own connection died with the server: a new one."""
    db.conn.close()
    db.conn = psycopg.connect(db.dsn, autocommit=True)


def hold_apply(db: Database, table: str, daemon: DaemonProcess) -> psycopg.Connection:
    """Make the daemon's next apply into ``table`` wait, inside its transaction, on a lock held here."""
    blocker = psycopg.connect(db.dsn, application_name="restart-test-blocker")
    blocker.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")  # readers pass, the apply's writes wait

    def waiting() -> bool:
        return bool(
            db.scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgtrickle-refresh'"
                " AND wait_event_type = 'Lock' AND state = 'active'"
            )
        )

    poll(waiting, f"the daemon's apply into {table} to wait on the lock", 120, daemon.check_alive)
    return blocker


def test_daemon_rides_through_fast_and_immediate_restarts(
    own_server: EmbeddedPostgres, restart_db: Database, tmp_path: Path
) -> None:
    db = restart_db
    names = create_workload(db)
    writers = Writers(db.dsn, seed=88, reconnect=True)
    populate(db, names, writers)
    assert_oracle(db, *names)
    daemon = DaemonProcess(db.dsn, tmp_path)
    rng = random.Random(8)
    started = time.monotonic()
    cycles = [("fast", False), ("immediate", True), ("fast", True), ("immediate", False)]
    cut = 0
    try:
        daemon.start()
        writers.start()
        poll(
            lambda: "public.big_events: DIFFERENTIAL" in daemon.output(100_000),
            "the daemon to refresh big_events differentially",
            180,
            daemon.check_alive,
        )
        pid = daemon.proc.pid if daemon.proc else None
        for number, (mode, cut_apply) in enumerate(cycles, 1):
            flushed = db.scalar("SELECT flushed_lsn FROM pgtrickle.pgt_decoder_state")
            abandoned = db.scalar(
                "SELECT count(*) FROM pgtrickle.pgt_refresh_history h JOIN "
                "pgtrickle.pgt_stream_tables s USING (pgt_id) WHERE s.pgt_name = 'big_events'"
                " AND h.status = 'ABANDONED'"
            )
            if cut_apply:
                blocker = hold_apply(db, "big_events", daemon)
            else:
                time.sleep(rng.uniform(0.5, 3.0))
            own_server.restart(mode)
            if cut_apply:
                blocker.close()
            reopen(db)
            poll(
                lambda n=number: daemon.output(1_000_000).count("reconnected to PostgreSQL") >= n,
                f"the daemon to reconnect after restart {number} ({mode})",
                120,
                daemon.check_alive,
            )
            assert daemon.proc is not None and daemon.proc.pid == pid
            writers.pause()
            wait_caught_up(db, names, 180, daemon.check_alive)
            assert_oracle(db, *names)
            assert_windows_consumed_once(db)
            # The decoder resumed from its slot: it streams again past where it was before the restart.
            assert db.scalar(
                "SELECT flushed_lsn > %s::pg_lsn FROM pgtrickle.pgt_decoder_state", (str(flushed),)
            )
            # ... and the daemon's decoder thread is attached to the slot again (after its own backoff;
            # meanwhile a refresh decodes what it needs itself).
            poll(
                lambda: (
                    db.scalar("SELECT active FROM pg_replication_slots WHERE slot_name LIKE 'pgtrickle_%'")
                    is True
                ),
                "the decoder thread to attach to the slot again",
                90,
                daemon.check_alive,
            )
            if cut_apply:
                cut += 1
                now_abandoned = db.scalar(
                    "SELECT count(*) FROM pgtrickle.pgt_refresh_history h JOIN pgtrickle.pgt_stream_tables s"
                    " USING (pgt_id) WHERE s.pgt_name = 'big_events' AND h.status = 'ABANDONED'"
                )
                statuses = db.sql(
                    "SELECT h.refresh_id, h.status, h.error_message FROM pgtrickle.pgt_refresh_history h"
                    " JOIN pgtrickle.pgt_stream_tables s USING (pgt_id) WHERE s.pgt_name = 'big_events'"
                    " ORDER BY h.refresh_id DESC LIMIT 8"
                )
                assert now_abandoned == abandoned + 1, (
                    f"the refresh cut off in its apply is not ABANDONED; big_events' latest history: {statuses};"
                    f" the daemon's log:\n{daemon.output(20_000)}"
                )
            writers.resume()
        daemon.check_alive()
    finally:
        writers.close()
        if daemon.proc is not None and daemon.alive():
            daemon.kill()
    writers.check()
    log = daemon.output(1_000_000)
    assert "lost the connection to PostgreSQL" in log and "reconnecting in 0.5s (attempt 1)" in log, log[
        -4000:
    ]
    print(
        f"\n{len(cycles)} restarts survived ({cut} with a refresh cut off in its apply), "
        f"{writers.committed} writer transactions committed, {writers.reconnects} writer reconnects, "
        f"{time.monotonic() - started:.0f}s"
    )
