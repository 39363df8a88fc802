"""Cached benchmark datasets: built once in a named database, copied for every run.

``events`` (N rows) and ``dims`` (1000 rows), the tables of
``benchmarks/differential.py``, live in ``pgtrickle_bench_events_<N>``. The
load is generated in PostgreSQL with ``generate_series`` in chunks, each
committed with its progress, so an interrupted 100M-row load resumes where it
stopped; the primary key is built once at the end, then ``VACUUM ANALYZE``,
then the dataset is marked complete. A benchmark run never touches the cached
database: it works in a file copy (``CREATE DATABASE … TEMPLATE … STRATEGY
FILE_COPY``), which for 100M rows takes a minute or two instead of the
~20 minutes of a fresh load.

    .venv/bin/python benchmarks/datasets.py events 100000000   # build (or finish) the 100M dataset
    .venv/bin/python benchmarks/datasets.py list                # cached datasets and their sizes
    .venv/bin/python benchmarks/datasets.py drop 100000000      # remove one
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402

from common import bench_dsn, database_exists, drop_database, fmt_size, recreate_database, scalar  # noqa: E402

EVENT_VALUES = (
    "mod({id}, 1000), 1 + floor(random() * 1000)::int, round((random() * 1000)::numeric, 2),"
    " CASE WHEN random() < 0.05 THEN NULL ELSE floor(random() * 13)::int END, 'note ' || {id}"
)
"""grp, dim_id, v, qty, note of the event with id ``{id}`` (one SQL expression list)."""

CHUNK_ROWS = 5_000_000
EVENTS_BYTES_PER_ROW = 130
"""events heap + primary key per row: measured 87 bytes (1M rows: 94 MB database); 130 leaves room for
WAL and free space while loading."""
LOAD_ROWS_PER_SECOND = 105_000
"""Load speed for estimates (heap insert + PK build + VACUUM): measured 10M rows in 94 s on the 2-core
machine at load average 9 (inserts alone 143k rows/s); 1M in 7 s. 100M: ~16 min, once."""


def events_db(rows: int) -> str:
    return f"pgtrickle_bench_events_{rows}"


def _state(conn: psycopg.Connection) -> tuple[int, bool]:
    """(rows loaded so far, complete?) of the dataset in ``conn``'s database."""
    if scalar(conn, "SELECT to_regclass('public.bench_dataset')") is None:
        return 0, False
    loaded = int(scalar(conn, "SELECT value FROM bench_dataset WHERE key = 'loaded_through'") or 0)
    done = scalar(conn, "SELECT value FROM bench_dataset WHERE key = 'complete'") == "true"
    return loaded, done


