"""Change capture is exact under concurrency: triggers, WAL, the trigger→WAL cut, crashes, TRUNCATE.

Every row pgtrickle writes into a source's change buffer is also recorded by
an audit trigger the tests put on the buffer (``public.cdc_audit``), in the
same transaction as the buffer row. The audit therefore lists every buffer
row ever committed, even rows the daemon's maintenance has since deleted as
consumed. The writers record, per transaction, its xid and the row counts of
its statements, so each committed transaction's buffer rows are known exactly:

* triggers: an UPDATE that changes the primary key is a ``D`` + ``I`` pair
  (the capture joins old and new rows on the key), any other UPDATE a ``U``;
* WAL: every UPDATE is a ``U``;
* a TRUNCATE is one ``T`` per truncated table, a rolled-back transaction
  leaves nothing, and no other transaction writes into a source buffer.

So a change lost, captured twice (by both the trigger and the decoder around
the cut, or by the decoder again after a crash) or invented shows up as a
transaction whose buffer rows are neither form. Every stream table is then
compared with its defining query (the oracle).

The tests:

1. four writers and four stream tables refreshing at once, with triggers,
   with WAL, and across the trigger→WAL cut (cdc_mode ``auto``);
2. ``pgtrickle run`` SIGKILLed at random moments while its decoder streams,
   plus two regression tests for what that found (a restarted daemon racing
   its own starting decoder; a commit decoded before its backend has left
   the proc array);
3. TRUNCATE of a source, in both modes, while a writer keeps writing.

``PGTRICKLE_STRESS_SECONDS`` (default 6) scales how long the writers run,
how many times the daemon is killed and how many TRUNCATE rounds run.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from pgtrickle.cdc.wal import SYNC_PREFIX, WalDecoder, wait_for_decoder
from pgtrickle.refresh.plan import Action
from pgtrickle.daemon.loop import Scheduler
from tests.conftest import Database
from tests.integration.helpers import assert_oracle, refresh

pytestmark = [pytest.mark.integration, pytest.mark.stress, pytest.mark.usefixtures("spark")]

STRESS_SECONDS = float(os.environ.get("PGTRICKLE_STRESS_SECONDS", "6"))
HARD_LIMIT_SECONDS = 240.0 + 4 * STRESS_SECONDS  # a hang fails the test instead of stalling CI

# ----------------------------------------------------------------------------- bookkeeping

# buffer actions each kind of statement leaves per affected row, by capture
TRIGGER_FORM = {"ins": {"I": 1}, "upd": {"U": 1}, "pk": {"D": 1, "I": 1}, "del": {"D": 1}}
WAL_FORM = {"ins": {"I": 1}, "upd": {"U": 1}, "pk": {"U": 1}, "del": {"D": 1}}


@dataclass
class Txn:
    """One writer transaction: its xid, what its statements did, whether it committed."""

    xid: int
    stmts: list[tuple[str, str, int]] = field(default_factory=list)  # (source, kind, rowcount)
    inserted: list[tuple[str, int]] = field(default_factory=list)  # (source, id) of INSERTed rows
    committed: bool = False
    long: bool = False
    refreshes_spanned: int = 0

    def sources(self) -> list[str]:
        return sorted({s for s, _, _ in self.stmts})

    def expected(self, source: str, form: dict[str, dict[str, int]]) -> Counter:
        out: Counter = Counter()
        for src, kind, rows in self.stmts:
            if src != source:
                continue
            if kind == "trunc":
                out["T"] += 1  # one per statement, whatever the table held
                continue
            for action, per_row in form[kind].items():
                out[action] += per_row * rows
        return +out

    @property
    def has_pk_change(self) -> bool:
        return any(kind == "pk" and rows for _, kind, rows in self.stmts)


def begin(conn: psycopg.Connection) -> Txn:
    xid = conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0]  # type: ignore[index]
    return Txn(int(xid))


def run_stmt(
    conn: psycopg.Connection, txn: Txn, source: str, kind: str, query: str, params: object = None
) -> int:
    rows = conn.execute(query, params).rowcount  # type: ignore[arg-type]
    txn.stmts.append((source, kind, rows))
    return rows


def install_audit(db: Database, *sources: str) -> None:
    """Record every row inserted into the change buffers of ``sources`` (same transaction)."""
    db.sql(
        'CREATE TABLE public.cdc_audit (source text NOT NULL, xid xid8 NOT NULL, action "char" NOT NULL,'
        " new_id int, old_id int)"
    )
    # The capture function runs with search_path = pg_catalog: everything is qualified.
    db.sql("""
        CREATE FUNCTION public.cdc_audit_fn() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO public.cdc_audit (source, xid, action, new_id, old_id)
            SELECT TG_ARGV[0], r.xid, r.action, r.new_id, r.old_id FROM __audit_new r;
            RETURN NULL;
        END $$""")
    # Statement triggers pack their INSERTed / DELETEd rows into the buffer's batches table.
    db.sql("""
        CREATE FUNCTION public.cdc_audit_batch_fn() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO public.cdc_audit (source, xid, action, new_id, old_id)
            SELECT TG_ARGV[0], b.xid, b.action, CASE WHEN b.action = 'I' THEN e.id END,
                   CASE WHEN b.action = 'D' THEN e.id END
              FROM __audit_new b CROSS JOIN LATERAL unnest(b.v_id) AS e (id);
            RETURN NULL;
        END $$""")
    for source in sources:
        buffer = buffer_of(db, source)
        for part, fn in (("rows", "cdc_audit_fn"), ("batches", "cdc_audit_batch_fn")):
            db.sql(
                f"CREATE TRIGGER cdc_audit AFTER INSERT ON pgtrickle_changes.{buffer}_{part} "
                f"REFERENCING NEW TABLE AS __audit_new FOR EACH STATEMENT "
                f"EXECUTE FUNCTION public.{fn}('{source}')"
            )


def buffer_of(db: Database, source: str) -> str:
    return str(
        db.scalar("SELECT buffer_name FROM pgtrickle.pgt_change_sources WHERE source_name = %s", (source,))
    )


def check_capture(db: Database, txns: list[Txn], forms: set[str]) -> Counter:
    """Every committed transaction's buffer rows are exactly one allowed form; nothing else is there.

    Returns how many (transaction, source) pairs matched each form ('either'
    when both forms are the same, i.e. no primary key changed).
    """
    observed: dict[tuple[int, str], Counter] = defaultdict(Counter)
    for source, xid, action, n in db.sql(
        "SELECT source, xid::text, action, count(*) FROM public.cdc_audit GROUP BY 1, 2, 3"
    ):
        observed[(int(xid), source)][action] = int(n)
    problems: list[str] = []
    matched: Counter = Counter()
    for txn in txns:
        for source in txn.sources():
            got = observed.pop((txn.xid, source), Counter())
            if not txn.committed:
                if got:
                    problems.append(f"rolled-back xid {txn.xid} left {dict(got)} in the buffer of {source}")
                continue
            as_trigger, as_wal = txn.expected(source, TRIGGER_FORM), txn.expected(source, WAL_FORM)
            if as_trigger == as_wal and got == as_trigger:
                matched["either"] += 1
            elif "trigger" in forms and got == as_trigger:
                matched["trigger"] += 1
            elif "wal" in forms and got == as_wal:
                matched["wal"] += 1
            else:
                problems.append(
                    f"xid {txn.xid} on {source}: buffer has {dict(got)}, expected "
                    + " or ".join(
                        f"{dict(e)} ({f})"
                        for f, e in (("trigger", as_trigger), ("wal", as_wal))
                        if f in forms
                    )
                    + f"; statements {txn.stmts}"
                )
    for (xid, source), got in sorted(observed.items()):
        problems.append(
            f"xid {xid} is no writer's transaction but wrote {dict(got)} into the buffer of {source}"
        )
    # Each INSERTed id: exactly one 'I' row if its transaction committed, none otherwise.
    wanted = Counter(key for t in txns if t.committed for key in t.inserted)
    inserted_ids = {key for t in txns for key in t.inserted}
    seen = Counter(
        (source, new_id)
        for source, new_id in db.sql("SELECT source, new_id FROM public.cdc_audit WHERE action = 'I'")
        if (source, new_id) in inserted_ids
    )
    for key in sorted(set(wanted) | set(seen)):
        if wanted[key] != seen[key]:
            problems.append(
                f"id {key[1]} of {key[0]}: {seen[key]} 'I' buffer rows, {wanted[key]} committed INSERT(s)"
            )
    assert not problems, f"{len(problems)} capture errors, first ones:\n" + "\n".join(problems[:15])
    return matched


def assert_history_clean(db: Database, allow_abandoned: bool = False) -> None:
    bad = db.sql(
        "SELECT s.pgt_name, h.status, h.error_message FROM pgtrickle.pgt_refresh_history h"
        " JOIN pgtrickle.pgt_stream_tables s USING (pgt_id)"
        " WHERE h.status NOT IN ('COMPLETED'" + (", 'ABANDONED'" if allow_abandoned else "") + ")"
    )
    assert bad == [], bad


def request_refresh(db: Database, names: list[str]) -> None:
    db.sql("SELECT pgtrickle.refresh_stream_table(n) FROM unnest(%s::text[]) n", (names,))


def capture_modes(db: Database) -> dict[str, str]:
    return dict(
        db.sql("SELECT source_name, cdc_mode FROM pgtrickle.pgt_change_sources WHERE source_kind = 'TABLE'")
    )


def set_setting(db: Database, name: str, value: str) -> None:
    db.sql("UPDATE pgtrickle.pgt_settings SET value = %s WHERE name = %s", (value, name))


class Signals:
    """What the main thread tells the writers, and what they tell it; waits without sleeping."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.refreshes = 0
        self.stopping = False
        self.cut_pending = False  # a tick about to move sources to WAL: do not hold locks open
        self.committed = 0
        self.committed_with_pk_change = 0

    def update(self, fn: Callable[[Signals], None]) -> None:
        with self.cond:
            fn(self)
            self.cond.notify_all()

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(predicate, timeout)


