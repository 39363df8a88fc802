"""Stream tables that keep nodes in hidden state tables: DIFFERENTIAL next to FULL, with Spark's planning.

Three shapes that keep an inner node (the queries of ``tests/integration/test_hidden_state.py``):
an aggregate of an aggregate over an outer join (TPC-H Q13's shape), an aggregate joined on its
value (Q22's), and the input of ORDER BY … LIMIT (top-k). For each, one stream table in
refresh_mode DIFFERENTIAL and one in FULL over the same ``customers`` (``--rows`` / 10) and
``orders`` (``--rows``) tables. Each round one transaction changes the sources (``--changes``
changes: order inserts, deletes and moves to another customer, customer balance updates), then
every stream table refreshes, one at a time, each seeing the same changes, and is checked
against its defining query run in PostgreSQL (two-way EXCEPT ALL).

Per refresh it reports the wall seconds and, from the refresh's timings
(:mod:`pgtrickle.spark.planning`), Spark's analysis and planning seconds and the operators of
the optimized plans: ``kept_*`` for the hidden tables' changes, ``delta_*`` for the stream
table's own change, ``full_*`` for a FULL refresh. Medians over ``--rounds``.

    .venv/bin/python benchmarks/hidden_state.py [--rows 200000] [--changes 400] [--rounds 3]
        [--shapes q13,q22,topk] [--dsn ...] [--spark-master local[*]] [--json PATH] [--no-docs]
        [--section NAME] [--preset NAME]

Uses the embedded PostgreSQL unless --dsn is given, in a database of its own
(``pgtrickle_bench_hidden_<pid>``, dropped at the end). Writes JSON (default
benchmarks/results/hidden_state-<timestamp>.json) and, unless --no-docs, the section
``hidden_state`` of docs/BENCHMARKS.md. Exits with status 1 when a DIFFERENTIAL stream table
did not refresh DIFFERENTIAL or a stream table differs from its query.
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

import psycopg  # noqa: E402

from common import (  # noqa: E402
    add_output_args,
    md_table,
    publish,
    run_in_own_database,
)
from pgtrickle.catalog.install import install  # noqa: E402
from pgtrickle.config import Settings  # noqa: E402
from pgtrickle.daemon.manual import refresh_sync  # noqa: E402

SECTION = "hidden_state"
SHAPES: dict[str, str] = {
    "q13": "SELECT n, count(*) AS customers FROM (SELECT c.id, count(o.id) AS n FROM hs.customers c"
    " LEFT JOIN hs.orders o ON o.customer = c.id GROUP BY c.id) per_customer GROUP BY n",
    "q22": "SELECT c.region, count(*) AS n, sum(c.balance) AS total FROM hs.customers c"
    " WHERE c.balance > (SELECT avg(balance) FROM hs.customers WHERE balance > 0) GROUP BY c.region",
    "topk": "SELECT c.id, c.region, sum(o.amount) AS spent FROM hs.customers c JOIN hs.orders o"
    " ON o.customer = c.id GROUP BY c.id, c.region ORDER BY spent DESC, c.id LIMIT 5",
}
FIGURES = ("analysis", "planning", "operators")


def load(conn: psycopg.Connection, rows: int) -> None:
    customers = max(rows // 10, 10)
    conn.execute("CREATE SCHEMA hs")
    conn.execute("CREATE TABLE hs.customers (id int PRIMARY KEY, region text, balance numeric(12,2))")
    conn.execute("CREATE TABLE hs.orders (id int PRIMARY KEY, customer int, amount numeric(12,2))")
    conn.execute(
        "INSERT INTO hs.customers SELECT g, 'r' || (g %% 25), (g * 7 %% 2003 - 500)::numeric(12,2) / 10"
        " FROM generate_series(1, %s) g",
        (customers,),
    )
    conn.execute(
        "INSERT INTO hs.orders SELECT g, (g * 7919) %% %s + 1, (g %% 997 + 0.25)::numeric(12,2)"
        " FROM generate_series(1, %s) g",
        (customers, rows),
    )
    conn.execute("ANALYZE hs.customers")
    conn.execute("ANALYZE hs.orders")


def apply_changes(conn: psycopg.Connection, changes: int, rows: int, next_id: int, rng: random.Random) -> int:
    """One transaction of ``changes`` changes; returns the next free order id."""
    customers = max(rows // 10, 10)
    quarter = max(changes // 4, 1)
    with conn.transaction():
        conn.execute(
            "INSERT INTO hs.orders SELECT g, 1 + (g * 31) %% %s, (g %% 89 + 0.5)::numeric(12,2)"
            " FROM generate_series(%s, %s) g",
            (customers, next_id, next_id + quarter - 1),
        )
        picks = rng.sample(range(1, rows + 1), 2 * quarter)
        conn.execute("DELETE FROM hs.orders WHERE id = ANY(%s)", (picks[:quarter],))
        conn.execute(
            "UPDATE hs.orders SET customer = 1 + (id * 13) %% %s WHERE id = ANY(%s)",
            (customers, picks[quarter:]),
        )
        conn.execute(
            "UPDATE hs.customers SET balance = balance + 1.5 WHERE id = ANY(%s)",
            (rng.sample(range(1, customers + 1), quarter),),
        )
    conn.execute("VACUUM ANALYZE hs.orders")
    conn.execute("VACUUM ANALYZE hs.customers")
    return next_id + quarter


def differs(conn: psycopg.Connection, name: str, query: str) -> int:
    """Rows by which the stream table and its query differ (two-way EXCEPT ALL)."""
    cols = ", ".join(
        r[0]
        for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped"
            " AND attname NOT LIKE '\\_\\_pgt\\_%%' ORDER BY attnum",
            (name,),
        ).fetchall()
    )
    row = conn.execute(
        f"SELECT (SELECT count(*) FROM ((SELECT {cols} FROM {name}) EXCEPT ALL ({query})) a)"
        f" + (SELECT count(*) FROM (({query}) EXCEPT ALL (SELECT {cols} FROM {name})) b)"
    ).fetchone()
    assert row is not None
    return int(row[0])


def refresh(settings: Settings, dsn: str, name: str) -> dict[str, Any]:
    started = time.monotonic()
    [outcome] = refresh_sync(settings, dsn, [name])
    wall = time.monotonic() - started
    sample: dict[str, Any] = {
        "action": outcome.action.value,
        "wall": round(wall, 3),
        "spark_jobs": outcome.spark_jobs,
    }
    sample.update({k: round(v, 4) for k, v in outcome.timings.items()})
    return sample


def median(samples: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [s[key] for s in samples if key in s]
    return round(statistics.median(values), 3) if values else None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000, help="orders (customers: a tenth)")
    parser.add_argument("--changes", type=int, default=400, help="changes per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    add_output_args(parser, SECTION, Path("unused.png"))
    args = parser.parse_args(argv)
    args.shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in args.shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown --shapes {', '.join(unknown)}; choose from {', '.join(SHAPES)}")
    if args.rounds < 1 or args.rows < 100 or not 4 <= args.changes < args.rows // 2:
        parser.error("--rounds ≥ 1, --rows ≥ 100 and 4 ≤ --changes < rows / 2")
    return args


def run(settings: Settings, dsn: str, args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    results: dict[str, Any] = {}
    problems: list[str] = []
    rng = random.Random(17)
    with psycopg.connect(dsn, autocommit=True) as conn:
        install(conn)
        load(conn, args.rows)
        for shape in args.shapes:
            for mode in ("DIFFERENTIAL", "FULL"):
                name = f"{shape}_{mode.lower()}"
                conn.execute(
                    "SELECT pgtrickle.create_stream_table(%s, %s, schedule => '24h', refresh_mode => %s,"
                    " initialize => false)",
                    (name, SHAPES[shape], mode),
                )
                conn.execute("SELECT pgtrickle.alter_stream_table(%s, circuit_breaker => 'none')", (name,))
                first = refresh(settings, dsn, name)
                print(f"  {name}: initial {first['action']} {first['wall']:.2f}s", flush=True)
                results[name] = {"initial": first, "rounds": []}
        next_id = args.rows + 1
        for number in range(args.rounds):
            next_id = apply_changes(conn, args.changes, args.rows, next_id, rng)
            for shape in args.shapes:
                for mode in ("DIFFERENTIAL", "FULL"):
                    name = f"{shape}_{mode.lower()}"
                    sample = refresh(settings, dsn, name)
                    sample["differs"] = differs(conn, name, SHAPES[shape])
                    results[name]["rounds"].append(sample)
                    print(f"  round {number + 1} {name}: {sample}", flush=True)
                    if sample["action"] != mode:
                        problems.append(f"{name} round {number + 1} refreshed {sample['action']}, not {mode}")
                    if sample["differs"]:
                        problems.append(
                            f"{name} round {number + 1} differs from its query by {sample['differs']} rows"
                        )
    return results, problems


def table(results: dict[str, Any], shapes: Sequence[str]) -> list[str]:
    head = [
        "shape",
        "FULL s",
        "DIFF s",
        "DIFF/FULL",
        "FULL plan ops",
        "FULL planning s",
        "kept plan ops",
        "kept planning s",
        "delta plan ops",
        "delta planning s",
        "DIFF analysis s",
    ]
    rows = []
    for shape in shapes:
        full, diff = results[f"{shape}_full"]["rounds"], results[f"{shape}_differential"]["rounds"]
        fw, dw = median(full, "wall"), median(diff, "wall")
        analysis = [sum(s.get(f"{k}_analysis", 0) for k in ("kept", "delta")) for s in diff]
        rows.append(
            [
                shape,
                fw,
                dw,
                f"{dw / fw:.2f}" if fw and dw else "–",
                median(full, "full_operators"),
                median(full, "full_planning"),
                median(diff, "kept_operators"),
                median(diff, "kept_planning"),
                median(diff, "delta_operators"),
                median(diff, "delta_planning"),
                round(statistics.median(analysis), 3),
            ]
        )
    return md_table(head, [[("–" if v is None else v) for v in r] for r in rows])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    header, results, problems = run_in_own_database(args, "hidden", "benchmarks/hidden_state.py", argv, run)
    report: dict[str, Any] = {
        **header,
        "rows": args.rows,
        "changes": args.changes,
        "rounds": args.rounds,
        "shapes": args.shapes,
        "results": results,
        "problems": problems,
    }
    lines = table(results, args.shapes)
    intro = (
        f"{args.rows:,} orders, {max(args.rows // 10, 10):,} customers, {args.changes} changes a round, "
        f"medians of {args.rounds} rounds. Seconds are wall time of one refresh; plan ops: operators "
        "of Spark's optimized plan; planning: the optimizer and physical planner (analysis: "
        "`spark.sql`)."
    )
    title = "Hidden state tables: DIFFERENTIAL next to FULL"
    return publish(report, args, "hidden_state", title, intro, lines, problems)


if __name__ == "__main__":
    sys.exit(main())
