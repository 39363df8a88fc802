"""`pgtrickle refresh NAME` with a daemon running (it serves the refresh) vs without (its own SparkSession).

One database (``pgtrickle_bench_cli_<pid>``, dropped at the end): a source of ``--rows`` rows and a
DIFFERENTIAL stream table ``agg`` (``SELECT g, count(*), sum(v) FROM src GROUP BY g``, 100 groups,
schedule ``1h`` so the daemon does not refresh it by itself). Each round commits ``--changes``
single-row UPDATEs of the source, then runs ``pgtrickle refresh agg`` as a user does — a new
process (``python -m pgtrickle``) — and times it from start to exit; the refresh must be
DIFFERENTIAL, exit 0, and the oracle (two-way EXCEPT ALL against the query) must hold after it.

First ``--rounds`` rounds with no daemon (the command starts its own SparkSession), then a daemon
(``pgtrickle run``, a separate process) is started and the same rounds run again: the command hands
the refresh to it. The figure is the ratio of the medians (target ≤ 0.25, issue 18).

    .venv/bin/python benchmarks/cli_refresh.py [--rounds 5] [--changes 100] [--rows 100000]
        [--dsn DSN] [--spark-master local[2]] [--json PATH] [--no-docs] [--preset NAME]
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
    recreate_database,
    revision,
    scalar,
    stop_on_signals,
    write_json,
    write_section,
)
from pgtrickle.catalog.install import install  # noqa: E402
from pgtrickle.config import Settings  # noqa: E402
from pgtrickle.db.connection import redact, resolve_dsn  # noqa: E402
from pgtrickle.refresh.verify import verify  # noqa: E402

SECTION = "cli-refresh"
PLOT = IMG / "cli_refresh.png"
QUERY = "SELECT g, count(*) AS n, sum(v) AS s FROM src GROUP BY g"


def setup(conn: psycopg.Connection, rows: int) -> None:
    conn.execute("CREATE TABLE src (id int PRIMARY KEY, g int NOT NULL, v bigint NOT NULL)")
    conn.execute("INSERT INTO src SELECT i, i %% 100, i FROM generate_series(1, %s) i", (rows,))
    conn.execute("ANALYZE src")
    conn.execute(
        "SELECT pgtrickle.create_stream_table('agg', %s, schedule => '1h', refresh_mode => 'DIFFERENTIAL',"
        " initialize => false)",
        (QUERY,),
    )


def change(conn: psycopg.Connection, rows: int, changes: int, round_: int) -> None:
    """``changes`` single-row UPDATEs, each its own statement, in one transaction."""
    with conn.transaction():
        for k in range(changes):
            conn.execute(
                "UPDATE src SET v = v + 1 WHERE id = %s", (1 + (round_ * changes + k) * 7919 % rows,)
            )


def cli(env: dict[str, str], dsn: str) -> tuple[float, dict[str, Any], str]:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pgtrickle", "--dsn", dsn, "refresh", "agg", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"pgtrickle refresh exited {proc.returncode}: {proc.stderr}")
    return seconds, json.loads(proc.stdout), proc.stderr


def rounds(
    conn: psycopg.Connection,
    env: dict[str, str],
    dsn: str,
    args: argparse.Namespace,
    first: int,
    served: bool,
) -> list[float]:
    times = []
    for i in range(args.rounds):
        change(conn, args.rows, args.changes, first + i)
        seconds, doc, stderr = cli(env, dsn)
        table = doc["stream_tables"][0]
        if table["action"] != "DIFFERENTIAL":
            raise RuntimeError(f"expected a DIFFERENTIAL refresh, got {table}")
        if served == ("no pgtrickle daemon" in stderr):
            raise RuntimeError(f"served={served} but the command said: {stderr.strip()}")
        result = verify(conn, "agg")
        if not result.ok:
            raise RuntimeError(f"agg differs from its query: {result.missing} missing, {result.extra} extra")
        times.append(seconds)
        print(
            f"  {'daemon' if served else 'no daemon'} round {i + 1}: {seconds:.2f}s "
            f"(refresh itself {table['seconds']:.2f}s)",
            flush=True,
        )
    return times


def start_daemon(env: dict[str, str], conn: psycopg.Connection) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgtrickle", "run", "--tick", "30"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while not scalar(conn, "SELECT count(*) FROM pgtrickle._serving_daemons()"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the daemon did not start")
        time.sleep(0.2)
    return proc


def docs_section(report: dict[str, Any]) -> str:
    lines = header_lines("`pgtrickle refresh` with and without a daemon", report, "benchmarks/cli_refresh.py")
    r = report["results"]
    lines += [
        f"`pgtrickle refresh agg` (a new process each time, `--json`) after {report['changes']} single-row "
        f"UPDATEs of a {report['rows']:,}-row source; `agg` is DIFFERENTIAL (100 groups). Wall seconds from "
        "process start to exit; every refresh checked DIFFERENTIAL and against the query (EXCEPT ALL).",
        "",
        *md_table(
            ["", "median s", "min s", "max s", "rounds"],
            [
                [
                    "no daemon (own SparkSession)",
                    f"{r['inline']['median']:.2f}",
                    f"{min(r['inline']['all']):.2f}",
                    f"{max(r['inline']['all']):.2f}",
                    len(r["inline"]["all"]),
                ],
                [
                    "daemon running (served)",
                    f"{r['served']['median']:.2f}",
                    f"{min(r['served']['all']):.2f}",
                    f"{max(r['served']['all']):.2f}",
                    len(r["served"]["all"]),
                ],
            ],
        ),
        "",
        f"Ratio served / no daemon: **{r['ratio']:.3f}** (target ≤ 0.25).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--rows", type=int, default=100_000)
    add_output_args(parser, SECTION, PLOT)
    args = parser.parse_args(argv)
    stop_on_signals()
    settings = Settings.from_env().with_overrides(dsn=args.dsn, spark_master=args.spark_master)
    admin_dsn = resolve_dsn(settings)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        host = machine(conn)
    db = f"pgtrickle_bench_cli_{os.getpid()}"
    recreate_database(admin_dsn, db)
    dsn = bench_dsn(admin_dsn, db)
    env = dict(
        os.environ,
        PGTRICKLE_DSN=dsn,
        PGTRICKLE_SPARK_MASTER=args.spark_master,
        PYTHONPATH=str(Path(__file__).resolve().parent.parent / "src"),
    )
    daemon: subprocess.Popen | None = None
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            install(conn)
            setup(conn, args.rows)
            subprocess.run(
                [sys.executable, "-m", "pgtrickle", "--dsn", dsn, "refresh", "agg"],
                env=env,
                check=True,
                capture_output=True,
                timeout=600,
            )
            print("== no daemon", flush=True)
            inline = rounds(conn, env, dsn, args, 0, served=False)
            print("== daemon running", flush=True)
            daemon = start_daemon(env, conn)
            served = rounds(conn, env, dsn, args, args.rounds, served=True)
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=120)
            except subprocess.TimeoutExpired:
                daemon.kill()
        drop_database(admin_dsn, db)
    results = {
        "inline": {"all": [round(x, 3) for x in inline], "median": statistics.median(inline)},
        "served": {"all": [round(x, 3) for x in served], "median": statistics.median(served)},
    }
    results["ratio"] = results["served"]["median"] / results["inline"]["median"]
    command = command_line("benchmarks/cli_refresh.py", argv)
    if args.dsn:
        command = command.replace(args.dsn, redact(args.dsn))  # no password in the docs
    report = {
        "command": command,
        "date": now_text(),
        "preset": args.preset,
        "machine": host,
        "revision": revision(),
        "spark_master": args.spark_master,
        "rows": args.rows,
        "changes": args.changes,
        "results": results,
    }
    print(
        f"median no daemon {results['inline']['median']:.2f}s, daemon {results['served']['median']:.2f}s, "
        f"ratio {results['ratio']:.3f}",
        flush=True,
    )
    write_json(report, args.json, "cli_refresh")
    if not args.no_docs:
        write_section(args.section, docs_section(report))
        print(f"docs/BENCHMARKS.md section {args.section} updated", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
