"""The cost of PostgreSQL-exact numeric division on Spark: FULL refreshes of a numeric avg/ratio
aggregate and of a per-row quotient, timed with the code on ``PYTHONPATH`` (run it once on a
checkout before the change and once after, and compare; the oracle column says which is exact).

    PYTHONPATH=src .venv/bin/python benchmarks/numeric_division.py [--rows 200000] [--repeat 3]

Uses the embedded PostgreSQL unless --dsn is given; works in a database of its own
(``pgtrickle_bench_numdiv``, created and dropped).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402

from common import bench_dsn, drop_database, recreate_database  # noqa: E402
from pgtrickle.catalog.install import install  # noqa: E402
from pgtrickle.config import Settings  # noqa: E402
from pgtrickle.daemon.manual import refresh_sync  # noqa: E402
from pgtrickle.db.connection import resolve_dsn  # noqa: E402
from pgtrickle.refresh.verify import verify  # noqa: E402
from pgtrickle.spark import session as spark_session  # noqa: E402

DATABASE = "pgtrickle_bench_numdiv"
QUERIES = {
    "aggregate": "SELECT grp, avg(v) AS av, sum(v) / sum(qty) AS r FROM events GROUP BY grp",
    "per_row": "SELECT id, v / (qty + 1) AS r FROM events",
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args()
    settings = Settings.from_env().with_overrides(dsn=args.dsn)
    admin_dsn = resolve_dsn(settings)
    recreate_database(admin_dsn, DATABASE)
    dsn = bench_dsn(admin_dsn, DATABASE)
    settings = settings.with_overrides(dsn=dsn)
    figures: dict[str, object] = {"rows": args.rows}
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            install(conn)
            conn.execute("CREATE TABLE events (id bigint PRIMARY KEY, grp int, v numeric(12,2), qty int)")
            conn.execute(
                "INSERT INTO events SELECT g, g %% 1000, (g %% 977) / 10.0, g %% 13 "
                "FROM generate_series(1, %s) g",
                (args.rows,),
            )
            conn.execute("VACUUM ANALYZE events")
            for name, query in QUERIES.items():
                conn.execute(
                    "SELECT pgtrickle.create_stream_table(%s, %s, refresh_mode => 'FULL', "
                    "initialize => false)",
                    (name, query),
                )
            spark_session.get_spark(settings)
            for name in QUERIES:
                refresh_sync(settings, dsn, [name])  # warm-up
                times = []
                for i in range(args.repeat):
                    conn.execute("UPDATE events SET qty = qty + 1 WHERE id = %s", (i + 1,))
                    started = time.monotonic()
                    refresh_sync(settings, dsn, [name])
                    times.append(time.monotonic() - started)
                check = verify(conn, name)
                figures[name] = {
                    "full_refresh_median_s": round(statistics.median(times), 3),
                    "rows_differing_from_query": check.missing + check.extra,
                }
                print(name, figures[name], flush=True)
    finally:
        spark_session.stop_spark()
        drop_database(admin_dsn, DATABASE)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