def _bump_refreshes(s: Signals) -> None:
    s.refreshes += 1


# ----------------------------------------------------------------------------- 1. stress

N_WRITERS = 4
PRELOAD = 150  # rows per writer and source
HOT_IDS = [1, 2, 3, 4]  # src rows every writer updates
STRESS_QUERIES = {
    "agg": "SELECT grp, count(*) AS n, sum(v) AS total FROM src GROUP BY grp",
    "filt": "SELECT id, v, note FROM src WHERE v % 3 = 0",
    "joined": "SELECT a.id, a.grp, a.v, b.w FROM src a JOIN src2 b ON b.id = a.id",
    "rollup": "SELECT count(*) AS groups, sum(n) AS n, sum(total) AS total FROM agg",  # over a stream table
}


def _base(w: int) -> int:
    return (w + 1) * 1_000_000


class StressWriter(threading.Thread):
    """Random transactions on its own rows of src and src2 (so it knows them), plus shared hot rows."""

    def __init__(self, w: int, dsn: str, signals: Signals) -> None:
        super().__init__(name=f"writer-{w}", daemon=True)
        self.w = w
        self.dsn = dsn
        self.signals = signals
        self.rng = random.Random(7919 * (w + 1))
        base = _base(w)
        self.present = {s: set(range(base + 900_000, base + 900_000 + PRELOAD)) for s in ("src", "src2")}
        self.next_insert = base
        self.next_moved = base + 500_000  # primary-key changes move rows here
        self.txns: list[Txn] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, application_name=f"stress-writer-{self.w}") as conn:
                n = 0
                while not self.signals.stopping:
                    self.one_txn(conn, long=(n % 12 == 2))
                    n += 1
                    # pace (about 30 transactions/s per writer) so that a small CI machine is not starved
                    self.signals.wait(lambda: self.signals.stopping, timeout=self.rng.uniform(0.01, 0.05))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def _ids(self, source: str, k: int) -> list[int]:
        pool = self.present[source]
        return sorted(self.rng.sample(sorted(pool), min(k, len(pool))))

    def statement(self, conn: psycopg.Connection, txn: Txn, hot_ok: bool) -> None:
        rng = self.rng
        source = "src" if rng.random() < 0.7 else "src2"
        op = rng.choices(["ins", "upd", "pk", "del", "hot"], [4, 3, 2, 2, 1 if hot_ok else 0])[0]
        if op == "ins":
            ids = list(range(self.next_insert, self.next_insert + rng.randint(1, 5)))
            self.next_insert += len(ids)
            vals = [rng.randint(0, 1000) for _ in ids]
            grps = [rng.randint(0, 9) for _ in ids]
            if source == "src":
                notes = [None if rng.random() < 0.2 else f"n{rng.randint(0, 99)}" for _ in ids]
                run_stmt(
                    conn,
                    txn,
                    source,
                    "ins",
                    "INSERT INTO src (id, grp, v, note) SELECT * FROM "
                    "unnest(%s::int[], %s::int[], %s::int[], %s::text[])",
                    (ids, grps, vals, notes),
                )
            else:
                run_stmt(
                    conn,
                    txn,
                    source,
                    "ins",
                    "INSERT INTO src2 (id, grp, w) SELECT * FROM unnest(%s::int[], %s::int[], %s::int[])",
                    (ids, grps, vals),
                )
            txn.inserted += [(source, i) for i in ids]
            self.present[source].update(ids)
            if source == "src" and rng.random() < 0.5:  # a partner row for the join
                run_stmt(
                    conn,
                    txn,
                    "src2",
                    "ins",
                    "INSERT INTO src2 (id, grp, w) SELECT i, 0, mod(i, 97) FROM unnest(%s::int[]) i",
                    (ids,),
                )
                txn.inserted += [("src2", i) for i in ids]
                self.present["src2"].update(ids)
        elif op == "upd":
            ids = self._ids(source, rng.randint(1, 3))
            col = "v" if source == "src" else "w"
            rows = run_stmt(
                conn,
                txn,
                source,
                "upd",
                f"UPDATE {source} SET {col} = {col} + %s, grp = mod(grp + 1, 10) WHERE id = ANY(%s)",
                (rng.randint(1, 5), ids),
            )
            assert rows == len(ids)
        elif op == "pk":
            [old] = self._ids(source, 1) or [None]
            if old is None:
                return
            new = self.next_moved
            self.next_moved += 1
            rows = run_stmt(conn, txn, source, "pk", f"UPDATE {source} SET id = %s WHERE id = %s", (new, old))
            assert rows == 1
            self.present[source].discard(old)
            self.present[source].add(new)
        elif op == "del":
            ids = self._ids(source, rng.randint(1, 2))
            rows = run_stmt(conn, txn, source, "del", f"DELETE FROM {source} WHERE id = ANY(%s)", (ids,))
            assert rows == len(ids)
            self.present[source].difference_update(ids)
        else:
            run_stmt(conn, txn, "src", "upd", "UPDATE src SET v = v + 1 WHERE id = ANY(%s)", (HOT_IDS,))

    def one_txn(self, conn: psycopg.Connection, long: bool) -> None:
        rng = self.rng
        saved = {s: set(ids) for s, ids in self.present.items()}
        txn = begin(conn)
        txn.long = long
        self.txns.append(txn)
        rollback = rng.random() < 0.12
        try:
            for _ in range(rng.randint(1, 4)):
                self.statement(conn, txn, hot_ok=not long)
            if long:
                # Stay open while refreshes run (unless a tick is about to cut over to WAL,
                # which waits for this transaction's lock), then write some more and commit.
                start = self.signals.refreshes
                self.signals.wait(
                    lambda: (
                        self.signals.refreshes >= start + 2
                        or self.signals.cut_pending
                        or self.signals.stopping
                    ),
                    timeout=60,
                )
                for _ in range(rng.randint(1, 3)):
                    self.statement(conn, txn, hot_ok=False)
                txn.refreshes_spanned = self.signals.refreshes - start
            if rollback:
                conn.rollback()
            else:
                conn.commit()
                txn.committed = True
        except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
            conn.rollback()
        if not txn.committed:
            self.present = saved
            return

        def count(s: Signals) -> None:
            s.committed += 1
            s.committed_with_pk_change += txn.has_pk_change

        self.signals.update(count)


