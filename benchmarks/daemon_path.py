"""DIFFERENTIAL refresh through a running daemon vs REFRESH MATERIALIZED VIEW, in one run (issue 18).

The in-process benchmark (``benchmarks/differential.py``) times ``refresh_sync`` in its own process;
users refresh through the daemon, which adds what that call does not see (the command queue, the
daemon's catalog reads, its Spark session shared with the scheduler). Here, on a copy of the cached
``events`` dataset of ``--rows`` rows (``benchmarks/datasets.py``):

* a stream table per shape (``aggregate``, ``join_aggregate`` as in ``differential.py``), refresh
  mode AUTO, schedule ``1h`` (the daemon never refreshes it by itself), and a materialized view of
  the same query;
* a daemon (``pgtrickle run``, a separate process) is started and refreshes each stream table once
  (FULL, its initial population);
* each round (one warm-up round first, then ``--rounds``): one transaction of ``--changes`` changes
  to ``events`` (half UPDATEs, a quarter INSERTs, a quarter DELETEs, then ``VACUUM ANALYZE``), then
  per shape a refresh handed to the daemon (``pgtrickle refresh``'s path: a command in
  ``pgtrickle.pgt_refresh_commands``, answered by the daemon) and ``REFRESH MATERIALIZED VIEW``.

The DIFFERENTIAL figure is the duration the daemon records in the refresh history (``end_time -
start_time``, as ``pgtrickle history`` shows it); the wall time of the request, from submit to the
daemon's answer, is reported beside it. Every refresh must be DIFFERENTIAL, and at the end every
stream table equals its query (two-way EXCEPT ALL). The figure: median matview seconds / median
DIFFERENTIAL seconds per shape (target ≥ 3, issue 18).

    .venv/bin/python benchmarks/daemon_path.py [--rows 10000000] [--changes 10000] [--rounds 3]
        [--queries aggregate,join_aggregate] [--dsn DSN] [--spark-master local[*]] [--json PATH]
        [--no-docs] [--keep] [--render JSON]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402

from cli_refresh import start_daemon  # noqa: E402
from common import (  # noqa: E402
    IMG,
    add_output_args,
    bench_dsn,
    command_line,
    drop_database,
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
from differential import QUERIES, apply_changes, check_disk  # noqa: E402
from pgtrickle.catalog.install import install  # noqa: E402
from pgtrickle.config import Settings  # noqa: E402
from pgtrickle.daemon.serve_client import submit, wait_for  # noqa: E402
from pgtrickle.db.connection import redact, resolve_dsn  # noqa: E402
from pgtrickle.refresh.verify import verify  # noqa: E402

SECTION = "daemon-path"
PLOT = IMG / "daemon_path.png"
SHAPES = ("aggregate", "join_aggregate")
TARGET = 3.0


def served_refresh(conn: psycopg.Connection, dsn: str, name: str, timeout: float) -> dict[str, Any]:
    """Hand ``name``'s refresh to the daemon and wait; the history row the daemon wrote for it."""
    last = conn.execute(
        "SELECT coalesce(max(h.refresh_id), 0) FROM pgtrickle.pgt_refresh_history h"
        " JOIN pgtrickle.pgt_stream_tables s USING (pgt_id) WHERE s.pgt_name = %s",
        (name,),
    ).fetchone()[0]  # type: ignore[index]
    started = time.monotonic()
    served = wait_for(dsn, conn, submit(conn, [name], False), timeout)
    wall = time.monotonic() - started
    if served is None:
        raise RuntimeError("no daemon answered the refresh (it is not running)")
    if served.error is not None:
        raise RuntimeError(f"the daemon refused to refresh {name}: {served.error}")
    row = conn.execute(
        "SELECT h.action, h.status, extract(epoch FROM h.end_time - h.start_time)::float8, h.spark_seconds,"
        " h.delta_row_count, h.mode_reason FROM pgtrickle.pgt_refresh_history h"
        " JOIN pgtrickle.pgt_stream_tables s USING (pgt_id)"
        " WHERE s.pgt_name = %s AND h.refresh_id > %s ORDER BY h.refresh_id DESC LIMIT 1",
        (name, last),
    ).fetchone()
    if row is None:
        raise RuntimeError(f"the daemon answered, but wrote no history row for {name}")
    action, status, seconds, spark_seconds, delta_rows, reason = row
    if status != "COMPLETED":
        raise RuntimeError(f"{name}: the refresh ended {status}: {reason}")
    return {
        "action": action,
        "seconds": round(seconds, 4),
        "spark_seconds": None if spark_seconds is None else round(spark_seconds, 4),
        "delta_rows": delta_rows,
        "wall": round(wall, 4),
        "reason": reason,
    }


