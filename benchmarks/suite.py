"""The benchmark suite, one command: every benchmark at a size preset, results in docs/BENCHMARKS.md.

    .venv/bin/python benchmarks/suite.py --preset quick|standard|full [--only tpch,scheduler] [--skip cdc]
        [--dry-run] [--dsn ...]
    make bench PRESET=standard

Pieces (each a script in benchmarks/ that can also run alone):

============  =====================================================================================
differential  DIFFERENTIAL vs pgtrickle FULL vs REFRESH MATERIALIZED VIEW vs a plain PySpark job,
              per query shape, size and number of changes (``differential.py``)
tpch          the 22 TPC-H-derived queries as DIFFERENTIAL stream tables under sustained changes:
              DIFF/FULL per query, oracle after every round (``tpch.py``)
tpch-char     which of them are accepted with TPC-H's own ``char(n)`` column types (``tpch.py
              --char-columns --rounds 0``)
cdc           write overhead of change capture and WAL decoder throughput (``cdc_overhead.py``)
scheduler     idle ticks with 100 stream tables, daemon CPU, propagation through a chain of 10 and a
              3×20 fan (``scheduler_overhead.py``)
cluster       a large FULL refresh on ``local[2]`` vs ``local-cluster[2,1,1024]`` (``cluster_full.py``)
============  =====================================================================================

Each piece runs in its own process (its own SparkSession), writes its JSON under
``benchmarks/results/suite-<preset>-<timestamp>/`` and its own generated section of docs/BENCHMARKS.md
(markers ``<!-- suite-<piece>:begin/end -->``; the hand-written prose around them is kept), labelled
with the preset, date, machine and the exact command. The suite then writes the ``suite-summary``
section: headline ratios of this run, and which pieces failed. Events datasets (``datasets.py``) and
TPC-H datasets are built once and cached in named databases, so a second run skips the loading.

Presets: ``quick`` (minutes; proves every piece works), ``standard`` (1M and 10M rows, TPC-H SF 0.1;
about an hour on 2 cores), ``full`` (adds 100M rows, TPC-H SF 1; several hours, ~60 GiB of disk —
see ``--dry-run``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    RESULTS,
    ROOT,
    fmt_ratio,
    fmt_size,
    free_disk_gib,
    machine,
    machine_line,
    md_table,
    now_text,
    other_work_note,
    revision,
    stamp,
    write_section,
)
from datasets import estimate  # noqa: E402

PIECES = ("differential", "tpch", "tpch-char", "cdc", "scheduler", "cluster")

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "quick": {
        "differential": {
            "sizes": [100_000],
            "changes": [100, 1_000],
            "repeat": 1,
            "queries": ["scan", "filter", "aggregate", "join", "join_aggregate"],
        },
        "tpch": {"sf": 0.01, "rounds": 2},
        "tpch-char": {"sf": 0.01},
        "cdc": {"rows": 50_000, "repeat": 1},
        "scheduler": {"ticks": 10, "cpu_seconds": 15, "changes": 3},
        "cluster": {"rows": 1_000_000, "repeat": 1},
    },
    "standard": {
        "differential": {
            "sizes": [1_000_000, 10_000_000],
            "changes": [1_000, 10_000, 100_000],
            "repeat": 3,
            "queries": ["scan", "filter", "aggregate", "join", "join_aggregate"],
        },
        "tpch": {"sf": 0.1, "rounds": 3},
        "tpch-char": {"sf": 0.01},
        "cdc": {"rows": 200_000, "repeat": 3},
        "scheduler": {"ticks": 20, "cpu_seconds": 30, "changes": 5},
        "cluster": {"rows": 10_000_000, "repeat": 3},
    },
    "full": {
        # scan and join keep a full copy of events per contender (four 100M-row tables each): left out
        # at 100M; run them at 1M/10M with the standard preset.
        "differential": {
            "sizes": [1_000_000, 10_000_000, 100_000_000],
            "changes": [10_000, 100_000],
            "repeat": 3,
            "queries": ["filter", "aggregate", "join_aggregate"],
        },
        "tpch": {"sf": 1.0, "rounds": 3},
        "tpch-char": {"sf": 0.01},
        "cdc": {"rows": 1_000_000, "repeat": 3},
        "scheduler": {"ticks": 20, "cpu_seconds": 60, "changes": 5},
        "cluster": {"rows": 100_000_000, "repeat": 2},
    },
}

# Seconds per million source rows, measured at 10M rows on the 2-core machine (docs/BENCHMARKS.md, the
# differential section of 2026-11-26), for --dry-run estimates: FULL refresh through Spark, matview.
FULL_S_PER_MROW = {"scan": 3.6, "filter": 1.0, "aggregate": 0.5, "join": 4.5, "join_aggregate": 0.8}
MATVIEW_S_PER_MROW = {"scan": 0.7, "filter": 0.25, "aggregate": 0.12, "join": 0.9, "join_aggregate": 0.18}
PYSPARK_OVER_FULL = 0.8
DIFF_S_PER_CHANGE = 30e-6  # join-shaped 100k changes ≈ 3–7 s; aggregates less


def commands(preset: str, out: Path) -> dict[str, list[str]]:
    p = PRESETS[preset]
    py = sys.executable
    common = ["--preset", preset]
    d, t, tc, c, s, k = (p[x] for x in PIECES)
    return {
        "differential": [
            py,
            "benchmarks/differential.py",
            "--sizes",
            ",".join(map(str, d["sizes"])),
            "--changes",
            ",".join(map(str, d["changes"])),
            "--repeat",
            str(d["repeat"]),
            "--queries",
            ",".join(d["queries"]),
            "--section",
            "suite-differential",
            "--plot",
            "docs/img/suite-differential.png",
            "--json",
            str(out / "differential.json"),
            *common,
        ],
        "tpch": [
            py,
            "benchmarks/tpch.py",
            "--sf",
            f"{t['sf']:g}",
            "--rounds",
            str(t["rounds"]),
            "--section",
            "suite-tpch",
            "--plot",
            "docs/img/suite-tpch.png",
            "--json",
            str(out / "tpch.json"),
            *common,
        ],
        "tpch-char": [
            py,
            "benchmarks/tpch.py",
            "--sf",
            f"{tc['sf']:g}",
            "--rounds",
            "0",
            "--char-columns",
            "--section",
            "suite-tpch-char",
            "--json",
            str(out / "tpch-char.json"),
            *common,
        ],
        "cdc": [
            py,
            "benchmarks/cdc_overhead.py",
            "--rows",
            str(c["rows"]),
            "--repeat",
            str(c["repeat"]),
            "--section",
            "suite-cdc",
            "--json",
            str(out / "cdc.json"),
            *common,
        ],
        "scheduler": [
            py,
            "benchmarks/scheduler_overhead.py",
            "--ticks",
            str(s["ticks"]),
            "--cpu-seconds",
            str(s["cpu_seconds"]),
            "--changes",
            str(s["changes"]),
            "--section",
            "suite-scheduler",
            "--plot",
            "docs/img/suite-scheduler.png",
            "--json",
            str(out / "scheduler.json"),
            *common,
        ],
        "cluster": [
            py,
            "benchmarks/cluster_full.py",
            "--rows",
            str(k["rows"]),
            "--repeat",
            str(k["repeat"]),
            "--section",
            "suite-cluster",
            "--plot",
            "docs/img/suite-cluster.png",
            "--json",
            str(out / "cluster.json"),
            *common,
        ],
    }


def estimates(preset: str) -> list[str]:
    """Rough time and disk of each piece of a preset (from the 10M-row measurements; linear in rows)."""
    p = PRESETS[preset]
    lines = []
    d = p["differential"]
    total_s, disk = 0.0, 0.0
    for size in d["sizes"]:
        e = estimate(size)
        mrows = size / 1e6
        per_round = sum(
            FULL_S_PER_MROW[q] * mrows * (1 + PYSPARK_OVER_FULL) + MATVIEW_S_PER_MROW[q] * mrows
            for q in d["queries"]
        )
        rounds = 1 + d["repeat"] * len(d["changes"])
        diff = sum(DIFF_S_PER_CHANGE * c * d["repeat"] * len(d["queries"]) for c in d["changes"])
        initial = sum(2 * FULL_S_PER_MROW[q] * mrows + MATVIEW_S_PER_MROW[q] * mrows for q in d["queries"])
        verify = sum(MATVIEW_S_PER_MROW[q] * mrows * 6 for q in d["queries"])
        seconds = e["build_s"] + 0.2 * mrows + initial + rounds * per_round + diff + verify
        results = (
            sum({"scan": 70, "filter": 16, "join": 80}.get(q, 0) * 4 * size for q in d["queries"]) / 2**30
        )
        total_s += seconds
        disk = max(disk, 2 * e["disk_gib"] + results)
        lines.append(
            f"differential {fmt_size(size)}: ~{seconds / 60:.0f} min (of which building the cached "
            f"dataset once ~{e['build_s'] / 60:.0f} min), disk ~{2 * e['disk_gib'] + results:.0f} GiB "
            "(cached dataset + run copy + results)"
        )
    k = p["cluster"]
    mrows = k["rows"] / 1e6
    cluster_s = 2 * (k["repeat"] + 1) * (FULL_S_PER_MROW["aggregate"] + FULL_S_PER_MROW["join"]) * mrows * 1.3
    lines.append(f"cluster {fmt_size(k['rows'])}: ~{cluster_s / 60:.0f} min (both masters, aggregate + join)")
    t = p["tpch"]
    # creation (two stream tables per accepted query, initial refreshes) and warm-up + rounds; quick preset
    # measured 13.5 min at SF 0.01 with the machine loaded (load 12), ~6 min expected when quiet
    tpch_s = 120 + 1500 * t["sf"] + (t["rounds"] + 1) * (60 + 500 * t["sf"])
    lines.append(
        f"tpch SF {t['sf']:g}: ~{tpch_s / 60:.0f} min (generation ~{(10 + 110 * t['sf']) / 60:.0f} min once)"
    )
    lines.append(
        f"cdc {p['cdc']['rows']:,} rows: ~{(60 + p['cdc']['rows'] * p['cdc']['repeat'] * 60e-6) / 60:.0f} min"
    )
    lines.append(
        f"scheduler: ~{(120 + p['scheduler']['cpu_seconds'] + 40 * p['scheduler']['changes']) / 60:.0f} min"
    )
    total_s += cluster_s + tpch_s + 180 + p["scheduler"]["cpu_seconds"]
    lines.append(f"total: ~{total_s / 3600:.1f} h; peak disk ~{disk:.0f} GiB")
    return lines


def run_piece(name: str, cmd: list[str], log: Path) -> tuple[int, float]:
    print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
    started = time.monotonic()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            if "WARN" not in line and "log4j" not in line and "setLogLevel" not in line:
                print("  " + line.rstrip(), flush=True)
        code = proc.wait()
    seconds = time.monotonic() - started
    print(f"=== {name}: exit {code} after {seconds / 60:.1f} min (log {log})", flush=True)
    return code, seconds


def load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def propagation_headline(report: dict[str, Any]) -> str:
    """The DAG propagation of a ``scheduler_overhead.py`` report, at its most parallel and batched
    setting (its runs are one per ``max_parallel_refreshes`` × ``max_batch_size``; a report of
    before those settings has one run at its top level)."""
    runs = report.get("runs") or [{"parallel": None, "batch": None, **report}]
    run = max(runs, key=lambda r: (r.get("parallel") or 0, r.get("batch") or 0))
    setting = "" if run["parallel"] is None else f" ({run['parallel']} at once, batch {run['batch']})"
    text = (
        f"propagation{setting}: chain of 10 {run['chain']['latency_median_s']:.2f} s, 3×20 fan "
        f"{run['fan']['latency_median_s']:.2f} s"
    )
    if "branch" in run:
        branch = run["branch"]["latency_median_s"]
        text += f", one branch of depth 3 {branch:.2f} s (fan ×{run['fan']['latency_median_s'] / branch:.1f})"
    return text


def headlines(out: Path) -> list[str]:
    """The headline ratios of this run, one bullet each, from the pieces' JSON."""
    lines: list[str] = []
    d = load(out / "differential.json")
    if d:
        rows = [r for run in d["runs"] for r in run["rows"]]
        big = max(r["size"] for r in rows)
        few = min(r["changes"] for r in rows if r["size"] == big)
        for r in rows:
            if r["size"] == big and r["changes"] == few:
                pys = (
                    f", plain PySpark job ×{r['pyspark_over_diff']:.1f}" if r.get("pyspark_over_diff") else ""
                )
                lines.append(
                    f"differential, {fmt_size(big)} rows, {few:,} changes, **{r['shape']}**: DIFF "
                    f"{r['diff_s']:.2f} s — FULL ×{r['full_over_diff']:.1f}, REFRESH MATERIALIZED VIEW "
                    f"{fmt_ratio(r['matview_over_diff'])}{pys} (time of the other / DIFF)"
                )
        for t in d.get("targets", []):
            if t["value"] is not None:
                lines.append(f"target — {t['target']}: {fmt_ratio(t['value'])} ({t['status']})")
    t = load(out / "tpch.json")
    if t:
        ratios = {q: s["full_over_diff"] for q, s in t["summary"].items() if s.get("full_over_diff")}
        ahead = sorted(q.upper() for q, v in ratios.items() if v >= 1)
        behind = sorted(q.upper() for q, v in ratios.items() if v < 1)
        lines.append(
            f"TPC-H SF {t['sf']:g}: {len(t['accepted'])} of 22 queries accepted as DIFFERENTIAL; "
            f"DIFF faster than FULL for {', '.join(ahead) or 'none'}"
            + (f"; not ahead: {', '.join(behind)}" if behind else "")
            + (
                f"; FULL/DIFF from ×{min(ratios.values()):.2f} to ×{max(ratios.values()):.1f}"
                if ratios
                else ""
            )
            + (f"; **{len(t['problems'])} problem(s)**" if t["problems"] else "; oracle clean")
        )
    tc = load(out / "tpch-char.json")
    if tc:
        lines.append(
            f"TPC-H with the specification's `char(n)` columns: {len(tc['accepted'])} of 22 accepted"
        )
    c = load(out / "cdc.json")
    if c:
        v = c["variants"]
        lines.append(
            f"CDC, {c['rows']:,}-row INSERT: statement trigger ×{v['statement_trigger']['insert']['ratio_to_none']:.2f}"
            f" of no capture ({v['statement_trigger']['insert']['overhead_us_per_row']:+.2f} µs/row), row "
            f"trigger ×{v['row_trigger']['insert']['ratio_to_none']:.2f}, WAL ×{v['wal']['insert']['ratio_to_none']:.2f}; "
            f"decoder {v['wal']['insert']['decoder_changes_per_s']:,} changes/s"
        )
    s = load(out / "scheduler.json")
    if s:
        i = s["idle"]
        lines.append(
            f"scheduler, {i['stream_tables']} stream tables: idle tick {i['nothing_due_tick_ms']['median']:.1f} ms; "
            f"all due without changes {i['all_due_no_changes_tick_ms']['per_stream_table_ms']:.1f} ms per "
            f"stream table; daemon CPU with nothing due {100 * i['daemon_cpu_share']['nothing_due']['python']:.1f} % "
            f"(Python) + {100 * i['daemon_cpu_share']['nothing_due']['jvm']:.1f} % (JVM) of a core, on 1 s "
            f"schedules {100 * i['daemon_cpu_share']['schedules_1s']['python']:.1f} % + "
            f"{100 * i['daemon_cpu_share']['schedules_1s']['jvm']:.1f} %; {propagation_headline(s)}"
        )
    k = load(out / "cluster.json")
    if k:
        for q, v in k["summary"].items():
            lines.append(
                f"FULL refresh of {fmt_size(k['rows'])} rows, {q}: local-cluster[2,1,1024] / local[2] "
                f"×{v['cluster_over_local']:.2f}"
            )
    return lines