def _stress_db(db: Database) -> None:
    db.sql("CREATE TABLE src (id int PRIMARY KEY, grp int NOT NULL, v int NOT NULL, note text)")
    db.sql("CREATE TABLE src2 (id int PRIMARY KEY, grp int NOT NULL, w int NOT NULL)")
    db.sql("INSERT INTO src SELECT i, mod(i, 10), i, 'hot' FROM unnest(%s::int[]) i", (HOT_IDS,))
    for w in range(N_WRITERS):
        first = _base(w) + 900_000
        db.sql(
            "INSERT INTO src SELECT g, mod(g, 10), mod(g, 1000), 'p' || mod(g, 7) "
            "FROM generate_series(%s, %s) g",
            (first, first + PRELOAD - 1),
        )
        db.sql(
            "INSERT INTO src2 SELECT g, mod(g, 10), mod(g, 500) FROM generate_series(%s, %s) g",
            (first, first + PRELOAD - 1),
        )
    for name, query in STRESS_QUERIES.items():
        db.sql("SELECT pgtrickle.create_stream_table(%s, %s, schedule => '1h')", (name, query))
    install_audit(db, "src", "src2")


@pytest.mark.parametrize("mode", ["trigger", "wal", "transition"])
def test_concurrent_writers_are_captured_exactly(db: Database, mode: str) -> None:
    """4 writers on two shared sources while 4 stream tables refresh; then capture and contents are exact.

    ``transition``: cdc_mode is ``auto`` and the writers are already running
    when the first tick populates the stream tables and then moves both
    sources from triggers to WAL.
    """
    set_setting(db, "cdc_mode", {"trigger": "trigger", "wal": "wal", "transition": "auto"}[mode])
    set_setting(db, "wal_transition_timeout", "30 seconds")
    _stress_db(db)
    names = list(STRESS_QUERIES)
    signals = Signals()

    def on_outcome(outcome) -> None:  # type: ignore[no-untyped-def]
        if outcome.action in (Action.FULL, Action.DIFFERENTIAL):
            signals.update(_bump_refreshes)

    scheduler = Scheduler(db.settings, db.dsn, on_outcome=on_outcome)
    writers = [StressWriter(w, db.dsn, signals) for w in range(N_WRITERS)]
    started = time.monotonic()
    ticks = 0
    pk_txns_at_cut = 0
    try:
        if mode == "transition":
            # no refresh runs before the first tick: long transactions must not wait for one
            signals.update(lambda s: setattr(s, "cut_pending", True))
            for writer in writers:
                writer.start()
            # enough trigger-captured transactions first (that change keys: their two forms differ)
            assert signals.wait(
                lambda: signals.committed_with_pk_change >= 10 or any(w.error for w in writers), 120
            ), "the writers made no progress"
        report = scheduler.tick()  # initial population, then (wal, transition) the move to WAL
        assert sorted(o.st.name for o in report.refreshed) == sorted(names) and not report.failed
        assert set(capture_modes(db).values()) == {"trigger" if mode == "trigger" else "wal"}, db.sql(
            "SELECT source_name, cdc_mode, cdc_reason FROM pgtrickle.pgt_change_sources"
        )
        pk_txns_at_cut = signals.committed_with_pk_change
        signals.update(lambda s: setattr(s, "cut_pending", False))
        if mode != "transition":
            for writer in writers:
                writer.start()

        deadline = time.monotonic() + STRESS_SECONDS
        while True:
            assert time.monotonic() - started < HARD_LIMIT_SECONDS, "the stress loop did not finish"
            assert all(w.is_alive() for w in writers), [repr(w.error) for w in writers if w.error]
            request_refresh(db, names)
            report = scheduler.tick()
            assert not report.failed, report.failed
            assert sorted(o.st.name for o in report.refreshed) == sorted(names)
            ticks += 1
            if ticks % 3 == 0:
                scheduler._maintenance(force=True)  # buffer cleanup while the writers run
            if (
                time.monotonic() >= deadline
                and ticks >= 3
                and signals.committed_with_pk_change >= pk_txns_at_cut + 10
            ):
                break

        signals.update(lambda s: setattr(s, "stopping", True))
        for writer in writers:
            writer.join(timeout=90)
            assert not writer.is_alive(), f"{writer.name} did not stop"
            assert writer.error is None, repr(writer.error)

        wait_for_decoder(db.conn, db.dsn)
        request_refresh(db, names)
        report = scheduler.tick()
        assert not report.failed, report.failed
        assert_oracle(db, *names)
    finally:
        signals.update(lambda s: setattr(s, "stopping", True))
        for writer in writers:
            if writer.is_alive():
                writer.join(timeout=90)
        scheduler.close()

    assert_history_clean(db)
    txns = [t for w in writers for t in w.txns]
    committed = [t for t in txns if t.committed]
    assert 20 <= len(committed) < len(txns), "some transactions must commit, some roll back"
    assert any(t.long and t.committed and t.refreshes_spanned >= 2 for t in txns), (
        "no long transaction stayed open across two refreshes"
    )
    forms = {"trigger": {"trigger"}, "wal": {"wal"}, "transition": {"trigger", "wal"}}[mode]
    matched = check_capture(db, txns, forms)
    if mode == "transition":
        assert matched["trigger"] and matched["wal"], f"the cut did not happen while writing: {matched}"
    print(
        f"\n[{mode}] {len(txns)} transactions ({len(committed)} committed), {ticks} ticks, "
        f"{signals.refreshes} full refreshes, forms {dict(matched)}, "
        f"{time.monotonic() - started:.1f}s"
    )