def matview(conn: psycopg.Connection, shape: str) -> float:
    started = time.monotonic()
    conn.execute(f"REFRESH MATERIALIZED VIEW mv_{shape}")
    return time.monotonic() - started


def create(conn: psycopg.Connection, shapes: list[str]) -> None:
    for shape in shapes:
        conn.execute(
            "SELECT pgtrickle.create_stream_table(%s, %s, schedule => '1h', refresh_mode => 'AUTO',"
            " initialize => false)",
            (f"st_{shape}", QUERIES[shape]),
        )
        conn.execute("SELECT pgtrickle.alter_stream_table(%s, circuit_breaker => 'none')", (f"st_{shape}",))
        conn.execute(f"CREATE MATERIALIZED VIEW mv_{shape} AS {QUERIES[shape]}")


def run(args: argparse.Namespace, settings: Settings, admin_dsn: str) -> dict[str, Any]:
    check_disk(settings, admin_dsn, args.rows, args.queries)
    db = f"pgtrickle_bench_daemon_{os.getpid()}"
    print(f"== {args.rows:,} rows: the cached dataset, copied…", flush=True)
    copy_events(admin_dsn, args.rows, db)
    dsn = bench_dsn(admin_dsn, db)
    env = dict(
        os.environ,
        PGTRICKLE_DSN=dsn,
        PGTRICKLE_SPARK_MASTER=args.spark_master,
        PYTHONPATH=str(Path(__file__).resolve().parent.parent / "src"),
    )
    daemon: subprocess.Popen | None = None
    samples: dict[str, dict[str, list[Any]]] = {s: {"diff": [], "matview": []} for s in args.queries}
    wrong: dict[str, int] = {}
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            install(conn)
            create(conn, args.queries)
            daemon = start_daemon(env, conn)
            print("  daemon serving; initial refreshes", flush=True)
            for shape in args.queries:
                first = served_refresh(conn, dsn, f"st_{shape}", args.timeout)
                print(f"  st_{shape}: initial {first['action']} {first['seconds']:.2f}s", flush=True)
            next_id = int(conn.execute("SELECT max(id) FROM events").fetchone()[0]) + 1  # type: ignore[index]
            for round_ in range(args.rounds + 1):
                label = "warm-up" if round_ == 0 else f"round {round_}/{args.rounds}"
                next_id = apply_changes(conn, args.changes, next_id, (round_ + 1) / 1000)
                for shape in args.queries:
                    got = served_refresh(conn, dsn, f"st_{shape}", args.timeout)
                    mv = matview(conn, shape)
                    print(
                        f"  {label} {shape}: daemon {got['action']} {got['seconds']:.2f}s"
                        f" (request {got['wall']:.2f}s), matview {mv:.2f}s",
                        flush=True,
                    )
                    if got["action"] != "DIFFERENTIAL":
                        raise RuntimeError(f"st_{shape} refreshed {got['action']}: {got['reason']}")
                    if round_:
                        samples[shape]["diff"].append(got)
                        samples[shape]["matview"].append(round(mv, 4))
            for shape in args.queries:
                result = verify(conn, f"st_{shape}")
                wrong[shape] = result.missing + result.extra
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=120)
            except subprocess.TimeoutExpired:
                daemon.kill()
        if args.keep:
            print(f"  kept database {db}", flush=True)
        else:
            drop_database(admin_dsn, db)
    rows = {}
    for shape, got in samples.items():
        diff = statistics.median(s["seconds"] for s in got["diff"])
        mv = statistics.median(got["matview"])
        rows[shape] = {
            "diff_seconds": round(diff, 3),
            "request_seconds": round(statistics.median(s["wall"] for s in got["diff"]), 3),
            "spark_seconds": round(statistics.median(s["spark_seconds"] or 0.0 for s in got["diff"]), 3),
            "matview_seconds": round(mv, 3),
            "ratio": round(mv / diff, 2) if diff else None,
            "differing_rows": wrong.get(shape),
            "samples": got,
        }
    return rows


