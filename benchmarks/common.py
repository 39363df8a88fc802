"""Pieces every benchmark script shares: databases, the machine, Spark, docs sections, formatting.

Kept small and dependency-free beyond what pgtrickle already needs, so each
benchmark script stays runnable on its own (``python benchmarks/x.py``) and
from ``benchmarks/suite.py``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "BENCHMARKS.md"
IMG = ROOT / "docs" / "img"
RESULTS = ROOT / "benchmarks" / "results"

if str(ROOT / "src") not in sys.path:  # runnable without an editable install too
    sys.path.insert(0, str(ROOT / "src"))


# ------------------------------------------------------------------ databases
def bench_dsn(admin_dsn: str, db: str) -> str:
    """The admin DSN pointed at database ``db``."""
    return make_conninfo(admin_dsn, dbname=db)


def database_exists(admin_dsn: str, db: str) -> bool:
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        return admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,)).fetchone() is not None


def drop_database(admin_dsn: str, db: str) -> None:
    """Drop ``db`` and any replication slot in it (a slot keeps a database alive)."""
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        for slot, pid in admin.execute(
            "SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s", (db,)
        ).fetchall():
            if pid is not None:
                admin.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))
            admin.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))


def recreate_database(admin_dsn: str, db: str, template: str | None = None) -> float:
    """(Re)create ``db``, optionally as a file copy of ``template``; returns seconds."""
    drop_database(admin_dsn, db)
    started = time.monotonic()
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        if template:
            admin.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                    sql.Identifier(db), sql.Identifier(template)
                )
            )
        else:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
    return time.monotonic() - started


def scalar(conn: psycopg.Connection, query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


def free_disk_gib(path: Path) -> float:
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free / 2**30


# ------------------------------------------------------------------ the machine
def revision() -> str:
    """The git commit of the code measured, with ``+dirty`` when src/ has uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "src"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _java_version() -> str:
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=20).stderr
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    match = re.search(r'version "([^"]+)"', out)
    return match.group(1) if match else "unknown"


def load_average() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:
        return (0.0, 0.0, 0.0)


def machine(conn: psycopg.Connection | None = None) -> dict[str, Any]:
    """nproc, RAM, OS and the versions of everything measured; the load average right now."""
    mem_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    versions: dict[str, str] = {"python": platform.python_version(), "java": _java_version()}
    for module in ("pyspark", "psycopg", "sqlglot"):
        try:
            versions[module] = __import__(module).__version__
        except Exception:
            versions[module] = "unknown"
    if conn is not None:
        versions["postgresql"] = str(scalar(conn, "SHOW server_version"))
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "versions": versions,
        "load_average": [round(x, 2) for x in load_average()],
    }


def machine_line(m: dict[str, Any]) -> str:
    v = m.get("versions", {})
    parts = [f"{m['cpus']} CPUs", f"{m['memory_gib']} GiB RAM", m["platform"]]
    names = [("postgresql", "PostgreSQL"), ("pyspark", "PySpark"), ("java", "Java"), ("python", "Python")]
    parts += [f"{label} {v[key]}" for key, label in names if key in v]
    load = m.get("load_average")
    if load:
        parts.append(f"load average at start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1/5/15 min)")
    return ", ".join(parts)


def other_work_note(m: dict[str, Any]) -> str:
    """A sentence saying whether the machine was shared during the run (judged by the load average)."""
    cpus = m.get("cpus") or 1
    load = (m.get("load_average") or [0.0])[0]
    if load >= 0.5 * cpus:
        return (
            f"**Other work was running on the machine** (1-min load {load:.2f} on {cpus} CPUs at the start): "
            "treat absolute seconds as indicative; ratios within one round are the result."
        )
    return f"The machine was quiet at the start (1-min load {load:.2f} on {cpus} CPUs)."


def now_text() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def stamp() -> str:
    return dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def command_line(script: str, argv: Sequence[str] | None) -> str:
    given = sys.argv[1:] if argv is None else list(argv)
    return " ".join([".venv/bin/python", script, *given]).strip()


# ------------------------------------------------------------------ Spark
@contextmanager
def spark_running(settings: Any) -> Iterator[float]:
    """Start pgtrickle's SparkSession (yielding its start-up seconds) and stop it at the end."""
    from pgtrickle.spark import session as spark_session

    started = time.monotonic()
    spark_session.get_spark(settings)
    try:
        yield time.monotonic() - started
    finally:
        spark_session.stop_spark()


def bench_start(args: Any) -> tuple[Any, str, dict[str, Any]]:
    """A benchmark's start: SIGTERM / SIGHUP unwind, the settings (``--dsn``, ``--spark-master``),
    the server's admin DSN and the machine's description. Returns (settings, admin DSN, machine)."""
    from pgtrickle.config import Settings
    from pgtrickle.db.connection import resolve_dsn

    stop_on_signals()
    settings = Settings.from_env().with_overrides(dsn=args.dsn, spark_master=args.spark_master)
    admin_dsn = resolve_dsn(settings)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        return settings, admin_dsn, machine(conn)


def run_in_own_database(
    args: Any, name: str, script: str, argv: Sequence[str] | None, run: Any
) -> tuple[dict[str, Any], Any, Any]:
    """The frame of a benchmark over a database of its own: create it, start Spark, call
    ``run(settings, dsn, args)`` (→ results, problems), stop Spark, drop the database. Returns the
    report's header (command, date, machine, revision, ...), the results and the problems."""
    settings, admin_dsn, host = bench_start(args)
    db = f"pgtrickle_bench_{name}_{os.getpid()}"
    recreate_database(admin_dsn, db)
    try:
        with spark_running(settings) as spark_start:
            print(f"SparkSession start-up: {spark_start:.2f}s", flush=True)
            results, problems = run(settings, bench_dsn(admin_dsn, db), args)
    finally:
        drop_database(admin_dsn, db)
    header = {
        "command": command_line(script, argv),
        "date": now_text(),
        "preset": args.preset,
        "machine": host,
        "revision": revision(),
        "spark_master": settings.spark_master,
    }
    return header, results, problems


