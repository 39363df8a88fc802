"""Whole-stage code generation for lone DIFFERENTIAL refreshes: pgtrickle's choice against always on.

``refresh.spark_job.lone_compiles`` turns Spark's whole-stage code generation off for a refresh whose
plan is computed in parts (hidden state tables' changes or sub-plans first, then one action) and reads
under a million rows whole. This benchmark measures that choice on the TPC-H queries, side by side in
one process: each query is created once as a DIFFERENTIAL stream table over the cached TPC-H dataset
(``benchmarks/tpch.py``'s, copied for the run); then ``--rounds`` rounds (after a warm-up) of, for each
variant in turn (the order alternating from round to round): one transaction of TPC-H-like changes
(``tpch_data.apply_changes``), then every query refreshed alone. ``always`` runs with code generation
on for every plan (``lone_compiles`` replaced by ``True`` in this process), ``choice`` as pgtrickle
ships. Every refresh must be DIFFERENTIAL and every stream table equal to its query (oracle) after
each round. Medians per query and variant; the ratio choice/always (< 1: the choice is faster).

    .venv/bin/python benchmarks/codegen_ab.py [--sf 1] [--rounds 4] [--queries q03,q13,...]
        [--json PATH] [--no-docs]

Writes JSON (default benchmarks/results/codegen-<timestamp>.json) and, unless --no-docs, the
``codegen`` section of docs/BENCHMARKS.md. Exits 1 when a refresh was not DIFFERENTIAL or a stream
table differs from its query.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
import tpch_data
from common import (
    add_output_args,
    bench_dsn,
    bench_start,
    command_line,
    create_differential,
    drop_database,
    header_lines,
    md_table,
    median_rows,
    now_text,
    recreate_database,
    revision,
    spark_running,
    write_json,
    write_section,
)
from tpch import ensure_dataset, tpch_db

from pgtrickle.catalog.install import install
from pgtrickle.config import Settings
from pgtrickle.daemon.manual import refresh_sync
from pgtrickle.refresh import differential
from pgtrickle.refresh.verify import verify

SECTION = "codegen"
VARIANTS = ("always", "choice")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sf", type=float, default=1.0, help="TPC-H scale factor")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--queries", default="", help="comma-separated subset (default all 22)")
    add_output_args(p, SECTION, Path("unused.png"))
    return p.parse_args(argv)


def refresh_as(variant: str, settings: Settings, dsn: str, name: str) -> tuple[float, str]:
    """Refresh ``name`` alone under ``variant``: seconds and the action that ran."""
    real = differential.lone_compiles
    if variant == "always":
        differential.lone_compiles = lambda *_a, **_k: True  # type: ignore[assignment] # the A side of the A/B
    try:
        started = time.perf_counter()
        [outcome] = refresh_sync(settings, dsn, [name])
        return time.perf_counter() - started, outcome.action.value
    finally:
        differential.lone_compiles = real  # type: ignore[assignment]


def run(args: argparse.Namespace, settings: Settings, dsn: str, queries: dict[str, str]) -> dict[str, Any]:
    seconds: dict[str, dict[str, list[float]]] = {q: {v: [] for v in VARIANTS} for q in queries}
    problems: list[str] = []
    new_orders = max(5, round(tpch_data.counts(args.sf)["orders"] * 0.001))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE bench_dataset")
        install(conn)
        for name, query in queries.items():
            create_differential(conn, name, query)
            refresh_sync(settings, dsn, [name])
        print(f"created {len(queries)} stream tables", flush=True)
        seed = 0.0
        for r in range(args.rounds + 1):
            for variant in VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS)):
                seed += 0.01
                tpch_data.apply_changes(conn, args.sf, new_orders, seed)
                for name in queries:
                    took, action = refresh_as(variant, settings, dsn, name)
                    if action != "DIFFERENTIAL":
                        problems.append(f"{name} ({variant}, round {r}): {action}")
                    if r > 0:
                        seconds[name][variant].append(took)
                for name in queries:
                    if not verify(conn, name).ok:
                        problems.append(f"{name} ({variant}, round {r}): differs from its query")
            print(f"  round {r}/{args.rounds}{' (warm-up)' if r == 0 else ''} done", flush=True)
    return {"seconds": seconds, "problems": problems, "new_orders": new_orders}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings, admin_dsn, host = bench_start(args)
    every = tpch_data.queries(args.sf)
    wanted = [q.strip() for q in args.queries.split(",") if q.strip()] or list(every)
    ensure_dataset(admin_dsn, args.sf)
    run_db = f"pgtrickle_bench_codegen_{os.getpid()}"
    recreate_database(admin_dsn, run_db, template=tpch_db(args.sf))
    dsn = bench_dsn(admin_dsn, run_db)
    try:
        with spark_running(settings.with_overrides(dsn=dsn)):
            result = run(args, settings.with_overrides(dsn=dsn), dsn, {q: every[q] for q in wanted})
    finally:
        drop_database(admin_dsn, run_db)
    rows = median_rows(result["seconds"], "always", "choice")
    table = md_table(["query", "always on s", "pgtrickle's choice s", "choice / always"], rows, right_from=1)
    print("\n" + "\n".join(table))
    report = {
        "command": command_line("benchmarks/codegen_ab.py", argv),
        "date": now_text(),
        "machine": host,
        "revision": revision(),
        "spark_master": settings.spark_master,
        "sf": args.sf,
        "rounds": args.rounds,
        **result,
    }
    write_json(report, args.json, "codegen")
    if not args.no_docs:
        body = "\n".join(
            [
                *header_lines("Code generation for plans in parts", report, "benchmarks/codegen_ab.py"),
                f"TPC-H SF {args.sf:g}, each query a DIFFERENTIAL stream table refreshed alone; per round and "
                f"variant one transaction of changes ({result['new_orders']} new and as many deleted orders, "
                "updates); medians of "
                f"{args.rounds} rounds per variant, the variants alternating. Every refresh DIFFERENTIAL and "
                "exact (oracle).",
                "",
                *table,
            ]
        )
        write_section(args.section, body)
    for p in result["problems"]:
        print(f"PROBLEM: {p}", file=sys.stderr)
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
