"""Scheduler overhead: idle ticks with 100 stream tables, and DAG propagation latency.

Three measurements, in one database (``pgtrickle_bench_sched_<pid>``, dropped at the end):

* **Idle ticks, 100 stream tables** over a 1000-row source (each ``SELECT id, v + i FROM src WHERE
  id % 100 = i``), all populated. (a) *nothing due* (schedules ``1h``): seconds of one
  ``Scheduler.tick()`` — catalog read, DAG, due decisions, capture reconcile, maintenance checks;
  (b) *all due, no changes* (schedules ``1s``, the last refresh moved back): one tick refreshes each of
  the 100 as ``NO_DATA`` — no Spark job — so it shows the per-stream-table cost of an idle short
  schedule. (c) the **daemon's CPU**: ``Scheduler.run`` in a thread for ``--cpu-seconds`` with
  ``1s`` schedules and the default 1 s tick, nothing changing: CPU seconds per wall second of the
  daemon's Python process, of its Spark JVM and of its PostgreSQL backends (from /proc).
* **Chain of 10**: ``src → c01 → c02 → … → c10`` (each ``SELECT id, v FROM`` the previous one).
* **3×20 fan**: 20 branches of depth 3 from one source (``f1_j = SELECT id, v + j FROM src``,
  ``f2_j = SELECT id, v FROM f1_j``, ``f3_j = SELECT id, v FROM f2_j``; 60 stream tables).
* **Lone branch**: one branch of depth 3 (the fan's best case: what one branch costs alone).

The chain, the fan and the lone branch are measured once per ``--parallel`` value
(``max_parallel_refreshes``; default ``1`` and the machine's default) and ``--batch`` value
(``max_batch_size``; default ``1``, batching off, and ``32``, stream tables ready together share one
Spark job), in the same run. The Spark jobs of a propagation are the sum of its refreshes' counted
jobs (a batch's shared job is counted once, on its first member's history row).

For the chain and the fan the daemon runs as the tests run it (``Scheduler.run`` in a thread,
``tick_seconds`` 0.2, every schedule ``1s``); each of ``--changes`` rounds commits one INSERT into the
source and polls (every 10 ms) until the last stream table(s) hold the new row: the latency from the
commit to the last stream table reflecting it. The refresh history gives the part spent refreshing
(sum of the refreshes' durations) and the number of refreshes.

    .venv/bin/python benchmarks/scheduler_overhead.py [--ticks 20] [--cpu-seconds 30] [--changes 5]
        [--parallel 1,4] [--batch 1,32] [--skip-idle] [--json PATH] [--no-docs] [--preset NAME]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
    header_lines,
    machine,
    md_table,
    now_text,
    pyplot,
    recreate_database,
    revision,
    scalar,
    spark_running,
    stop_on_signals,
    write_json,
    write_section,
)
from pgtrickle.catalog.install import install  # noqa: E402
from pgtrickle.config import Settings, default_parallel_refreshes  # noqa: E402
from pgtrickle.db.connection import resolve_dsn  # noqa: E402
from pgtrickle.daemon.loop import Scheduler  # noqa: E402
from pgtrickle.daemon.manual import refresh_sync  # noqa: E402

SECTION = "scheduler"
PLOT = IMG / "scheduler.png"
CLOCK = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ CPU from /proc
def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK


def child_jvms(pid: int) -> list[int]:
    """Java processes started by ``pid`` (the Spark driver JVM of PySpark)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid and b"java" in (entry / "cmdline").read_bytes():
                out.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def backend_pids(conn: psycopg.Connection) -> list[int]:
    return [
        r[0]
        for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name LIKE 'pgtrickle%%' AND pid <> pg_backend_pid()"
        ).fetchall()
    ]