def plot(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    shapes = list(report["results"])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.38
    for i, (key, label) in enumerate(
        (("diff_seconds", "DIFFERENTIAL (daemon, history)"), ("matview_seconds", "REFRESH MATERIALIZED VIEW"))
    ):
        xs = [j + (i - 0.5) * width for j in range(len(shapes))]
        ax.bar(xs, [report["results"][s][key] for s in shapes], width, label=label)
    ax.set_xticks(range(len(shapes)), shapes)
    ax.set_ylabel("seconds (median)")
    ax.set_title(f"{report['changes']:,} changes to {report['rows']:,} rows")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _spark_seconds(row: dict[str, Any]) -> float:
    """The median Spark seconds of the DIFFERENTIAL refreshes (computed from the samples for older JSON)."""
    if "spark_seconds" in row:
        return float(row["spark_seconds"])
    return statistics.median(s["spark_seconds"] or 0.0 for s in row["samples"]["diff"])


def docs_section(report: dict[str, Any], plot_path: Path) -> str:
    lines = header_lines(
        "DIFFERENTIAL through a running daemon vs `REFRESH MATERIALIZED VIEW`", report, "daemon_path"
    )
    lines += [
        f"A copy of the `events` dataset ({report['rows']:,} rows) and its `dims`; per query a stream table"
        " (AUTO, schedule `1h`) refreshed by a running daemon (`pgtrickle run`) on request, and a"
        f" materialized view of the same query. Each of {report['rounds']} rounds (after a warm-up round)"
        f" commits {report['changes']:,} changes to `events`, then the daemon refreshes each stream table"
        " (the duration its refresh history records; *request*: from submitting the command to the"
        " daemon's answer) and `REFRESH MATERIALIZED VIEW` runs. Medians; every refresh DIFFERENTIAL,"
        " every stream table equal to its query at the end.",
        "",
    ]
    table = [
        (
            shape,
            f"{r['diff_seconds']:.2f}",
            f"{r['request_seconds']:.2f}",
            f"{_spark_seconds(r):.2f}",
            f"{r['matview_seconds']:.2f}",
            f"×{r['ratio']:.2f}",
            r["differing_rows"],
        )
        for shape, r in report["results"].items()
    ]
    lines += md_table(
        (
            "query",
            "DIFFERENTIAL s (history)",
            "request s",
            "of it on Spark s",
            "matview s",
            "matview / DIFFERENTIAL",
            "differing rows",
        ),
        table,
    )
    lines += ["", f"Target (issue 18): matview / DIFFERENTIAL ≥ {TARGET:g} for both queries."]
    lines += ["", f"![daemon path](img/{plot_path.name})"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--changes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queries", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for one refresh")
    parser.add_argument("--keep", action="store_true", help="keep the run's database")
    parser.add_argument(
        "--render", type=Path, metavar="JSON", help="only rewrite the docs section and plot from a saved run"
    )
    add_output_args(parser, SECTION, PLOT)
    args = parser.parse_args(argv)
    args.queries = [q.strip() for q in args.queries.split(",") if q.strip()]
    unknown = [q for q in args.queries if q not in SHAPES]
    if unknown or not args.queries:
        parser.error(f"unknown --queries {', '.join(unknown)}; choose from {', '.join(SHAPES)}")
    if args.rounds < 1 or args.changes < 4 or args.rows < 1000:
        parser.error("--rounds must be ≥ 1, --changes ≥ 4 and --rows ≥ 1000")
    if args.render:
        saved = json.loads(args.render.read_text())
        plot(saved, args.plot)
        write_section(args.section, docs_section(saved, args.plot))
        print(f"docs/BENCHMARKS.md section {args.section} rewritten from {args.render}", flush=True)
        return 0
    stop_on_signals()
    settings = Settings.from_env().with_overrides(dsn=args.dsn, spark_master=args.spark_master)
    admin_dsn = resolve_dsn(settings)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        host = machine(conn)
    results = run(args, settings, admin_dsn)
    command = command_line("benchmarks/daemon_path.py", argv)
    if args.dsn:
        command = command.replace(args.dsn, redact(args.dsn))
    report = {
        "command": command,
        "date": now_text(),
        "preset": args.preset,
        "machine": host,
        "revision": revision(),
        "spark_master": args.spark_master,
        "rows": args.rows,
        "changes": args.changes,
        "rounds": args.rounds,
        "results": results,
    }
    for shape, r in results.items():
        print(
            f"{shape}: daemon DIFFERENTIAL {r['diff_seconds']:.2f}s, matview {r['matview_seconds']:.2f}s,"
            f" ×{r['ratio']}, differing rows {r['differing_rows']}",
            flush=True,
        )
    write_json(report, args.json, "daemon_path")
    if not args.no_docs:
        plot(report, args.plot)
        write_section(args.section, docs_section(report, args.plot))
        print(f"docs/BENCHMARKS.md section {args.section} updated", flush=True)
    failed = any(r["differing_rows"] for r in results.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