def summary_section(
    preset: str, command: str, host: dict[str, Any], out: Path, status: dict[str, Any]
) -> str:
    lines = [
        f"## Suite summary — preset `{preset}`",
        "",
        "```sh",
        command,
        "```",
        "",
        f"Run {now_text()} on pgtrickle `{revision()}`; generated by `benchmarks/suite.py`. Machine: "
        + machine_line(host)
        + ".",
        "",
        other_work_note(host),
        "",
        *md_table(
            ["piece", "status", "minutes"],
            [
                [name, "ok" if s["exit"] == 0 else f"**exit {s['exit']}**", f"{s['seconds'] / 60:.1f}"]
                for name, s in status.items()
            ],
        ),
        "",
        "Headline ratios of this run (details in the sections below; JSON in "
        f"`benchmarks/results/{out.name}/`):",
        "",
    ]
    lines += [f"- {h}" for h in headlines(out)] or ["- (no results)"]
    return "\n".join(lines)


def machine_with_server() -> dict[str, Any]:
    """The machine, with the PostgreSQL version when the server can be reached."""
    try:
        import psycopg

        from pgtrickle.config import Settings
        from pgtrickle.db.connection import resolve_dsn

        with psycopg.connect(resolve_dsn(Settings.from_env()), autocommit=True) as conn:
            return machine(conn)
    except Exception:  # noqa: BLE001 - informational only
        return machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    parser.add_argument("--only", default="", help="comma-separated pieces: " + ", ".join(PIECES))
    parser.add_argument("--skip", default="", help="comma-separated pieces to leave out")
    parser.add_argument("--dsn", default=None)
    parser.add_argument(
        "--dry-run", action="store_true", help="print the commands and estimates, run nothing"
    )
    parser.add_argument(
        "--into",
        type=Path,
        default=None,
        help="an earlier run's results directory (same preset): (re-)run the chosen pieces into it "
        "and rewrite the summary from all of its pieces",
    )
    args = parser.parse_args(argv)
    only = [p for p in args.only.split(",") if p] or list(PIECES)
    skip = {p for p in args.skip.split(",") if p}
    unknown = [p for p in [*only, *skip] if p not in PIECES]
    if unknown:
        parser.error(f"unknown pieces {unknown}; choose from {', '.join(PIECES)}")
    pieces = [p for p in PIECES if p in only and p not in skip]
    out = (ROOT / args.into).resolve() if args.into else RESULTS / f"suite-{args.preset}-{stamp()}"
    cmds = commands(args.preset, out.relative_to(ROOT))
    if args.dsn:  # to the pieces through the environment: a DSN may hold a password, argv is visible in ps
        os.environ["PGTRICKLE_DSN"] = args.dsn
    given = sys.argv[1:] if argv is None else list(argv)
    command = " ".join([".venv/bin/python benchmarks/suite.py", *given])
    print(f"preset {args.preset}: " + ", ".join(pieces))
    for line in estimates(args.preset):
        print(f"  estimate: {line}")
    print(f"  free disk: {free_disk_gib(Path('/var/lib')):.0f} GiB")
    if args.dry_run:
        for name in pieces:
            print(f"{name}: {' '.join(cmds[name][1:])}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    host = machine_with_server()
    status: dict[str, Any] = {}
    earlier = load(out / "suite.json") if args.into else None
    if earlier:
        if earlier["preset"] != args.preset:
            parser.error(f"{out} holds a {earlier['preset']} run, not {args.preset}")
        status = {k: v for k, v in earlier["pieces"].items() if k not in pieces}
        command = earlier["command"] + " && " + command
    for name in pieces:
        code, seconds = run_piece(name, cmds[name], out / f"{name}.log")
        status[name] = {"exit": code, "seconds": round(seconds, 1), "command": " ".join(cmds[name])}
    status = {k: status[k] for k in PIECES if k in status}
    (out / "suite.json").write_text(
        json.dumps(
            {
                "preset": args.preset,
                "command": command,
                "machine": host,
                "revision": revision(),
                "pieces": status,
            },
            indent=2,
        )
    )
    write_section("suite-summary", summary_section(args.preset, command, host, out, status))
    print("\n" + "\n".join(f"- {h}" for h in headlines(out)))
    failed = [n for n, s in status.items() if s["exit"] != 0]
    if failed:
        print(f"pieces that failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