# ------------------------------------------------------------------ the daemon, as the tests run it
@contextmanager
def daemon(settings: Settings, dsn: str) -> Iterator[Scheduler]:
    scheduler = Scheduler(settings, dsn)
    thread = threading.Thread(target=scheduler.run, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    try:
        yield scheduler
    finally:
        scheduler.stop_requested = True
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("NOTIFY pgtrickle_refresh")
        thread.join(timeout=120)
        scheduler.close()


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, poll: float = 0.01) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)
    return time.monotonic() - started


# ------------------------------------------------------------------ idle ticks
def idle(
    conn: psycopg.Connection, settings: Settings, dsn: str, count: int, ticks: int, cpu_window: float
) -> dict[str, Any]:
    conn.execute("CREATE TABLE src (id int PRIMARY KEY, v int)")
    conn.execute("INSERT INTO src SELECT g, g FROM generate_series(1, 1000) g")
    conn.execute("ANALYZE src")
    started = time.monotonic()
    for i in range(count):
        conn.execute(
            "SELECT pgtrickle.create_stream_table(%s, %s, schedule => '1h', initialize => false)",
            (f"idle_{i:03d}", f"SELECT id, v + {i} AS v FROM src WHERE id % {count} = {i}"),
        )
    create_s = time.monotonic() - started
    started = time.monotonic()
    refresh_sync(settings, dsn, None)
    populate_s = time.monotonic() - started
    print(f"  {count} stream tables created in {create_s:.1f}s, populated in {populate_s:.1f}s", flush=True)
    scheduler = Scheduler(settings, dsn)
    try:
        scheduler.tick()  # warm: caches, decoder check, first maintenance
        nothing = []
        for _ in range(ticks):
            t = time.perf_counter()
            report = scheduler.tick()
            nothing.append(time.perf_counter() - t)
            assert not report.refreshed, "nothing should be due"
        conn.execute("UPDATE pgtrickle.pgt_stream_tables SET schedule = '1s'")
        no_data, actions = [], set()
        for _ in range(max(3, ticks // 4)):
            conn.execute(
                "UPDATE pgtrickle.pgt_stream_tables SET last_refresh_at = last_refresh_at - interval '1 h',"
                " last_attempt_at = last_attempt_at - interval '1 h'"
            )
            t = time.perf_counter()
            report = scheduler.tick()
            no_data.append(time.perf_counter() - t)
            actions |= {o.action.value for o in report.refreshed}
            assert len(report.refreshed) == count, f"{len(report.refreshed)} of {count} refreshed"
    finally:
        scheduler.close()
    print(
        f"  nothing due: {statistics.median(nothing) * 1000:.1f} ms/tick; all due without changes: "
        f"{statistics.median(no_data) * 1000:.0f} ms/tick ({actions})",
        flush=True,
    )
    # The daemon's CPU while idle: nothing due (1h schedules), then 1 s schedules with nothing changing.
    cpu: dict[str, dict[str, float]] = {}
    for label, schedule in (("nothing_due", "1h"), ("schedules_1s", "1s")):
        conn.execute(
            "UPDATE pgtrickle.pgt_stream_tables SET schedule = %s, last_refresh_at = now(),"
            " last_attempt_at = now()",
            (schedule,),
        )
        cpu[label] = daemon_cpu(conn, settings, dsn, cpu_window / 2)
        print(f"  daemon CPU, {label} (share of one core): {cpu[label]}", flush=True)
    return {
        "stream_tables": count,
        "create_s": round(create_s, 2),
        "populate_s": round(populate_s, 2),
        "nothing_due_tick_ms": {
            "median": round(statistics.median(nothing) * 1000, 2),
            "p90": round(sorted(nothing)[int(0.9 * (len(nothing) - 1))] * 1000, 2),
            "samples": [round(x * 1000, 2) for x in nothing],
        },
        "all_due_no_changes_tick_ms": {
            "median": round(statistics.median(no_data) * 1000, 1),
            "per_stream_table_ms": round(statistics.median(no_data) * 1000 / count, 2),
            "samples": [round(x * 1000, 1) for x in no_data],
            "actions": sorted(actions),
        },
        "daemon_cpu_share": cpu,
        "cpu_window_s": round(cpu_window / 2, 1),
    }


def daemon_cpu(conn: psycopg.Connection, settings: Settings, dsn: str, window: float) -> dict[str, float]:
    """CPU seconds per wall second of the daemon (Python process, Spark JVM, PostgreSQL backends)."""
    me = os.getpid()
    jvms = child_jvms(me)
    with daemon(settings.with_overrides(tick_seconds=1.0), dsn):
        time.sleep(3)  # past start-up
        backends = backend_pids(conn)
        history0 = int(scalar(conn, "SELECT count(*) FROM pgtrickle.pgt_refresh_history"))
        before = (cpu_seconds(me), sum(cpu_seconds(p) for p in jvms), sum(cpu_seconds(p) for p in backends))
        wall0 = time.monotonic()
        time.sleep(window)
        wall = time.monotonic() - wall0
        after = (cpu_seconds(me), sum(cpu_seconds(p) for p in jvms), sum(cpu_seconds(p) for p in backends))
        history = int(scalar(conn, "SELECT count(*) FROM pgtrickle.pgt_refresh_history")) - history0
    out = {name: round((a - b) / wall, 4) for name, a, b in zip(("python", "jvm", "postgres"), after, before)}
    out.update(
        {"window_s": round(wall, 1), "jvms": len(jvms), "backends": len(backends), "history_rows": history}
    )
    return out


# ------------------------------------------------------------------ propagation
def build_chain(conn: psycopg.Connection, length: int) -> list[str]:
    conn.execute("DROP TABLE IF EXISTS src_chain")
    conn.execute("CREATE TABLE src_chain (id int PRIMARY KEY, v int)")
    conn.execute("INSERT INTO src_chain SELECT g, g FROM generate_series(1, 1000) g")
    previous, names = "src_chain", []
    for i in range(1, length + 1):
        name = f"c{i:02d}"
        conn.execute(
            "SELECT pgtrickle.create_stream_table(%s, %s, schedule => '1s')",
            (name, f"SELECT id, v FROM {previous}"),
        )
        names.append(name)
        previous = name
    return names


def build_fan(conn: psycopg.Connection, depth: int, width: int) -> list[str]:
    conn.execute("DROP TABLE IF EXISTS src_fan")
    conn.execute("CREATE TABLE src_fan (id int PRIMARY KEY, v int)")
    conn.execute("INSERT INTO src_fan SELECT g, g FROM generate_series(1, 1000) g")
    names = []
    for j in range(1, width + 1):
        previous = "src_fan"
        for level in range(1, depth + 1):
            name = f"f{level}_{j:02d}"
            query = (
                f"SELECT id, v + {j} AS v FROM {previous}" if level == 1 else f"SELECT id, v FROM {previous}"
            )
            conn.execute("SELECT pgtrickle.create_stream_table(%s, %s, schedule => '1s')", (name, query))
            names.append(name)
            previous = name
    return names


def propagation(
    conn: psycopg.Connection,
    settings: Settings,
    dsn: str,
    source: str,
    members: list[str],
    leaves: list[str],
    changes: int,
    label: str,
) -> dict[str, Any]:
    """Commit → every leaf holds the row, ``changes`` times, with the daemon running."""
    leaf_query = " + ".join(f"(SELECT count(*) FROM {leaf} WHERE id = %(id)s)" for leaf in leaves)
    rounds = []
    with daemon(settings.with_overrides(tick_seconds=0.2), dsn):
        wait_for(
            lambda: (
                int(
                    scalar(
                        conn,
                        "SELECT count(*) FROM pgtrickle.pgt_stream_tables"
                        " WHERE pgt_name = ANY(%s) AND frontier IS NOT NULL",
                        (members,),
                    )
                )
                == len(members)
            ),
            600,
            f"{label}: the daemon to populate {len(members)} stream tables",
            0.2,
        )
        time.sleep(2)
        for k in range(changes):
            new_id = 100_000 + k
            conn.execute(f"INSERT INTO {source} VALUES (%s, %s)", (new_id, k))  # autocommit: committed here
            committed = time.monotonic()
            since = scalar(conn, "SELECT clock_timestamp()")
            latency = wait_for(
                lambda: int(scalar(conn, "SELECT " + leaf_query, {"id": new_id})) == len(leaves),
                600,
                f"{label}: row {new_id} to reach the last stream table",
            )
            latency = time.monotonic() - committed
            # Refresh work: the members of a batch share one duration (the batch's), counted once.
            hist = conn.execute(
                "WITH h AS (SELECT h.batch_id, h.spark_jobs, extract(epoch FROM h.end_time - h.start_time) AS d"
                " FROM pgtrickle.pgt_refresh_history h JOIN pgtrickle.pgt_stream_tables s USING (pgt_id)"
                " WHERE s.pgt_name = ANY(%s) AND h.start_time >= %s AND h.action <> 'NO_DATA')"
                " SELECT (SELECT count(*) FROM h),"
                " coalesce((SELECT sum(d) FROM h WHERE batch_id IS NULL), 0)"
                " + coalesce((SELECT sum(m) FROM (SELECT max(d) AS m FROM h WHERE batch_id IS NOT NULL"
                " GROUP BY batch_id) b), 0),"
                " (SELECT coalesce(sum(spark_jobs), 0) FROM h), (SELECT count(DISTINCT batch_id) FROM h)",
                (members, since),
            ).fetchone()
            assert hist is not None
            rounds.append(
                {
                    "latency_s": round(latency, 3),
                    "refreshes": int(hist[0]),
                    "refresh_seconds": round(float(hist[1]), 3),
                    "spark_jobs": int(hist[2]),
                    "batches": int(hist[3]),
                }
            )
            print(
                f"  {label}: change {k + 1}/{changes} reached the last stream table after {latency:.2f}s "
                f"({rounds[-1]['refreshes']} refreshes in {rounds[-1]['batches']} batches, "
                f"{rounds[-1]['spark_jobs']} Spark jobs, {rounds[-1]['refresh_seconds']:.2f}s of refresh work)",
                flush=True,
            )
            time.sleep(1.5)
    lat = [r["latency_s"] for r in rounds]
    return {
        "stream_tables": len(members),
        "leaves": len(leaves),
        "rounds": rounds,
        "latency_median_s": round(statistics.median(lat), 3),
        "latency_max_s": round(max(lat), 3),
        "refresh_seconds_median": round(statistics.median(r["refresh_seconds"] for r in rounds), 3),
        "per_hop_median_s": round(
            statistics.median(lat) / (len(members) if label == "chain" else len(members)), 3
        ),
    }


# ------------------------------------------------------------------ output
def plot(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    idle_ = report["idle"]
    fig, axes = plt.subplots(1, 2 if idle_ else 1, figsize=(9 if idle_ else 5.5, 3.6), squeeze=False)
    axes = axes[0] if idle_ else [None, axes[0][0]]
    if idle_:
        axes[0].bar(
            ["nothing due", "all due,\nno changes"],
            [idle_["nothing_due_tick_ms"]["median"], idle_["all_due_no_changes_tick_ms"]["median"]],
            color=["#2a9d8f", "#e9c46a"],
        )
        axes[0].set_title(f"one tick, {idle_['stream_tables']} stream tables", fontsize=9)
        axes[0].set_ylabel("ms per scheduler tick (median)")
    colors = ["#e76f51", "#2a9d8f", "#264653", "#e9c46a"]
    for k, run in enumerate(report["runs"]):
        for i, key in enumerate(("chain", "fan", "branch")):
            r = run[key]
            x = i + 0.25 * k
            axes[1].scatter(
                [x] * len(r["rounds"]),
                [v["latency_s"] for v in r["rounds"]],
                color=colors[k % 4],
                label=f"{run['parallel']} at once, batch {run.get('batch', 1)}" if i == 0 else None,
            )
    ticks, labels = [0, 1, 2], ["chain of 10", "3×20 fan (60)", "one branch\nof depth 3"]
    axes[1].set_xticks(ticks, labels)
    axes[1].legend(fontsize=8)
    axes[1].set_ylabel("seconds, commit → last stream table")
    axes[1].set_title("propagation latency by max_parallel_refreshes and max_batch_size", fontsize=9)
    axes[1].set_ylim(bottom=0)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def docs_section(report: dict[str, Any], plot_path: Path) -> str:
    title = (
        "Scheduler overhead: idle ticks and DAG propagation"
        if report["idle"]
        else "DAG propagation by max_parallel_refreshes and max_batch_size"
    )
    lines = header_lines(title, report, "benchmarks/scheduler_overhead.py")
    i = report["idle"]
    if i:
        cpu = i["daemon_cpu_share"]
        lines += [
            f"**Idle ticks with {i['stream_tables']} stream tables** (each `SELECT id, v + i FROM src WHERE "
            "id % 100 = i` over a 1000-row source, populated):",
            "",
            *md_table(
                ["measure", "value"],
                [
                    [
                        "one `Scheduler.tick()`, nothing due (schedules `1h`), median / p90",
                        f"{i['nothing_due_tick_ms']['median']:.1f} ms / {i['nothing_due_tick_ms']['p90']:.1f} ms",
                    ],
                    [
                        "one tick, all 100 due, no changes (each refresh `NO_DATA`, no Spark job)",
                        f"{i['all_due_no_changes_tick_ms']['median']:.0f} ms "
                        f"({i['all_due_no_changes_tick_ms']['per_stream_table_ms']:.1f} ms per stream table)",
                    ],
                    *[
                        [
                            f"daemon CPU over {c['window_s']:.0f} s, {label}: Python process / Spark JVM / PostgreSQL "
                            "backends",
                            f"{100 * c['python']:.1f} % / {100 * c['jvm']:.1f} % / {100 * c['postgres']:.1f} % of one core",
                        ]
                        for label, c in (
                            ("nothing due (`1h` schedules, 1 s tick)", cpu["nothing_due"]),
                            (
                                "`1s` schedules, nothing changing (100 `NO_DATA` checks a second)",
                                cpu["schedules_1s"],
                            ),
                        )
                    ],
                ],
            ),
            "",
        ]
    lines += [
        "**DAG propagation** (the daemon running, tick 0.2 s, every schedule `1s`; latency from the commit "
        "of one INSERT into the source until the last stream table holds the row; refresh work = the sum "
        "of the durations of the refreshes that carried it, from the refresh history, a batch once; Spark jobs = the "
        "jobs those refreshes ran, a batch's shared job once), by `max_parallel_refreshes` (at once) and "
        "`max_batch_size` (batch; 1: off):",
        "",
        *md_table(
            [
                "DAG",
                "at once",
                "batch",
                "stream tables",
                "latency median",
                "latency max",
                "refreshes",
                "Spark jobs",
                "refresh work median",
                "latency in mean refresh times",
            ],
            [
                [
                    name,
                    run["parallel"],
                    run.get("batch", 1),
                    r["stream_tables"],
                    f"{r['latency_median_s']:.2f} s",
                    f"{r['latency_max_s']:.2f} s",
                    statistics.median(x["refreshes"] for x in r["rounds"]),
                    statistics.median(x.get("spark_jobs", 0) for x in r["rounds"]),
                    f"{r['refresh_seconds_median']:.2f} s",
                    f"{r['latency_median_s'] / (r['refresh_seconds_median'] / r['stream_tables']):.1f}",
                ]
                for run in report["runs"]
                for name, r in (
                    ("chain of 10", run["chain"]),
                    ("3×20 fan (20 branches, depth 3)", run["fan"]),
                    ("one branch of depth 3", run["branch"]),
                )
            ],
            right_from=1,
        ),
        "",
        f"![scheduler overhead](img/{plot_path.name})",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stream-tables", type=int, default=100)
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--cpu-seconds", type=float, default=30.0)
    parser.add_argument("--changes", type=int, default=5)
    parser.add_argument(
        "--parallel",
        default=f"1,{default_parallel_refreshes()}",
        help="max_parallel_refreshes values to measure propagation with, comma-separated",
    )
    parser.add_argument(
        "--batch",
        default="1,32",
        help="max_batch_size values to measure propagation with, comma-separated (1: off)",
    )
    parser.add_argument("--skip-idle", action="store_true", help="measure propagation only")
    add_output_args(parser, SECTION, PLOT)
    args = parser.parse_args(argv)
    stop_on_signals()
    parallels = [int(p) for p in args.parallel.split(",") if p.strip()]
    sizes = [int(b) for b in args.batch.split(",") if b.strip()]
    settings = Settings.from_env().with_overrides(dsn=args.dsn, spark_master=args.spark_master)
    admin_dsn = resolve_dsn(settings)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        host = machine(conn)
    db = f"pgtrickle_bench_sched_{os.getpid()}"
    recreate_database(admin_dsn, db)
    dsn = bench_dsn(admin_dsn, db)
    run_settings = settings.with_overrides(dsn=dsn)
    try:
        with spark_running(run_settings) as spark_start, psycopg.connect(dsn, autocommit=True) as conn:
            install(conn)
            idle_: dict[str, Any] = {}
            if not args.skip_idle:
                print(f"== idle ticks with {args.stream_tables} stream tables", flush=True)
                idle_ = idle(conn, run_settings, dsn, args.stream_tables, args.ticks, args.cpu_seconds)
            runs = []
            for parallel, size in [(p, b) for p in parallels for b in sizes]:
                at_once = run_settings.with_overrides(max_parallel_refreshes=parallel, max_batch_size=size)
                run: dict[str, Any] = {"parallel": parallel, "batch": size}
                for key, label, build, source in (
                    ("chain", "chain of 10", lambda: build_chain(conn, 10), "src_chain"),
                    ("fan", "3×20 fan", lambda: build_fan(conn, 3, 20), "src_fan"),
                    ("branch", "one branch of depth 3", lambda: build_fan(conn, 3, 1), "src_fan"),
                ):
                    conn.execute(
                        "SELECT pgtrickle.drop_stream_table(name) FROM pgtrickle.stream_tables_info"
                        " ORDER BY pgt_id DESC"
                    )
                    print(f"== {label}, max_parallel_refreshes {parallel}, max_batch_size {size}", flush=True)
                    names = build()
                    leaves = [names[-1]] if key == "chain" else [n for n in names if n.startswith("f3_")]
                    run[key] = propagation(
                        conn,
                        at_once,
                        dsn,
                        source,
                        names,
                        leaves,
                        args.changes,
                        f"{key} ({parallel} at once, batch {size})",
                    )
                runs.append(run)
    finally:
        drop_database(admin_dsn, db)
    report = {
        "command": command_line("benchmarks/scheduler_overhead.py", argv),
        "date": now_text(),
        "preset": args.preset,
        "machine": host,
        "revision": revision(),
        "spark_master": settings.spark_master,
        "spark_startup_s": round(spark_start, 2),
        "idle": idle_,
        "runs": runs,
    }
    write_json(report, args.json, "scheduler")
    if not args.no_docs:
        plot(report, args.plot)
        write_section(args.section, docs_section(report, args.plot))
        print(f"{DOCS.name} section {args.section} and {args.plot.name} updated", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