# ----------------------------------------------------------------------------- 2. SIGKILL

KILLS = 3


class Daemon:
    """``pgtrickle run`` in its own process group (with its Spark JVM), output to a log file."""

    def __init__(self, db: Database, tmp_path: Path) -> None:
        self.env = dict(
            os.environ,
            PGTRICKLE_DSN=db.dsn,
            PGTRICKLE_DATA_DIR=str(tmp_path / "data"),
            PGTRICKLE_SPARK_MASTER="local[1]",
            PGTRICKLE_TICK_SECONDS="0.5",
        )
        self.tmp_path = tmp_path
        self.runs = 0
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.runs += 1
        self.log_path = self.tmp_path / f"daemon-{self.runs}.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pgtrickle", "run"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log_path.read_text()[-5000:]

    def check_alive(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, f"the daemon exited:\n{self.output()}"

    def kill(self) -> None:
        """SIGKILL the daemon and its Spark JVM: the process group it leads (not yet reaped, so ours)."""
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=60)


def poll(
    condition: Callable[[], bool],
    what: str,
    timeout: float,
    check: Callable[[], None] = lambda: None,
    interval: float = 0.05,
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        check()
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(interval)


class InsertingWriter(threading.Thread):
    """One writer: mostly INSERTs of known ids, some UPDATEs (also of the key), DELETEs, rollbacks."""

    def __init__(self, dsn: str, seed: int) -> None:
        super().__init__(name="inserting-writer", daemon=True)
        self.dsn = dsn
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.present: set[int] = set(range(1, 101))
        self.next_id = 1_000
        self.next_moved = 5_000_000
        self.txns: list[Txn] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = self.rng
        try:
            with psycopg.connect(self.dsn, application_name="inserting-writer") as conn:
                while not self.stop.is_set():
                    saved = set(self.present)
                    txn = begin(conn)
                    self.txns.append(txn)
                    ids = list(range(self.next_id, self.next_id + rng.randint(1, 8)))
                    self.next_id += len(ids)
                    run_stmt(
                        conn,
                        txn,
                        "src",
                        "ins",
                        "INSERT INTO src (id, grp, v) "
                        "SELECT i, mod(i, 7), mod(i, 100) FROM unnest(%s::int[]) i",
                        (ids,),
                    )
                    txn.inserted += [("src", i) for i in ids]
                    self.present.update(ids)
                    r = rng.random()
                    if r < 0.3:
                        some = sorted(rng.sample(sorted(self.present), 3))
                        run_stmt(
                            conn, txn, "src", "upd", "UPDATE src SET v = v + 1 WHERE id = ANY(%s)", (some,)
                        )
                    elif r < 0.4:
                        [old] = rng.sample(sorted(self.present), 1)
                        run_stmt(
                            conn,
                            txn,
                            "src",
                            "pk",
                            "UPDATE src SET id = %s WHERE id = %s",
                            (self.next_moved, old),
                        )
                        self.present.discard(old)
                        self.present.add(self.next_moved)
                        self.next_moved += 1
                    elif r < 0.5:
                        gone = sorted(rng.sample(sorted(self.present), 2))
                        run_stmt(conn, txn, "src", "del", "DELETE FROM src WHERE id = ANY(%s)", (gone,))
                        self.present.difference_update(gone)
                    if rng.random() < 0.1:
                        conn.rollback()
                        self.present = saved
                    else:
                        conn.commit()
                        txn.committed = True
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def test_sigkill_while_the_decoder_streams_loses_and_duplicates_nothing(db: Database, tmp_path: Path) -> None:
    """The daemon is SIGKILLed (with its Spark JVM) at random moments while its decoder streams.

    The stream tables are populated and ``src`` moved to WAL in this process
    (its Spark is already up); then a writer runs while ``pgtrickle run`` is
    killed and restarted. ``ids`` is due every second, so each restarted
    daemon also starts a refresh at once, next to its starting decoder.
    """
    set_setting(db, "cdc_mode", "wal")
    set_setting(db, "wal_transition_timeout", "30 seconds")
    db.sql("CREATE TABLE src (id int PRIMARY KEY, grp int NOT NULL, v int NOT NULL)")
    db.sql("INSERT INTO src SELECT g, g % 7, g FROM generate_series(1, 100) g")
    db.sql("SELECT pgtrickle.create_stream_table('ids', 'SELECT id FROM src', schedule => '1s')")
    db.sql(
        "SELECT pgtrickle.create_stream_table('per_grp', 'SELECT grp, count(*) AS n, sum(v) AS v "
        "FROM src GROUP BY grp', schedule => '1h')"
    )
    db.sql(
        "SELECT pgtrickle.create_stream_table('total', 'SELECT sum(n) AS n, sum(v) AS v FROM per_grp', "
        "schedule => '1h')"
    )
    install_audit(db, "src")
    names = ["ids", "per_grp", "total"]
    scheduler = Scheduler(db.settings, db.dsn)
    try:
        report = scheduler.tick()  # initial population, then the move to WAL
    finally:
        scheduler.close()
    assert len(report.refreshed) == 3 and not report.failed
    assert capture_modes(db) == {"src": "wal"}

    kills = max(KILLS, round(STRESS_SECONDS / 2))
    rng = random.Random(20240607)
    daemon = Daemon(db, tmp_path)
    writer = InsertingWriter(db.dsn, seed=4242)
    started = time.monotonic()

    def changes_total() -> int:
        return int(db.scalar("SELECT coalesce(max(changes_total), 0) FROM pgtrickle.pgt_decoder_state") or 0)

    try:
        writer.start()
        for run in range(kills + 1):
            before = changes_total()
            daemon.start()
            poll(
                lambda: changes_total() > before + 20,
                f"daemon run {daemon.runs} to stream",
                120,
                daemon.check_alive,
            )
            if run == kills:
                break
            time.sleep(rng.uniform(0.0, 1.5))  # a random moment while it streams
            daemon.check_alive()
            daemon.kill()
            assert writer.is_alive(), repr(writer.error)
        writer.stop.set()
        writer.join(timeout=60)
        assert writer.error is None, repr(writer.error)
        # the last daemon catches up: its decoder passes a sync message emitted after the last write
        target = db.scalar("SELECT pg_logical_emit_message(false, %s, '')", (SYNC_PREFIX,))
        poll(
            lambda: bool(
                db.scalar("SELECT flushed_lsn >= %s::pg_lsn FROM pgtrickle.pgt_decoder_state", (str(target),))
            ),
            "the decoder to catch up",
            120,
            daemon.check_alive,
        )
        daemon.check_alive()
    finally:
        writer.stop.set()
        if daemon.proc is not None:
            daemon.kill()  # for good
        writer.join(timeout=60)

    # Nothing left to decode and no decoder attached now. A killed daemon's walsender can hold the slot
    # until PostgreSQL's wal_sender_timeout (60 s by default) notices its client is gone: wait past it.
    wait_for_decoder(db.conn, db.dsn, timeout=150)
    check_capture(db, writer.txns, {"wal"})
    scheduler = Scheduler(db.settings, db.dsn)
    try:
        scheduler.abandon_stale_history()  # what the next daemon start does
        request_refresh(db, names)
        report = scheduler.tick()
    finally:
        scheduler.close()
    assert sorted(o.st.name for o in report.refreshed) == sorted(names) and not report.failed
    assert_oracle(db, *names)
    assert db.scalar("SELECT count(*) FROM (SELECT id FROM ids GROUP BY id HAVING count(*) > 1) d") == 0
    assert_history_clean(db, allow_abandoned=True)
    committed = [t for t in writer.txns if t.committed]
    assert committed and len(committed) < len(writer.txns)
    print(
        f"\n{len(writer.txns)} transactions ({len(committed)} committed), {daemon.runs} daemon runs, "
        f"{changes_total()} changes decoded, {time.monotonic() - started:.1f}s"
    )


def test_a_restarted_scheduler_does_not_trip_over_its_own_starting_decoder(db: Database) -> None:
    """A daemon (re)start with a refresh due at once: the refresh must wait for the decoder, not crash.

    ``tick()`` starts the decoder thread, then the refresh's
    ``wait_for_decoder`` finds the slot not yet active and starts decoding
    itself: whichever of the two attaches second gets "replication slot ...
    is active". Each attempt loses that race often; five in a row all winning
    it is unlikely, so with the race present this test fails on
    ``psycopg2.errors.ObjectInUse``.
    """
    set_setting(db, "cdc_mode", "wal")
    set_setting(db, "wal_transition_timeout", "30 seconds")
    db.sql("CREATE TABLE src (id int PRIMARY KEY, v int NOT NULL)")
    db.sql("INSERT INTO src SELECT g, g FROM generate_series(1, 10) g")
    db.sql("SELECT pgtrickle.create_stream_table('ids', 'SELECT id, v FROM src', schedule => '1h')")
    scheduler = Scheduler(db.settings, db.dsn)
    try:
        scheduler.tick()
    finally:
        scheduler.close()
    assert capture_modes(db) == {"src": "wal"}
    for attempt in range(5):
        db.sql("INSERT INTO src VALUES (%s, %s)", (100 + attempt, attempt))
        db.sql("SELECT pgtrickle.refresh_stream_table('ids')")
        scheduler = Scheduler(db.settings, db.dsn)  # a fresh daemon process would do the same
        try:
            report = scheduler.tick()
        finally:
            scheduler.close()
        assert [o.action for o in report.refreshed] in (
            [Action.FULL],
            [Action.DIFFERENTIAL],
        ) and not report.failed, report.failed
        assert_oracle(db, "ids")


def test_a_commit_decoded_before_its_backend_leaves_the_proc_array_keeps_its_xid(db: Database) -> None:
    """The decoder can see a commit record before the committing backend has left the proc array.

    Between flushing its commit record and leaving the proc array a backend
    can be delayed (descheduled on a busy machine; here, deterministically,
    by waiting for a synchronous standby that never comes — logical decoding
    does not wait for it). If an older transaction is still running, the
    snapshot the decoder takes then has ``xmax`` below the decoded xid; the
    buffer row must still carry the transaction's own xid8, or no refresh
    ever sees the change.
    """
    set_setting(db, "cdc_mode", "wal")
    set_setting(db, "wal_transition_timeout", "30 seconds")
    db.sql("CREATE TABLE src (id int PRIMARY KEY, v int NOT NULL)")
    db.sql("INSERT INTO src VALUES (1, 1)")
    db.sql("SELECT pgtrickle.create_stream_table('ids', 'SELECT id, v FROM src', schedule => '1h')")
    scheduler = Scheduler(db.settings, db.dsn)
    try:
        scheduler.tick()
    finally:
        scheduler.close()
    assert capture_modes(db) == {"src": "wal"}
    install_audit(db, "src")
    wait_for_decoder(db.conn, db.dsn)  # the slot is caught up: the next commit is the first decoded
    slot = str(db.scalar("SELECT slot_name FROM pgtrickle.pgt_decoder_state"))

    def waiting_for_standby(app: str) -> bool:
        return (
            db.scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                "AND wait_event = 'SyncRep'",
                (app,),
            )
            == 1
        )

    def synchronous_standby(name: str) -> None:
        if name:
            db.sql(f"ALTER SYSTEM SET synchronous_standby_names = '{name}'")
        else:
            db.sql("ALTER SYSTEM RESET synchronous_standby_names")
        db.sql("SELECT pg_reload_conf()")
        poll(
            lambda: db.scalar("SELECT current_setting('synchronous_standby_names')") == name,
            "the configuration reload",
            30,
        )

    older = psycopg.connect(db.dsn, application_name="older-txn")
    writer = psycopg.connect(db.dsn, application_name="delayed-commit")
    decoder = WalDecoder(db.dsn, slot)
    stop = threading.Event()
    decoding = threading.Thread(target=lambda: decoder.run(stop), name="decoder", daemon=True)
    committing = threading.Thread(target=writer.commit, name="commit", daemon=True)
    try:
        synchronous_standby("pgtrickle_test_nobody")  # commits wait for a standby that never comes
        older.execute("SELECT pg_current_xact_id()")  # an older transaction, still running
        txn = begin(writer)
        writer.execute("INSERT INTO src VALUES (2, 2)")
        committing.start()
        poll(lambda: waiting_for_standby("delayed-commit"), "the commit to wait for the standby", 30)
        decoding.start()
        # the decoder has written the transaction (its own commit now waits for the standby too)
        poll(lambda: waiting_for_standby("pgtrickle-wal-decoder"), "the decoder to write the change", 30)
    finally:
        synchronous_standby("")
        if committing.is_alive():
            committing.join(timeout=30)
        older.rollback()
        stop.set()
        if decoding.is_alive():
            decoding.join(timeout=30)
        older.close()
        writer.close()
    assert decoder.error is None, repr(decoder.error)
    buffered = [int(x) for (x,) in db.sql("SELECT xid::text FROM public.cdc_audit WHERE new_id = 2")]
    [outcome] = refresh(db, "ids")
    contents = db.sql("SELECT id, v FROM ids ORDER BY id")
    assert buffered == [txn.xid] and outcome.action is Action.FULL and contents == [(1, 1), (2, 2)], (
        f"the INSERT of xid {txn.xid} is in the buffer with xid {buffered} "
        f"(mod 2^64: {[x - 2**64 for x in buffered]}); the refresh did {outcome.action.value} "
        f"({outcome.reason}) and ids holds {contents}"
    )