def ensure_events(admin_dsn: str, rows: int, chunk: int = CHUNK_ROWS) -> tuple[str, float]:
    """The cached database holding ``events`` with ``rows`` rows; builds or finishes it. Returns (name, seconds)."""
    db = events_db(rows)
    started = time.monotonic()
    if not database_exists(admin_dsn, db):
        recreate_database(admin_dsn, db)
    with psycopg.connect(bench_dsn(admin_dsn, db), autocommit=True) as conn:
        loaded, done = _state(conn)
        if done:
            return db, 0.0
        if loaded == 0:
            print(
                f"  building the cached dataset {db} ({rows:,} rows of events) in chunks of {chunk:,}…",
                flush=True,
            )
            conn.execute("DROP TABLE IF EXISTS bench_dataset, events, dims")
            conn.execute("CREATE TABLE bench_dataset (key text PRIMARY KEY, value text)")
            conn.execute(
                "INSERT INTO bench_dataset VALUES ('rows', %s), ('loaded_through', '0'),"
                " ('complete', 'false')",
                (str(rows),),
            )
            conn.execute("SELECT setseed(0.42)")
            conn.execute("CREATE TABLE dims (id int PRIMARY KEY, name text, category int)")
            conn.execute("INSERT INTO dims SELECT g, 'dim ' || g, g % 20 FROM generate_series(1, 1000) g")
            # No primary key while loading (built once at the end: much faster than index maintenance).
            conn.execute(
                "CREATE TABLE events (id bigint NOT NULL, grp int, dim_id int, v numeric(12,2),"
                " qty int, note text) WITH (autovacuum_enabled = off)"
            )
        else:
            print(f"  resuming the cached dataset {db} at {loaded:,} of {rows:,} rows…", flush=True)
            # A chunk is committed together with its progress row, so nothing past `loaded` exists.
        load_started = time.monotonic()
        first = loaded
        while loaded < rows:
            upto = min(rows, loaded + chunk)
            with conn.transaction():
                conn.execute("SELECT setseed(%s)", ((loaded // chunk % 1000) / 1000.0,))
                conn.execute(
                    f"INSERT INTO events SELECT g, {EVENT_VALUES.format(id='g')}"
                    " FROM generate_series(%s::bigint, %s::bigint) g",
                    (loaded + 1, upto),
                )
                conn.execute("UPDATE bench_dataset SET value = %s WHERE key = 'loaded_through'", (str(upto),))
            loaded = upto
            spent = time.monotonic() - load_started
            speed = (loaded - first) / spent if spent > 0 else 0.0
            eta = (rows - loaded) / speed if speed > 0 else 0.0
            print(
                f"    {loaded:,} / {rows:,} rows ({100 * loaded / rows:.0f} %), {speed:,.0f} rows/s, "
                f"~{eta / 60:.1f} min of inserts left",
                flush=True,
            )
        if (
            scalar(conn, "SELECT count(*) FROM pg_index WHERE indrelid = 'events'::regclass AND indisprimary")
            == 0
        ):
            print("    building the primary key…", flush=True)
            conn.execute("SET maintenance_work_mem = '1GB'")
            conn.execute("ALTER TABLE events ADD PRIMARY KEY (id)")
        print("    VACUUM ANALYZE…", flush=True)
        conn.execute("ALTER TABLE events RESET (autovacuum_enabled)")
        conn.execute("VACUUM (FREEZE, ANALYZE) events")
        conn.execute("VACUUM ANALYZE dims")
        conn.execute("UPDATE bench_dataset SET value = 'true' WHERE key = 'complete'")
    seconds = time.monotonic() - started
    print(f"  cached dataset {db} ready in {seconds:.0f}s", flush=True)
    return db, seconds


def copy_events(admin_dsn: str, rows: int, run_db: str) -> tuple[float, float]:
    """``run_db`` as a fresh copy of the cached ``rows``-row dataset; returns (build seconds, copy seconds)."""
    _, built = ensure_events(admin_dsn, rows)
    copied = recreate_database(admin_dsn, run_db, template=events_db(rows))
    with psycopg.connect(bench_dsn(admin_dsn, run_db), autocommit=True) as conn:
        conn.execute("DROP TABLE bench_dataset")
    return built, copied


def estimate(rows: int) -> dict[str, float]:
    """Rough disk (GiB) and build time (s) of the cached dataset."""
    return {"disk_gib": rows * EVENTS_BYTES_PER_ROW / 2**30, "build_s": rows / LOAD_ROWS_PER_SECOND}


def cached(admin_dsn: str) -> list[tuple[str, str, str]]:
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        names = [
            r[0]
            for r in admin.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE 'pgtrickle\\_bench\\_events\\_%' ORDER BY 1"
            )
        ]
        out = []
        for name in names:
            size = scalar(admin, "SELECT pg_size_pretty(pg_database_size(%s))", (name,))
            with psycopg.connect(bench_dsn(admin_dsn, name), autocommit=True) as conn:
                loaded, done = _state(conn)
            out.append((name, str(size), "complete" if done else f"partial: {loaded:,} rows"))
        return out


def main(argv: list[str] | None = None) -> int:
    from pgtrickle.config import Settings
    from pgtrickle.db.connection import resolve_dsn

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=["events", "list", "drop", "estimate"])
    parser.add_argument("rows", nargs="?", type=int, default=None)
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args(argv)
    if args.action in ("events", "drop", "estimate") and args.rows is None:
        parser.error(f"{args.action} needs a row count")
    if args.action == "estimate":
        e = estimate(args.rows)
        print(f"{fmt_size(args.rows)} rows: ~{e['disk_gib']:.1f} GiB, ~{e['build_s'] / 60:.0f} min to build")
        return 0
    admin_dsn = resolve_dsn(Settings.from_env().with_overrides(dsn=args.dsn))
    if args.action == "events":
        ensure_events(admin_dsn, args.rows)
    elif args.action == "drop":
        drop_database(admin_dsn, events_db(args.rows))
    else:
        for row in cached(admin_dsn):
            print("  ".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