def stop_on_signals() -> None:
    """SIGTERM / SIGHUP unwind (so benchmark databases are dropped and Spark stopped)."""

    def handler(signum: int, _frame: object) -> None:
        raise SystemExit(f"stopped by signal {signal.Signals(signum).name}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


# ------------------------------------------------------------------ output
def markers(section: str) -> tuple[str, str]:
    return f"<!-- {section}:begin -->", f"<!-- {section}:end -->"


def write_section(section: str, body: str, docs: Path = DOCS) -> None:
    """Replace the text between ``<!-- section:begin -->`` and ``<!-- section:end -->`` (append if absent).

    Everything outside the markers (hand-written prose) is kept.
    """
    begin, end = markers(section)
    block = f"{begin}\n{body.strip()}\n{end}"
    text = docs.read_text() if docs.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        text = head + block + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    docs.write_text(text)


def header_lines(title: str, report: dict[str, Any], script: str) -> list[str]:
    """The common head of a generated section: title, preset, command, date, machine, revision."""
    m = report["machine"]
    preset = report.get("preset")
    label = f" — preset `{preset}`" if preset else ""
    lines = [f"## {title}{label}", "", "```sh", report["command"], "```", ""]
    lines.append(
        f"Run {report['date']} on pgtrickle `{report['revision']}`; generated by `{script}` "
        "(this section is rewritten by it). Machine: " + machine_line(m) + "."
    )
    if report.get("spark_master"):
        lines[-1] += f" Spark `{report['spark_master']}`."
    lines += ["", other_work_note(m), ""]
    return lines


def write_json(report: dict[str, Any], path: Path | None, default_name: str) -> Path:
    path = path or RESULTS / f"{default_name}-{stamp()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str))
    print(f"figures written to {path}", flush=True)
    return path


def publish(
    report: dict[str, Any],
    args: Any,
    name: str,
    title: str,
    intro: str,
    lines: list[str],
    problems: list[str],
) -> int:
    """Print ``lines`` (the result table), write the JSON and (unless ``--no-docs``) the docs
    section ``args.section`` (``title``, the run's header, ``intro``, ``lines``); print the problems.
    The exit code: 1 when there is a problem."""
    print("\n".join(lines))
    write_json(report, args.json, name)
    if not args.no_docs:
        body = header_lines(title, report, f"benchmarks/{name}.py")
        write_section(args.section, "\n".join([*body, intro, "", *lines]))
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    return 1 if problems else 0


def create_differential(conn: psycopg.Connection, name: str, query: str) -> None:
    """``name`` as a DIFFERENTIAL stream table of ``query``, not populated, without a circuit breaker
    (a benchmark's changes are its workload, not an anomaly): its first refresh populates it."""
    conn.execute(
        "SELECT pgtrickle.create_stream_table(%s, %s, schedule => '24h',"
        " refresh_mode => 'DIFFERENTIAL', initialize => false)",
        (name, query),
    )
    conn.execute("SELECT pgtrickle.alter_stream_table(%s, circuit_breaker => 'none')", (name,))


def median_rows(seconds: dict[str, dict[str, list[float]]], first: str, second: str) -> list[list[Any]]:
    """An A/B's table rows: per query (upper-cased), the medians of ``first`` and ``second`` and
    their ratio second/first; a query without timings on both sides is left out."""
    rows = []
    for name, by in seconds.items():
        if by.get(first) and by.get(second):
            a, b = statistics.median(by[first]), statistics.median(by[second])
            rows.append([name.upper(), f"{a:.3f}", f"{b:.3f}", f"{b / a:.2f}"])
    return rows


def fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "–"
    if ratio < 0.1:
        return f"×{ratio:.3f}"
    return f"×{ratio:.2f}" if ratio < 1 else f"×{ratio:.1f}"


def fmt_size(size: int) -> str:
    if size >= 1_000_000:
        return f"{size / 1e6:g}M"
    return f"{size / 1e3:g}k" if size >= 1000 else str(size)


def fmt_rate(rate: float) -> str:
    return f"{rate * 100:g} %"


def md_table(head: Sequence[str], rows: Sequence[Sequence[Any]], right_from: int = 1) -> list[str]:
    align = ["---" if i < right_from else "---:" for i in range(len(head))]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def pyplot():  # type: ignore[no-untyped-def]
    """matplotlib.pyplot on the Agg backend (the ``bench`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def add_output_args(parser, section: str, plot: Path, spark_master: bool = True) -> None:  # type: ignore[no-untyped-def]
    """The flags every benchmark piece shares: where the server is, where figures, docs and plot go."""
    parser.add_argument("--dsn", default=None)
    if spark_master:
        parser.add_argument("--spark-master", default="local[*]")
    parser.add_argument("--json", type=Path, default=None, help="where to write the figures")
    parser.add_argument("--no-docs", action="store_true", help="leave docs/BENCHMARKS.md and the plot alone")
    parser.add_argument(
        "--section",
        default=section,
        help="the docs/BENCHMARKS.md section to write (between its begin/end markers)",
    )
    parser.add_argument("--plot", type=Path, default=plot, help="where to draw the plot")
    parser.add_argument("--preset", default=None, help="the suite preset this run belongs to (a label)")
