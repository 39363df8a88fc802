"""Atomic groups: members below the root DIFFERENTIAL next to the same members recomputed (FULL).

Two explicit refresh groups over the same ``orders`` (``--rows``) and ``regions`` (1,000 rows)
tables, each a root ``base_<v>`` (``orders`` filtered, DIFFERENTIAL) with two members reading it:
an aggregate (``agg_<v>``: sum, count, max per region) and a join with ``regions``
(``joined_<v>``). In the group ``differential`` the two members refresh DIFFERENTIAL from the
root's change of the same transaction (refresh/group.py); in the group ``full`` they have
``refresh_mode => 'FULL'``, so they are recomputed from the root's query inlined over ``orders``
at the group's snapshot - what every member below a root did before. Each round one transaction
changes ``orders`` (``--changes`` changes: inserts, deletes, updates), then both groups refresh
(their order alternating by round), each checked against its defining queries (two-way EXCEPT
ALL). Reported: the median wall seconds of one group refresh and its Spark jobs.

    .venv/bin/python benchmarks/group_refresh.py [--rows 200000] [--changes 400] [--rounds 3]
        [--dsn ...] [--spark-master local[*]] [--json PATH] [--no-docs] [--section NAME]

Uses the embedded PostgreSQL unless --dsn is given, in a database of its own
(``pgtrickle_bench_group_<pid>``, dropped at the end). Writes JSON (default
benchmarks/results/group_refresh-<timestamp>.json) and, unless --no-docs, the section
``group_refresh`` of docs/BENCHMARKS.md. Exits with status 1 when a member did not refresh in the
mode expected or differs from its query.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
from common import (
    add_output_args,
    md_table,
    publish,
    run_in_own_database,
)
from hidden_state import differs

from pgtrickle.catalog.install import install
from pgtrickle.config import Settings
from pgtrickle.daemon.manual import refresh_sync

SECTION = "group_refresh"
VARIANTS = {"differential": "DIFFERENTIAL", "full": "FULL"}
REGIONS = 1000


def queries(v: str) -> dict[str, str]:
    return {
        f"base_{v}": "SELECT id, region, amount FROM gb.orders WHERE amount > 3",
        f"agg_{v}": f"SELECT region, sum(amount) AS total, count(*) AS n, max(amount) AS top FROM base_{v}"
        " GROUP BY region",
        f"joined_{v}": f"SELECT b.id, b.amount, r.label FROM base_{v} b JOIN gb.regions r USING (region)",
    }


def load(conn: psycopg.Connection, rows: int) -> None:
    conn.execute("CREATE SCHEMA gb")
    conn.execute("CREATE TABLE gb.regions (region int PRIMARY KEY, label text)")
    conn.execute("CREATE TABLE gb.orders (id int PRIMARY KEY, region int NOT NULL, amount int NOT NULL)")
    conn.execute(
        "INSERT INTO gb.regions SELECT g, 'region ' || g FROM generate_series(0, %s) g", (REGIONS - 1,)
    )
    conn.execute(
        "INSERT INTO gb.orders SELECT g, (g * 7919) %% %s, g %% 997 FROM generate_series(1, %s) g",
        (REGIONS, rows),
    )
    conn.execute("ANALYZE gb.regions")
    conn.execute("ANALYZE gb.orders")


def apply_changes(conn: psycopg.Connection, changes: int, rows: int, next_id: int, rng: random.Random) -> int:
    """One transaction of ``changes`` changes to ``orders``; returns the next free id."""
    third = max(changes // 3, 1)
    with conn.transaction():
        conn.execute(
            "INSERT INTO gb.orders SELECT g, (g * 31) %% %s, g %% 89 FROM generate_series(%s::int, %s::int) g",
            (REGIONS, next_id, next_id + third - 1),
        )
        picks = rng.sample(range(1, rows + 1), 2 * third)
        conn.execute("DELETE FROM gb.orders WHERE id = ANY(%s)", (picks[:third],))
        conn.execute("UPDATE gb.orders SET amount = amount + 7 WHERE id = ANY(%s)", (picks[third:],))
    conn.execute("VACUUM ANALYZE gb.orders")
    return next_id + third


def refresh_group(settings: Settings, dsn: str, v: str) -> dict[str, Any]:
    started = time.monotonic()
    outcomes = refresh_sync(settings, dsn, [f"agg_{v}"])  # one member asked for: its whole group runs
    wall = time.monotonic() - started
    return {
        "wall": round(wall, 3),
        "actions": {o.st.name: o.action.value for o in outcomes},
        "spark_jobs": sum(o.spark_jobs or 0 for o in outcomes),
    }


def run(settings: Settings, dsn: str, args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    results: dict[str, Any] = {v: [] for v in VARIANTS}
    problems: list[str] = []
    rng = random.Random(23)
    with psycopg.connect(dsn, autocommit=True) as conn:
        install(conn)
        load(conn, args.rows)
        for v, mode in VARIANTS.items():
            for name, query in queries(v).items():
                own = "DIFFERENTIAL" if name.startswith("base_") else mode
                conn.execute(
                    "SELECT pgtrickle.create_stream_table(%s, %s, schedule => '24h', refresh_mode => %s,"
                    " initialize => false)",
                    (name, query, own),
                )
                conn.execute("SELECT pgtrickle.alter_stream_table(%s, circuit_breaker => 'none')", (name,))
            conn.execute("SELECT pgtrickle.create_refresh_group(%s, %s)", (f"g_{v}", list(queries(v))))
            first = refresh_group(settings, dsn, v)
            print(f"  group {v}: initial {first}", flush=True)
        next_id = args.rows + 1
        for number in range(args.rounds):
            next_id = apply_changes(conn, args.changes, args.rows, next_id, rng)
            order = list(VARIANTS) if number % 2 == 0 else list(reversed(VARIANTS))
            for v in order:
                sample = refresh_group(settings, dsn, v)
                sample["differs"] = {n: differs(conn, n, q) for n, q in queries(v).items()}
                results[v].append(sample)
                print(f"  round {number + 1} group {v}: {sample}", flush=True)
                expected = {n: ("DIFFERENTIAL" if n.startswith("base_") else VARIANTS[v]) for n in queries(v)}
                if sample["actions"] != expected:
                    problems.append(
                        f"group {v} round {number + 1} refreshed {sample['actions']}, not {expected}"
                    )
                wrong = {n: d for n, d in sample["differs"].items() if d}
                if wrong:
                    problems.append(f"group {v} round {number + 1}: rows differing from the queries: {wrong}")
    return results, problems


def table(results: dict[str, Any]) -> list[str]:
    rows = []
    walls = {v: statistics.median(s["wall"] for s in results[v]) for v in VARIANTS}
    for v in VARIANTS:
        jobs = statistics.median(s["spark_jobs"] for s in results[v])
        below = "DIFFERENTIAL" if v == "differential" else "FULL (recomputed from the root's query)"
        rows.append([v, below, round(walls[v], 3), jobs, f"{walls[v] / walls['full']:.2f}"])
    return md_table(["group", "members below the root", "group refresh s", "Spark jobs", "× full"], rows, 2)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000, help="orders")
    parser.add_argument("--changes", type=int, default=400, help="changes per round")
    parser.add_argument("--rounds", type=int, default=3)
    add_output_args(parser, SECTION, Path("unused.png"))
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.rows < 1000 or not 3 <= args.changes < args.rows // 10:
        parser.error("--rounds ≥ 1, --rows ≥ 1000 and 3 ≤ --changes < rows / 10")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    header, results, problems = run_in_own_database(args, "group", "benchmarks/group_refresh.py", argv, run)
    report: dict[str, Any] = {
        **header,
        "rows": args.rows,
        "changes": args.changes,
        "rounds": args.rounds,
        "results": results,
        "problems": problems,
    }
    lines = table(results)
    intro = (
        f"{args.rows:,} orders, {REGIONS:,} regions, {args.changes} changes a round, medians of "
        f"{args.rounds} rounds. One group: a root (DIFFERENTIAL) and below it an aggregate and a "
        "join with `regions`; seconds are the wall time of one refresh of the whole group, Spark "
        "jobs those of all three members."
    )
    title = "Atomic groups: members below the root DIFFERENTIAL next to FULL"
    return publish(report, args, "group_refresh", title, intro, lines, problems)


if __name__ == "__main__":
    sys.exit(main())
