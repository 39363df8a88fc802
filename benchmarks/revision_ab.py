"""Two revisions of pgtrickle side by side: the same TPC-H queries refreshed DIFFERENTIAL by each.

A change to the delta engine is judged by what it does to refresh times on this noisy machine, so
both revisions run in one run, interleaved: each in a long-lived process of its own (its code
checked out with ``git worktree`` into a temporary directory; ``--head`` defaults to the working
tree), with a SparkSession of its own, warm. Over one copy of the cached TPC-H dataset
(``benchmarks/tpch.py``'s) every query is created twice as a DIFFERENTIAL stream table,
``<q>_base`` first refreshed by the base revision's process and ``<q>_head`` by the head's, so each
stream table's hidden state tables are the ones its own revision plans. Then ``--rounds`` rounds
(after a warm-up) of: one transaction of TPC-H-like changes (``tpch_data.apply_changes``), then every
query refreshed by both processes, one after the other (which one first alternates from round to
round); every stream table checked against its query (oracle) after each round. Medians per query
and revision; the ratio head/base (< 1: the head is faster).

The two revisions share one database, so their catalogs must be the same: the script refuses
revisions whose ``src/pgtrickle/catalog/sql`` differ. ``--head-conf key=value,...`` gives the head's
process Spark settings of its own (as ``PGTRICKLE_SPARK_CONF``): one revision against itself under
two configurations.

    .venv/bin/python benchmarks/revision_ab.py --base main [--head BRANCH] [--head-conf K=V,...]
        [--sf 1] [--rounds 6] [--queries q22,q17] [--json PATH] [--no-docs]

Writes JSON (default benchmarks/results/revision_ab-<timestamp>.json) and, unless --no-docs, the
``revision-ab`` section of docs/BENCHMARKS.md. Exits 1 when a refresh was not DIFFERENTIAL, failed,
or a stream table differs from its query.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parent.parent
SECTION = "revision-ab"
SIDES = ("base", "head")


def worker() -> int:
    """The refreshing process of one revision (its ``src`` first on ``PYTHONPATH``): reads stream
    table names on stdin, answers one JSON line each (seconds and action, or the error)."""
    from pgtrickle.config import Settings
    from pgtrickle.daemon.manual import refresh_sync

    dsn = os.environ["PGTRICKLE_AB_DSN"]
    settings = Settings.from_env().with_overrides(dsn=dsn, spark_master=os.environ["PGTRICKLE_AB_MASTER"])
    for line in sys.stdin:
        started = time.perf_counter()
        try:
            [outcome] = refresh_sync(settings, dsn, [line.strip()])
            answer = {"seconds": time.perf_counter() - started, "action": outcome.action.value}
        except Exception as exc:  # reported to the driver, which fails the run
            answer = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        print(json.dumps(answer), flush=True)
    return 0


def worker_env(base: Mapping[str, str], src: Path, dsn: str, master: str, spark_conf: str) -> dict[str, str]:
    """The environment of a worker: ``src`` first on ``PYTHONPATH`` (its revision's code), the run's
    database and master, and ``spark_conf`` added to ``PGTRICKLE_SPARK_CONF`` (later keys win)."""
    env = dict(base, PYTHONPATH=str(src), PGTRICKLE_AB_DSN=dsn, PGTRICKLE_AB_MASTER=master)
    if spark_conf:
        env["PGTRICKLE_SPARK_CONF"] = ",".join(c for c in (base.get("PGTRICKLE_SPARK_CONF"), spark_conf) if c)
    return env


class Side:
    """One revision's source tree and its worker process."""

    def __init__(self, name: str, rev: str | None, stack: ExitStack, spark_conf: str = "") -> None:
        self.name, self.rev, self.spark_conf = name, rev, spark_conf
        if rev is None:
            self.src, self.label = ROOT / "src", f"working tree ({_git('rev-parse', '--short', 'HEAD')}+)"
        else:
            tree = Path(tempfile.mkdtemp(prefix=f"pgtrickle-ab-{name}-"))
            shutil.rmtree(tree)
            _git("worktree", "add", "--quiet", "--detach", str(tree), rev)
            stack.callback(_git, "worktree", "remove", "--force", str(tree))
            self.src, self.label = tree / "src", f"{rev} ({_git('rev-parse', '--short', rev)})"
        if spark_conf:
            self.label += f" with Spark settings {spark_conf}"
        self.process: subprocess.Popen[str] | None = None

    def start(self, dsn: str, master: str, stack: ExitStack) -> None:
        env = worker_env(os.environ, self.src, dsn, master, self.spark_conf)
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        stack.callback(self.stop)

    def refresh(self, name: str) -> dict[str, Any]:
        assert self.process is not None and self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(name + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        return json.loads(line) if line else {"error": f"the {self.name} process ended"}

    def stop(self) -> None:
        if self.process is not None and self.process.stdin is not None:
            self.process.stdin.close()
            self.process.wait(timeout=120)


def _git(*argv: str) -> str:
    return subprocess.run(["git", *argv], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def catalogs_differ(base: str, head: str | None) -> bool:
    """Whether the two revisions' catalog SQL differ (``head`` None: the working tree)."""
    refs = [base] if head is None else [base, head]
    return (
        subprocess.run(
            ["git", "diff", "--quiet", *refs, "--", "src/pgtrickle/catalog/sql"], cwd=ROOT
        ).returncode
        != 0
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from common import add_output_args

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the revision to compare against (e.g. main)")
    p.add_argument("--head", default=None, help="the revision under test (default: the working tree)")
    p.add_argument(
        "--head-conf",
        default="",
        help="Spark settings of the head's process only, key=value,... as PGTRICKLE_SPARK_CONF "
        "(compare two configurations of one revision: --base main --head main --head-conf ...)",
    )
    p.add_argument("--sf", type=float, default=1.0, help="TPC-H scale factor")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--queries", default="q22", help="comma-separated TPC-H queries, e.g. q13,q22")
    add_output_args(p, SECTION, Path("unused.png"))
    return p.parse_args(argv)


def run(
    args: argparse.Namespace, dsn: str, sides: dict[str, Side], queries: dict[str, str]
) -> dict[str, Any]:
    import psycopg
    import tpch_data
    from common import create_differential

    seconds: dict[str, dict[str, list[float]]] = {q: {s: [] for s in SIDES} for q in queries}
    problems: list[str] = []
    new_orders = max(5, round(tpch_data.counts(args.sf)["orders"] * 0.001))
    with psycopg.connect(dsn, autocommit=True) as conn:
        for q, query in queries.items():
            for side in SIDES:
                create_differential(conn, f"{q}_{side}", query)
                first = sides[side].refresh(f"{q}_{side}")
                if "error" in first:
                    problems.append(f"{q}_{side}: first refresh failed: {first['error']}")
        print(f"created {len(queries)} × 2 stream tables", flush=True)
        for r in range(args.rounds + 1):
            tpch_data.apply_changes(conn, args.sf, new_orders, 0.37 + r * 0.011)
            order = SIDES if r % 2 == 0 else tuple(reversed(SIDES))
            for q, side in ((q, side) for q in queries for side in order):
                took = _refreshed(conn, sides[side], f"{q}_{side}", f"round {r}", problems)
                if took is not None and r > 0:
                    seconds[q][side].append(took)
            print(f"  round {r}/{args.rounds}{' (warm-up)' if r == 0 else ''} done", flush=True)
    return {"seconds": seconds, "problems": problems, "new_orders": new_orders}


def _refreshed(conn: Any, side: Side, name: str, when: str, problems: list[str]) -> float | None:
    """Refresh ``name`` by ``side``'s process and check it with the oracle: its seconds (``None``
    when it failed or was not DIFFERENTIAL; ``problems`` says so, as it does a difference)."""
    from pgtrickle.refresh.verify import verify

    answer = side.refresh(name)
    if not verify(conn, name).ok:
        problems.append(f"{name} ({when}): differs from its query")
    if "error" in answer or answer["action"] != "DIFFERENTIAL":
        problems.append(f"{name} ({when}): {answer.get('error') or answer['action']}")
        return None
    return float(answer["seconds"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for rev in (args.base, args.head):
        if (
            rev is not None
            and subprocess.run(
                ["git", "rev-parse", "--quiet", "--verify", f"{rev}^{{commit}}"],
                cwd=ROOT,
                capture_output=True,
            ).returncode
        ):
            print(f"revision_ab: {rev!r} is not a revision of this repository", file=sys.stderr)
            return 2
    if catalogs_differ(args.base, args.head):
        print(
            f"revision_ab: {args.base} and {args.head or 'the working tree'} install different catalogs "
            "(src/pgtrickle/catalog/sql); they cannot share one database",
            file=sys.stderr,
        )
        return 2
    import psycopg
    import tpch_data
    from common import (
        bench_dsn,
        bench_start,
        command_line,
        drop_database,
        md_table,
        median_rows,
        now_text,
        publish,
        recreate_database,
        revision,
    )
    from tpch import ensure_dataset, tpch_db

    from pgtrickle.catalog.install import install

    settings, admin_dsn, host = bench_start(args)
    every = tpch_data.queries(args.sf)
    wanted = [q.strip() for q in args.queries.split(",") if q.strip()]
    unknown = [q for q in wanted if q not in every]
    if unknown or not wanted:
        print(f"revision_ab: unknown queries {unknown}; pick from {', '.join(every)}", file=sys.stderr)
        return 2
    ensure_dataset(admin_dsn, args.sf)
    run_db = f"pgtrickle_bench_ab_{os.getpid()}"
    recreate_database(admin_dsn, run_db, template=tpch_db(args.sf))
    dsn = bench_dsn(admin_dsn, run_db)
    with ExitStack() as stack:
        stack.callback(drop_database, admin_dsn, run_db)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP TABLE bench_dataset")
            install(conn)
        sides = {
            "base": Side("base", args.base, stack),
            "head": Side("head", args.head, stack, args.head_conf),
        }
        for side in sides.values():
            side.start(dsn, settings.spark_master, stack)
        result = run(args, dsn, sides, {q: every[q] for q in wanted})
    rows = median_rows(result["seconds"], "base", "head")
    head_label, base_label = sides["head"].label, sides["base"].label
    print(f"\nbase: {base_label}\nhead: {head_label}")
    report = {
        "command": command_line("benchmarks/revision_ab.py", argv),
        "date": now_text(),
        "machine": host,
        "revision": revision(),
        "base": base_label,
        "head": head_label,
        "spark_master": settings.spark_master,
        "sf": args.sf,
        "rounds": args.rounds,
        **result,
    }
    intro = (
        f"Base {base_label}, head {head_label}. TPC-H SF {args.sf:g}, each query a DIFFERENTIAL stream table "
        "per revision, refreshed by that revision's warm process; per round one transaction of changes "
        f"({result['new_orders']} new and as many deleted orders, updates), then both refreshes, the order "
        f"alternating; medians of {args.rounds} rounds. Every refresh DIFFERENTIAL and exact (oracle)."
    )
    table = md_table(["query", "base s", "head s", "head / base"], rows, right_from=1)
    return publish(
        report, args, "revision_ab", "Two revisions side by side", intro, table, result["problems"]
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        raise SystemExit(worker())
    raise SystemExit(main())