# ----------------------------------------------------------------------------- 3. TRUNCATE

TRUNCATE_QUERIES = {
    "agg": "SELECT grp, count(*) AS n, sum(v) AS total FROM src GROUP BY grp",
    "joined": "SELECT a.id, a.v, b.w FROM src a JOIN src2 b ON b.id = a.id",
    "only2": "SELECT count(*) AS n, sum(w) AS w FROM src2",
    "rollup": "SELECT count(*) AS groups, sum(n) AS n FROM agg",  # over a stream table
}
DEPENDS = {"agg": {"src"}, "joined": {"src", "src2"}, "only2": {"src2"}, "rollup": {"agg"}}


class PausableWriter(threading.Thread):
    """Writes src and src2 until stopped; pauses between transactions when asked."""

    def __init__(self, dsn: str, seed: int) -> None:
        super().__init__(name="pausable-writer", daemon=True)
        self.dsn = dsn
        self.rng = random.Random(seed)
        self.cond = threading.Condition()
        self.pause_requested = False
        self.paused = False
        self.stop = False
        self.committed = 0
        self.next_id = 10_000
        self.next_moved = 5_000_000
        self.txns: list[Txn] = []
        self.error: BaseException | None = None

    def _set(self, **values: object) -> None:
        with self.cond:
            for k, v in values.items():
                setattr(self, k, v)
            self.cond.notify_all()

    def pause(self) -> None:
        self._set(pause_requested=True)
        with self.cond:
            assert self.cond.wait_for(lambda: self.paused or self.error is not None, 60), (
                "the writer did not pause"
            )
        assert self.error is None, repr(self.error)

    def resume(self) -> None:
        self._set(pause_requested=False)

    def wait_committed(self, more: int) -> None:
        with self.cond:
            target = self.committed + more
            assert self.cond.wait_for(lambda: self.committed >= target or self.error is not None, 60)
        assert self.error is None, repr(self.error)

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, application_name="pausable-writer") as conn:
                while True:
                    with self.cond:
                        self.paused = self.pause_requested
                        self.cond.notify_all()
                        self.cond.wait_for(lambda: not self.pause_requested or self.stop)
                        self.paused = False
                        if self.stop:
                            return
                    self.one_txn(conn)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self._set(error=exc)

    def one_txn(self, conn: psycopg.Connection) -> None:
        rng = self.rng
        txn = begin(conn)
        self.txns.append(txn)
        try:
            for _ in range(rng.randint(1, 3)):
                source = rng.choice(["src", "src2"])
                col = "v" if source == "src" else "w"
                op = rng.choices(["ins", "upd", "pk", "del"], [5, 2, 1, 1])[0]
                if op == "ins":
                    ids = list(range(self.next_id, self.next_id + rng.randint(1, 6)))
                    self.next_id += len(ids)
                    run_stmt(
                        conn,
                        txn,
                        source,
                        "ins",
                        f"INSERT INTO {source} (id, grp, {col}) "
                        "SELECT i, mod(i, 5), mod(i, 77) FROM unnest(%s::int[]) i",
                        (ids,),
                    )
                    txn.inserted += [(source, i) for i in ids]
                elif op == "upd":
                    run_stmt(
                        conn,
                        txn,
                        source,
                        "upd",
                        f"UPDATE {source} SET {col} = {col} + 1 WHERE id IN "
                        f"(SELECT id FROM {source} ORDER BY id DESC LIMIT 3)",
                    )
                elif op == "pk":
                    run_stmt(
                        conn,
                        txn,
                        source,
                        "pk",
                        f"UPDATE {source} SET id = %s WHERE id = (SELECT min(id) FROM {source})",
                        (self.next_moved,),
                    )
                    self.next_moved += 1
                else:
                    run_stmt(
                        conn,
                        txn,
                        source,
                        "del",
                        f"DELETE FROM {source} WHERE id IN (SELECT id FROM {source} ORDER BY id LIMIT 2)",
                    )
            if rng.random() < 0.1:
                conn.rollback()
            else:
                conn.commit()
                txn.committed = True
        except psycopg.errors.DeadlockDetected:  # against the main thread's TRUNCATE of both tables
            conn.rollback()
        with self.cond:
            self.committed += txn.committed
            self.cond.notify_all()


