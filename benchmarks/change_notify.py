"""What the capture triggers' ``NOTIFY pgtrickle_changes`` costs a writer.

The capture function of a trigger-captured source ends with ``pg_notify('pgtrickle_changes',
'<relid>')`` (the daemon's wake-on-change, docs/OPERATIONS.md). PostgreSQL keeps one notification per
channel and payload per transaction, so a transaction pays for it once per source however many
statements it runs; the cost is worst for many small transactions. This probe times ``--transactions``
single-row ``INSERT`` transactions (autocommit, so each includes its commit) into one captured source,
with the capture function as installed (at most one NOTIFY per 100 ms per session and source), with a
NOTIFY on every statement, and without any, rotating in ``--rounds`` rounds (drift on a shared machine spreads over both), while a listener
connection ``LISTEN``s and drains the channel as the daemon does. A second case runs ``--statements``
single-row INSERTs per transaction (one notification each).

    .venv/bin/python benchmarks/change_notify.py [--transactions 2000] [--rounds 5] [--writers 1]
        [--async-commit] [--dsn ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402

from common import bench_dsn, drop_database, machine, recreate_database, scalar  # noqa: E402
from pgtrickle.catalog.install import install  # noqa: E402
from pgtrickle.config import Settings  # noqa: E402
from pgtrickle.db.connection import resolve_dsn  # noqa: E402

THROTTLE_START = "IF coalesce(current_setting('pgtrickle.notified_"


def capture_source(conn: psycopg.Connection, relid: int) -> str:
    return str(
        scalar(conn, "SELECT pg_get_functiondef(%s::regproc)", (f"pgtrickle_changes.capture_{relid}",))
    )


def variants(definition: str) -> dict[str, str]:
    """The capture function as installed (throttled NOTIFY), with a NOTIFY on every statement, without."""
    lines = definition.splitlines()
    start = next(i for i, line in enumerate(lines) if THROTTLE_START in line)
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "END IF;")
    notify = next(line for line in lines[start:end] if "pg_notify(" in line)
    return {
        "no NOTIFY": "\n".join(lines[:start] + lines[end + 1 :]),
        "NOTIFY every statement": "\n".join(lines[:start] + [notify] + lines[end + 1 :]),
        "throttled NOTIFY (installed)": definition,
    }


def timed(dsn: str, start: int, count: int, per_txn: int, writers: int, async_commit: bool) -> float:
    """Seconds per transaction: ``count`` transactions of ``per_txn`` INSERTs, by ``writers`` sessions at once."""
    conns = [psycopg.connect(dsn, autocommit=True) for _ in range(writers)]
    try:
        for conn in conns:
            if async_commit:
                conn.execute("SET synchronous_commit = off")
        share = count // writers

        def write(k: int) -> None:
            conn = conns[k]
            first = start + k * share
            for i in range(first, first + share):
                if per_txn == 1:
                    conn.execute("INSERT INTO src VALUES (%s, 1)", (i,))
                else:
                    with conn.transaction():
                        for j in range(per_txn):
                            conn.execute("INSERT INTO src VALUES (%s, 1)", (i * per_txn + j,))

        threads = [threading.Thread(target=write, args=(k,)) for k in range(writers)]
        began = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return (time.perf_counter() - began) / (share * writers)
    finally:
        for conn in conns:
            conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--transactions", type=int, default=2000)
    parser.add_argument("--statements", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dsn")
    parser.add_argument("--writers", type=int, default=1, help="sessions writing at once")
    parser.add_argument(
        "--async-commit",
        action="store_true",
        help="synchronous_commit off for the writer: no WAL flush wait, the NOTIFY's share shows",
    )
    args = parser.parse_args(argv)
    admin = resolve_dsn(Settings.from_env().with_overrides(dsn=args.dsn))
    db = f"pgtrickle_bench_notify_{os.getpid()}"
    recreate_database(admin, db)
    dsn = bench_dsn(admin, db)
    stop = threading.Event()
    received = [0]

    def listen() -> None:
        with psycopg.connect(dsn, autocommit=True) as listener:
            listener.execute("LISTEN pgtrickle_changes")
            while not stop.is_set():
                received[0] += sum(1 for _ in listener.notifies(timeout=0.2))

    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            host = machine(conn)
            install(conn)
            conn.execute("CREATE TABLE src (id bigint PRIMARY KEY, v int)")
            conn.execute(
                "SELECT pgtrickle.create_stream_table('st', 'SELECT id, v FROM src', initialize => false)"
            )
            relid = int(scalar(conn, "SELECT 'src'::regclass::oid"))
            installed = capture_source(conn, relid)
            functions = variants(installed)
            buffers = (
                "SELECT string_agg(c.oid::regclass::text, ', ') FROM pg_class c JOIN pg_namespace n"
                " ON n.oid = c.relnamespace WHERE n.nspname = 'pgtrickle_changes' AND c.relkind = 'r'"
            )
            thread = threading.Thread(target=listen, daemon=True)
            thread.start()
            results: dict[tuple[str, int], list[float]] = {}
            next_id = 1
            for round_ in range(args.rounds):
                for per_txn in (1, args.statements):
                    count = args.transactions if per_txn == 1 else max(1, args.transactions // per_txn)
                    order = list(functions.items())
                    order = order[round_ % len(order) :] + order[: round_ % len(order)]
                    for name, definition in order:
                        conn.execute(definition)
                        conn.execute(f"TRUNCATE {scalar(conn, buffers)}")
                        conn.execute("CHECKPOINT")
                        results.setdefault((name, per_txn), []).append(
                            timed(dsn, next_id, count, per_txn, args.writers, args.async_commit)
                        )
                        next_id += count + 1
            conn.execute(installed)
            stop.set()
            thread.join()
    finally:
        drop_database(admin, db)
    print(
        f"machine: {host.get('cpus')} CPUs, load {host.get('load_average')}; {args.rounds} rounds; "
        f"synchronous_commit {'off' if args.async_commit else 'on'}; {args.writers} writer(s); "
        f"{received[0]} notifications received by the listener"
    )
    for per_txn in (1, args.statements):
        base = statistics.median(results[("no NOTIFY", per_txn)])
        for name in functions:
            value = statistics.median(results[(name, per_txn)])
            print(
                f"{per_txn:>3} INSERT(s) per transaction, {name}: {value * 1e6:.0f} µs/txn "
                f"({(value - base) * 1e6:+.0f} µs, {value / base - 1:+.1%})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
