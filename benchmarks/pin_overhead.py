"""What pinning relations by OID (pgtrickle.catalog.identity) adds to a refresh.

Every refresh pins its sources in the reading transaction and its stream table
in the applying one (docs/SECURITY.md, "Code the daemon never runs"). This
measures one pin of 1 and of 5 plain tables inside a REPEATABLE READ
transaction, side by side with the same transaction's bare BEGIN/ROLLBACK, on
one connection, median of ``--rounds``.

    .venv/bin/python benchmarks/pin_overhead.py --dsn postgresql://...   # any database; creates schema pgt_pin_bench
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg

from pgtrickle.catalog import identity


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    with psycopg.connect(args.dsn, autocommit=True) as setup:
        setup.execute("DROP SCHEMA IF EXISTS pgt_pin_bench CASCADE")
        setup.execute("CREATE SCHEMA pgt_pin_bench")
        pins = []
        for i in range(5):
            setup.execute(f"CREATE TABLE pgt_pin_bench.t{i} (id int)")
            relid = setup.execute(f"SELECT 'pgt_pin_bench.t{i}'::regclass::oid::bigint").fetchone()[0]  # type: ignore[index]
            pins.append(identity.Pin(int(relid), "pgt_pin_bench", f"t{i}"))
    try:
        with psycopg.connect(args.dsn) as conn:

            def run(n: int) -> float:
                times = []
                for _ in range(args.rounds):
                    t0 = time.perf_counter()
                    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                    if n:
                        identity.pin(conn, pins[:n], identity.READ)
                    conn.rollback()
                    times.append(time.perf_counter() - t0)
                return statistics.median(times) * 1000

            bare = run(0)
            for n in (1, 5):
                ms = run(n)
                print(
                    f"pin {n} relation(s): {ms:.2f} ms per transaction vs {bare:.2f} ms bare "
                    f"(+{ms - bare:.2f} ms, median of {args.rounds})"
                )
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as setup:
            setup.execute("DROP SCHEMA IF EXISTS pgt_pin_bench CASCADE")


if __name__ == "__main__":
    main()