@pytest.mark.parametrize("mode", ["trigger", "wal"])
def test_truncate_while_writing_is_seen_by_every_dependent(db: Database, mode: str) -> None:
    set_setting(db, "cdc_mode", mode)
    set_setting(db, "wal_transition_timeout", "30 seconds")
    db.sql("CREATE TABLE src (id int PRIMARY KEY, grp int NOT NULL, v int NOT NULL)")
    db.sql("CREATE TABLE src2 (id int PRIMARY KEY, grp int NOT NULL, w int NOT NULL)")
    db.sql("INSERT INTO src SELECT g, g % 5, g FROM generate_series(1, 300) g")
    db.sql("INSERT INTO src2 SELECT g, g % 5, g FROM generate_series(1, 300, 2) g")
    for name, query in TRUNCATE_QUERIES.items():
        db.sql("SELECT pgtrickle.create_stream_table(%s, %s, schedule => '1h')", (name, query))
    install_audit(db, "src", "src2")
    names = list(TRUNCATE_QUERIES)
    main_txns: list[Txn] = []
    scheduler = Scheduler(db.settings, db.dsn)
    writer = PausableWriter(db.dsn, seed=99)
    started = time.monotonic()
    main = psycopg.connect(db.dsn, application_name="truncating-main")
    holder = psycopg.connect(db.dsn, application_name="lock-holder")

    def truncate(*tables: str, commit: bool = True, inserts_around: bool = False) -> None:
        """TRUNCATE ``tables`` in one statement (retried after a deadlock with the writer)."""
        while True:
            txn = begin(main)
            try:
                if inserts_around:
                    run_stmt(main, txn, "src", "ins", "INSERT INTO src VALUES (-1, 0, 1), (-2, 0, 2)")
                    txn.inserted += [("src", -1), ("src", -2)]
                for t in tables:  # one statement truncates all: one 'T' per table
                    txn.stmts.append((t, "trunc", 0))
                main.execute(f"TRUNCATE {', '.join(tables)}")
                if inserts_around:
                    run_stmt(main, txn, "src", "ins", "INSERT INTO src VALUES (-3, 0, 3)")
                    txn.inserted += [("src", -3)]
                if commit:
                    main.commit()
                    txn.committed = True
                else:
                    main.rollback()
                main_txns.append(txn)
                return
            except psycopg.errors.DeadlockDetected:
                main.rollback()
                main_txns.append(txn)

    def refresh_all_and_check(truncated: set[str] | None = None) -> dict[str, tuple[Action, str]]:
        """With the writer paused: every stream table refreshes and equals its query."""
        request_refresh(db, names)
        report = scheduler.tick()
        assert not report.failed, report.failed
        outcomes = {o.st.name: (o.action, o.reason) for o in report.refreshed}
        assert sorted(outcomes) == sorted(names)
        assert_oracle(db, *names)
        if truncated is not None:
            for name, deps in DEPENDS.items():
                if deps & truncated:
                    action, reason = outcomes[name]
                    assert action is Action.FULL and "was" in reason, (name, action, reason)
        return outcomes

    try:
        report = scheduler.tick()
        assert sorted(o.st.name for o in report.refreshed) == sorted(names) and not report.failed
        assert set(capture_modes(db).values()) == {mode}
        writer.start()
        rounds = max(1, round(STRESS_SECONDS / 6))
        for _ in range(rounds):
            # 1. TRUNCATE src while the writer writes both tables, more writes after it; the TRUNCATE
            #    queues behind an open transaction that wrote src, and the writer's next statements on
            #    src queue behind the TRUNCATE
            writer.wait_committed(15)
            holder_txn = begin(holder)
            run_stmt(holder, holder_txn, "src", "ins", "INSERT INTO src VALUES (-10, 0, 10), (-11, 1, 11)")
            holder_txn.inserted += [("src", -10), ("src", -11)]
            truncating = threading.Thread(target=truncate, args=("src",), name="truncate")
            truncating.start()
            poll(
                lambda: (
                    db.scalar(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                        "'truncating-main' AND wait_event_type = 'Lock'"
                    )
                    == 1
                ),
                "the TRUNCATE to wait for the open transaction",
                30,
            )
            holder.commit()
            holder_txn.committed = True
            main_txns.append(holder_txn)
            truncating.join(timeout=60)
            assert not truncating.is_alive()
            writer.wait_committed(5)
            writer.pause()
            refresh_all_and_check()
            writer.resume()

            # 2. TRUNCATE of both tables in one statement, and inserts around a TRUNCATE in one transaction
            writer.wait_committed(15)
            truncate("src2", "src")
            writer.wait_committed(5)
            truncate("src", inserts_around=True)
            writer.pause()
            refresh_all_and_check()

            # 3. the TRUNCATE is the only change: it alone must make the dependents refresh
            truncate("src2")
            outcomes = refresh_all_and_check({"src2"})
            assert outcomes["agg"][0] is Action.NO_DATA and outcomes["rollup"][0] is Action.NO_DATA, outcomes
            assert "src2 was truncated" in outcomes["only2"][1]
            assert "agg was refreshed in full" not in outcomes["rollup"][1]
            truncate("src")
            outcomes = refresh_all_and_check({"src", "agg"})
            assert outcomes["only2"][0] is Action.NO_DATA, outcomes
            assert "agg was refreshed in full" in outcomes["rollup"][1], outcomes

            # 4. a rolled-back TRUNCATE leaves nothing to do
            truncate("src", "src2", commit=False)
            outcomes = refresh_all_and_check()
            assert {a for a, _ in outcomes.values()} == {Action.NO_DATA}, outcomes
            writer.resume()

        writer.wait_committed(10)
        writer.pause()
        wait_for_decoder(db.conn, db.dsn)
        refresh_all_and_check()
    finally:
        writer._set(stop=True, pause_requested=False)
        writer.join(timeout=60)
        main.close()
        holder.close()
        scheduler.close()

    assert writer.error is None, repr(writer.error)
    assert_history_clean(db)
    check_capture(db, writer.txns + main_txns, {mode})
    print(
        f"\n[{mode}] {len(writer.txns)} writer transactions, {len(main_txns)} truncating ones, "
        f"{time.monotonic() - started:.1f}s"
    )
