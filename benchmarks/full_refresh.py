"""FULL refresh through pgtrickle next to PostgreSQL's REFRESH MATERIALIZED VIEW.

Same machine, same run, same query: a GROUP BY over N rows (default 1M) into
1000 groups. Reports the cold SparkSession start-up, then the median of
``--repeat`` refreshes of each, and their ratio. Each pgtrickle refresh is
preceded by a one-row UPDATE so there is a pending change (otherwise
pgtrickle would correctly skip the work); the matview gets the same UPDATE.

    .venv/bin/python benchmarks/full_refresh.py [--rows 1000000] [--repeat 5] [--dsn ...]

Uses the embedded PostgreSQL unless --dsn is given; works in a database named
``pgtrickle_bench`` (created, and dropped at the end).
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

from common import bench_dsn, drop_database, machine, recreate_database  # noqa: E402
from pgtrickle.catalog.install import install  # noqa: E402
from pgtrickle.config import Settings  # noqa: E402
from pgtrickle.db.connection import resolve_dsn  # noqa: E402
from pgtrickle.daemon.manual import refresh_sync  # noqa: E402
from pgtrickle.spark import session as spark_session  # noqa: E402

QUERY = "SELECT grp, count(*) AS n, sum(v) AS total, avg(qty) AS avg_qty FROM events GROUP BY grp"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--spark-master", default="local[*]")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    settings = Settings.from_env().with_overrides(dsn=args.dsn, spark_master=args.spark_master)
    admin_dsn = resolve_dsn(settings)
    recreate_database(admin_dsn, "pgtrickle_bench")
    dsn = bench_dsn(admin_dsn, "pgtrickle_bench")
    settings = settings.with_overrides(dsn=dsn)
    try:
        figures = run(settings, dsn, args.rows, args.repeat)
    finally:
        spark_session.stop_spark()
        drop_database(admin_dsn, "pgtrickle_bench")
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


def run(settings: Settings, dsn: str, rows: int, repeat: int) -> dict[str, object]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        install(conn)
        host = machine(conn)
        print(f"loading {rows:,} rows…", flush=True)
        conn.execute("CREATE TABLE events (id bigint PRIMARY KEY, grp int, v numeric(12,2), qty int)")
        conn.execute(
            "INSERT INTO events SELECT g, g %% 1000, (g %% 977) / 10.0, g %% 13 FROM generate_series(1, %s) g",
            (rows,),
        )
        conn.execute("VACUUM ANALYZE events")
        conn.execute(f"CREATE MATERIALIZED VIEW events_mv AS {QUERY}")
        conn.execute(
            "SELECT pgtrickle.create_stream_table('events_st', %s, refresh_mode => 'FULL', "
            "initialize => false)",
            (QUERY,),
        )

        started = time.monotonic()
        spark_session.get_spark(settings)
        spark_start = time.monotonic() - started
        print(f"SparkSession start-up: {spark_start:.2f}s", flush=True)

        started = time.monotonic()
        refresh_sync(settings, dsn, ["events_st"])  # initial population, includes the first Spark job
        first_refresh = time.monotonic() - started
        print(f"first refresh (warms the JVM): {first_refresh:.2f}s", flush=True)

        mv_times, st_times, spark_times = [], [], []
        for i in range(repeat):
            conn.execute("UPDATE events SET qty = qty + 1 WHERE id = %s", (i + 1,))
            started = time.monotonic()
            conn.execute("REFRESH MATERIALIZED VIEW events_mv")
            mv_times.append(time.monotonic() - started)
            started = time.monotonic()
            [outcome] = refresh_sync(settings, dsn, ["events_st"])
            st_times.append(time.monotonic() - started)
            spark_times.append(outcome.spark_seconds)
            print(
                f"  round {i + 1}: matview {mv_times[-1]:.3f}s, pgtrickle FULL {st_times[-1]:.3f}s "
                f"(Spark job {outcome.spark_seconds:.3f}s, {outcome.action.value})",
                flush=True,
            )
        diff = conn.execute(
            "SELECT count(*) FROM ((SELECT grp, n, total, avg_qty FROM events_st EXCEPT ALL "
            "SELECT * FROM events_mv) UNION ALL (SELECT * FROM events_mv EXCEPT ALL "
            "SELECT grp, n, total, avg_qty FROM events_st)) d"
        ).fetchone()[0]  # type: ignore[index]
    mv, st = statistics.median(mv_times), statistics.median(st_times)
    figures = {
        "machine": host,
        "rows": rows,
        "groups": 1000,
        "spark_master": settings.spark_master,
        "spark_startup_s": round(spark_start, 3),
        "first_refresh_s": round(first_refresh, 3),
        "matview_refresh_median_s": round(mv, 4),
        "pgtrickle_full_refresh_median_s": round(st, 4),
        "pgtrickle_spark_job_median_s": round(statistics.median(spark_times), 4),
        "pgtrickle_over_matview_ratio": round(st / mv, 2),
        "result_rows_differing_from_matview": int(diff),
    }
    print(
        f"\nSpark start-up {spark_start:.2f}s; FULL refresh of {rows:,} rows → 1000 groups: "
        f"pgtrickle {st:.3f}s vs REFRESH MATERIALIZED VIEW {mv:.3f}s (×{st / mv:.1f})"
    )
    return figures


if __name__ == "__main__":
    main()
