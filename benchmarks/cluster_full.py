"""A large FULL refresh on ``local[2]`` and on ``local-cluster[2,1,1024]``: same data, both masters.

``local[2]`` runs Spark's tasks on two threads of the driver JVM; ``local-cluster[2,1,1024]`` starts two
separate executor JVMs (1 core, 1 GiB each) that get the JDBC driver through ``spark.jars`` and
exchange shuffle data over the network, as on a real cluster. The same stream tables over a copy of
the cached events dataset (``benchmarks/datasets.py``) are refreshed FULL from a fresh process per
master (``pgtrickle refresh`` style: one SparkSession per process): one warm-up refresh, then
``--repeat`` timed refreshes, each after a one-row UPDATE so there is something to refresh. Two
queries: ``aggregate`` (GROUP BY over events into 1000 groups: JDBC read dominated) and ``join``
(events ⋈ dims: every row read, joined and written back).
The masters alternate run by run (local, cluster, local, cluster, …) so drift hits both.

    .venv/bin/python benchmarks/cluster_full.py [--rows 10000000] [--repeat 3] [--queries aggregate,join]
        [--json PATH] [--no-docs] [--preset NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402

from common import (  # noqa: E402
    DOCS,
    IMG,
    add_output_args,
    bench_dsn,
    command_line,
    drop_database,
    fmt_size,
    header_lines,
    machine,
    md_table,
    now_text,
    pyplot,
    revision,
    stop_on_signals,
    write_json,
    write_section,
)
from datasets import copy_events  # noqa: E402
from pgtrickle.catalog.install import install  # noqa: E402
from pgtrickle.config import Settings  # noqa: E402
from pgtrickle.db.connection import resolve_dsn  # noqa: E402

SECTION = "cluster"
PLOT = IMG / "cluster.png"
MASTERS = ("local[2]", "local-cluster[2,1,1024]")
QUERIES = {
    "aggregate": "SELECT grp, count(*) AS n, sum(v) AS total, avg(qty) AS avg_qty FROM events GROUP BY grp",
    "join": "SELECT e.id, d.name, e.v FROM events e JOIN dims d ON d.id = e.dim_id",
}


def worker(dsn: str, master: str, names: list[str], repeat: int) -> dict[str, Any]:
    """In a fresh process: start Spark on ``master`` and refresh each stream table FULL ``repeat`` + 1 times."""
    from pgtrickle.daemon.manual import refresh_sync
    from pgtrickle.spark import session as spark_session

    settings = Settings.from_env().with_overrides(dsn=dsn, spark_master=master)
    started = time.monotonic()
    spark = spark_session.get_spark(settings)
    startup = time.monotonic() - started
    out: dict[str, Any] = {
        "master": master,
        "startup_s": round(startup, 2),
        "refresh_s": {},
        "spark_s": {},
        "first_s": {},
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in names:
            times, spark_times = [], []
            for i in range(repeat + 1):
                conn.execute("UPDATE events SET qty = coalesce(qty, 0) + 1 WHERE id = %s", (i + 1,))
                t = time.monotonic()
                [outcome] = refresh_sync(settings, dsn, [name])
                seconds = time.monotonic() - t
                if outcome.action.value != "FULL":
                    raise RuntimeError(f"{name}: expected FULL, got {outcome.action.value}: {outcome.reason}")
                if i == 0:
                    out["first_s"][name] = round(seconds, 3)
                else:
                    times.append(round(seconds, 3))
                    spark_times.append(round(outcome.spark_seconds, 3))
            out["refresh_s"][name] = times
            out["spark_s"][name] = spark_times
    try:  # after the jobs, when every executor has registered: driver + executors
        out["block_managers"] = int(spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size())
    except Exception:  # noqa: BLE001 - informational
        out["block_managers"] = -1
    spark_session.stop_spark()
    return out


def run_worker(dsn: str, master: str, names: list[str], repeat: int) -> dict[str, Any]:
    # The DSN (it may hold a password) goes through the environment, not the command line (ps shows that).
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PGTRICKLE_DSN=dsn)
    cmd = [sys.executable, __file__, "--worker", master, "--names", ",".join(names), "--repeat", str(repeat)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=7200)
    if done.returncode != 0:
        raise RuntimeError(f"worker on {master} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def plot(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    queries = list(report["summary"])
    fig, ax = plt.subplots(figsize=(2.6 * len(queries) + 2, 3.8))
    width = 0.35
    for k, master in enumerate(MASTERS):
        ax.bar(
            [i + (k - 0.5) * width for i in range(len(queries))],
            [report["summary"][q][master] for q in queries],
            width,
            label=master,
            color=["#2a9d8f", "#e76f51"][k],
        )
    ax.set_xticks(range(len(queries)), [f"{q}\n{fmt_size(report['rows'])} rows" for q in queries])
    ax.set_ylabel("FULL refresh seconds (median)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def docs_section(report: dict[str, Any], plot_path: Path) -> str:
    lines = header_lines(
        "FULL refresh: `local[2]` vs `local-cluster[2,1,1024]`", report, "benchmarks/cluster_full.py"
    )
    rows = []
    for q, s in report["summary"].items():
        a, b = s[MASTERS[0]], s[MASTERS[1]]
        rows.append(
            [
                q,
                f"{fmt_size(report['rows'])}",
                f"{a:.2f}",
                f"{b:.2f}",
                f"×{b / a:.2f}",
                f"{s['spark_' + MASTERS[0]]:.2f} / {s['spark_' + MASTERS[1]]:.2f}",
            ]
        )
    runs = report["runs"]
    lines += [
        f"Same stream tables over `events` ({report['rows']:,} rows) and `dims`, FULL refresh, medians of "
        f"{report['repeat']} refreshes per master after a warm-up refresh, masters alternating "
        f"{report['alternations']}× in fresh processes. Queries: "
        + "; ".join(f"**{q}** `{QUERIES[q]}`" for q in report["summary"])
        + ".",
        "",
        *md_table(
            [
                "query",
                "rows",
                f"`{MASTERS[0]}` s",
                f"`{MASTERS[1]}` s",
                "cluster / local",
                "Spark job s (local / cluster)",
            ],
            rows,
            right_from=1,
        ),
        "",
        "SparkSession start-up: "
        + ", ".join(
            f"`{m}` {statistics.median(r['startup_s'] for r in runs if r['master'] == m):.1f} s"
            for m in MASTERS
        )
        + f"; block managers seen on `{MASTERS[1]}`: "
        + str(max(r["block_managers"] for r in runs if r["master"] == MASTERS[1]))
        + " (driver + executors).",
        "",
        f"![local vs local-cluster](img/{plot_path.name})",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--alternations", type=int, default=1, help="fresh processes per master")
    parser.add_argument("--queries", default="aggregate,join")
    add_output_args(parser, SECTION, PLOT, spark_master=False)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--names", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        dsn = os.environ["PGTRICKLE_DSN"]
        print(json.dumps(worker(dsn, args.worker, args.names.split(","), args.repeat)))
        return 0
    stop_on_signals()
    settings = Settings.from_env().with_overrides(dsn=args.dsn)
    admin_dsn = resolve_dsn(settings)
    queries = [q.strip() for q in args.queries.split(",") if q.strip()]
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        host = machine(conn)
    db = f"pgtrickle_bench_cluster_{os.getpid()}"
    print(f"== {args.rows:,} rows: the cached dataset, copied…", flush=True)
    _, copy_s = copy_events(admin_dsn, args.rows, db)
    dsn = bench_dsn(admin_dsn, db)
    runs: list[dict[str, Any]] = []
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            install(conn)
            for q in queries:
                conn.execute(
                    "SELECT pgtrickle.create_stream_table(%s, %s, schedule => '24h', refresh_mode => 'FULL',"
                    " initialize => false)",
                    (f"full_{q}", QUERIES[q]),
                )
        for _ in range(args.alternations):
            for master in MASTERS:
                print(f"  {master}…", flush=True)
                result = run_worker(dsn, master, [f"full_{q}" for q in queries], args.repeat)
                print(
                    f"  {master}: start-up {result['startup_s']}s, refreshes {result['refresh_s']}",
                    flush=True,
                )
                runs.append(result)
    finally:
        drop_database(admin_dsn, db)
    summary: dict[str, dict[str, float]] = {}
    for q in queries:
        summary[q] = {}
        for m in MASTERS:
            summary[q][m] = round(
                statistics.median(t for r in runs if r["master"] == m for t in r["refresh_s"][f"full_{q}"]), 3
            )
            summary[q]["spark_" + m] = round(
                statistics.median(t for r in runs if r["master"] == m for t in r["spark_s"][f"full_{q}"]), 3
            )
        summary[q]["cluster_over_local"] = round(summary[q][MASTERS[1]] / summary[q][MASTERS[0]], 2)
    report = {
        "command": command_line("benchmarks/cluster_full.py", argv),
        "date": now_text(),
        "preset": args.preset,
        "machine": host,
        "revision": revision(),
        "rows": args.rows,
        "repeat": args.repeat,
        "alternations": args.alternations,
        "copy_s": round(copy_s, 1),
        "summary": summary,
        "runs": runs,
    }
    print(json.dumps(summary, indent=2))
    write_json(report, args.json, "cluster")
    if not args.no_docs:
        plot(report, args.plot)
        write_section(args.section, docs_section(report, args.plot))
        print(f"{DOCS.name} section {args.section} and {args.plot.name} updated", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
