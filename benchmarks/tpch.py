"""TPC-H-derived workload: the 22 queries as DIFFERENTIAL stream tables under sustained random changes.

Data: ``benchmarks/tpch_data.py`` generates the eight TPC-H tables in PostgreSQL at scale factor
``--sf`` (cached in ``pgtrickle_bench_tpch_<sf>`` and copied for each run, like the events dataset).
Each of the 22 queries (PostgreSQL syntax) is created three times: ``<q>_diff`` with
``refresh_mode => 'DIFFERENTIAL'``, ``<q>_full`` with ``refresh_mode => 'FULL'`` and a materialized view
``<q>_mv``. A query pgtrickle refuses — at ``create_stream_table`` or at its first refresh, which is
where ``DIFFERENTIAL`` mode reports a query without delta rules — is listed with pgtrickle's message.

Then ``--rounds`` rounds (after one warm-up round) of: one transaction of changes
(``--new-orders`` new orders with their lines, as many random orders deleted with their lines,
updates of as many lines, half as many orders, and a few customers, part-suppliers and suppliers),
then, one at a time, the DIFFERENTIAL stream table, the FULL stream table and the matview of every
query are refreshed, and the DIFFERENTIAL (and FULL) stream table is checked with the oracle
(two-way ``EXCEPT ALL`` of the stream table against its defining query, ``pgtrickle verify``). Any
difference is wrong, also one in the last digit of a quotient (PostgreSQL's numeric division is
computed exactly on Spark, see docs/TYPES.md); as a diagnostic a mismatch is re-checked with
numeric columns rounded to 6 decimals, and the report says when that makes it vanish.

    .venv/bin/python benchmarks/tpch.py [--sf 0.01] [--rounds 3] [--new-orders 0] [--queries q01,q06]
        [--json PATH] [--no-docs] [--keep] [--preset NAME]

Writes JSON (default benchmarks/results/tpch-<timestamp>.json) and, unless --no-docs, the
``tpch`` section of docs/BENCHMARKS.md and docs/img/tpch.png. Exits 1 when an accepted query's stream
table ever differs from its query (DIFFERENTIAL or FULL), in any digit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

import tpch_data  # noqa: E402
from common import (  # noqa: E402
    DOCS,
    IMG,
    add_output_args,
    bench_dsn,
    command_line,
    database_exists,
    drop_database,
    fmt_ratio,
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
from pgtrickle.cdc.buffers import cleanup_buffers  # noqa: E402
from pgtrickle.config import Settings  # noqa: E402
from pgtrickle.db.connection import resolve_dsn  # noqa: E402
from pgtrickle.errors import PgTrickleError  # noqa: E402
from pgtrickle.refresh.verify import verify  # noqa: E402
from pgtrickle.daemon.manual import refresh_sync  # noqa: E402

SECTION = "tpch"
PLOT = IMG / "tpch.png"


@dataclass
class QueryResult:
    name: str
    accepted: bool
    refused_at: str | None = None
    reason: str = ""
    """pgtrickle's message when refused; its mode reason (the delta strategy) when accepted."""
    result_rows: int = 0
    initial_s: float = 0.0
    diff_s: list[float] = field(default_factory=list)
    full_s: list[float] = field(default_factory=list)
    matview_s: list[float] = field(default_factory=list)
    diff_actions: list[str] = field(default_factory=list)
    diff_jobs: list[int | None] = field(default_factory=list)
    """Spark jobs of each measured DIFFERENTIAL refresh, as its history row records them."""
    oracle_exact: list[int] = field(default_factory=list)
    """Rows in the two-way EXCEPT ALL (missing + extra) of the DIFFERENTIAL stream table, per round."""
    oracle_rounded: list[int] = field(default_factory=list)
    full_oracle_exact: list[int] = field(default_factory=list)
    full_oracle_rounded: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def medians(self) -> dict[str, float | None]:
        def med(xs: list[float]) -> float | None:
            return round(statistics.median(xs), 4) if xs else None

        d, f, m = med(self.diff_s), med(self.full_s), med(self.matview_s)
        return {
            "diff_s": d,
            "full_s": f,
            "matview_s": m,
            "full_over_diff": round(f / d, 4) if d and f else None,
            "matview_over_diff": round(m / d, 4) if d and m else None,
        }


# ------------------------------------------------------------------ data
def tpch_db(sf: float, char_columns: bool = False) -> str:
    return "pgtrickle_bench_tpch_" + f"{sf:g}".replace(".", "_") + ("_char" if char_columns else "")


def ensure_dataset(admin_dsn: str, sf: float, char_columns: bool = False) -> tuple[str, float]:
    """The cached TPC-H database at ``sf`` (built once; a partial one is rebuilt). Returns (name, seconds)."""
    db = tpch_db(sf, char_columns)
    if database_exists(admin_dsn, db):
        with psycopg.connect(bench_dsn(admin_dsn, db), autocommit=True) as conn:
            if (
                scalar(conn, "SELECT to_regclass('public.bench_dataset')") is not None
                and scalar(conn, "SELECT value FROM bench_dataset WHERE key = 'complete'") == "true"
                and scalar(conn, "SELECT value FROM bench_dataset WHERE key = 'char_columns'")
                == str(char_columns)
            ):
                return db, 0.0
    print(f"  generating TPC-H data at SF {sf:g} into {db}…", flush=True)
    started = time.monotonic()
    recreate_database(admin_dsn, db)
    with psycopg.connect(bench_dsn(admin_dsn, db), autocommit=True) as conn:
        steps = tpch_data.load(
            conn, sf, progress=lambda line: print(line, flush=True), char_columns=char_columns
        )
        conn.execute("CREATE TABLE bench_dataset (key text PRIMARY KEY, value text)")
        conn.execute(
            "INSERT INTO bench_dataset VALUES ('sf', %s), ('char_columns', %s), ('complete', 'true')",
            (f"{sf:g}", str(char_columns)),
        )
    seconds = time.monotonic() - started
    print(f"  generated in {seconds:.0f}s {steps}", flush=True)
    return db, seconds


def table_counts(conn: psycopg.Connection) -> dict[str, int]:
    return {t: int(scalar(conn, f"SELECT count(*) FROM {t}")) for t in tpch_data.TABLES}


# ------------------------------------------------------------------ stream tables
def create_all(
    conn: psycopg.Connection, settings: Settings, dsn: str, queries: dict[str, str]
) -> dict[str, QueryResult]:
    results: dict[str, QueryResult] = {}
    for name, query in queries.items():
        res = QueryResult(name, accepted=False)
        results[name] = res
        try:
            conn.execute(
                "SELECT pgtrickle.create_stream_table(%s, %s, schedule => '24h',"
                " refresh_mode => 'DIFFERENTIAL', initialize => false)",
                (f"{name}_diff", query),
            )
        except psycopg.Error as exc:
            res.refused_at, res.reason = "create_stream_table", _message(exc)
            print(f"  {name}: REFUSED by create_stream_table: {res.reason}", flush=True)
            continue
        conn.execute("SELECT pgtrickle.alter_stream_table(%s, circuit_breaker => 'none')", (f"{name}_diff",))
        started = time.monotonic()
        try:
            refresh_sync(settings, dsn, [f"{name}_diff"])
        except (PgTrickleError, psycopg.Error) as exc:
            res.refused_at, res.reason = "first refresh", str(exc).splitlines()[0]
            row = conn.execute(
                "SELECT last_error FROM pgtrickle.stream_tables_info WHERE table_name = %s", (f"{name}_diff",)
            ).fetchone()
            if row and row[0]:
                res.reason = str(row[0]).splitlines()[0]
            print(f"  {name}: REFUSED at the first refresh: {res.reason}", flush=True)
            conn.execute("SELECT pgtrickle.drop_stream_table(%s)", (f"{name}_diff",))
            continue
        res.initial_s = round(time.monotonic() - started, 3)
        status, mode, reason, error = conn.execute(
            "SELECT status, effective_mode, mode_reason, last_error FROM pgtrickle.stream_tables_info"
            " WHERE table_name = %s",
            (f"{name}_diff",),
        ).fetchone()  # type: ignore[misc]
        if status == "ERROR":
            res.refused_at, res.reason = "first refresh", str(error or reason).splitlines()[0]
            print(f"  {name}: REFUSED at the first refresh: {res.reason}", flush=True)
            conn.execute("SELECT pgtrickle.drop_stream_table(%s)", (f"{name}_diff",))
            continue
        res.accepted, res.reason = True, str(reason or mode)
        conn.execute(
            "SELECT pgtrickle.create_stream_table(%s, %s, schedule => '24h', refresh_mode => 'FULL',"
            " initialize => false)",
            (f"{name}_full", query),
        )
        conn.execute("SELECT pgtrickle.alter_stream_table(%s, circuit_breaker => 'none')", (f"{name}_full",))
        refresh_sync(settings, dsn, [f"{name}_full"])
        conn.execute(
            sql.SQL("CREATE MATERIALIZED VIEW {} AS {}").format(sql.Identifier(f"{name}_mv"), sql.SQL(query))
        )  # type: ignore[arg-type]
        res.result_rows = int(scalar(conn, f"SELECT count(*) FROM {name}_mv"))
        print(
            f"  {name}: accepted ({mode}; {res.result_rows} rows; initial {res.initial_s:.2f}s): "
            f"{res.reason[:120]}",
            flush=True,
        )
    return results


def _message(exc: psycopg.Error) -> str:
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag else None
    return str(primary or exc).splitlines()[0]


def rounded_mismatch(conn: psycopg.Connection, name: str) -> int:
    """Rows differing (two-way EXCEPT ALL) with numeric and float columns rounded to 6 decimals."""
    pgt_id, relid = conn.execute(
        "SELECT pgt_id, pgt_relid FROM pgtrickle.pgt_stream_tables WHERE pgt_id = (pgtrickle._find_st(%s)).pgt_id",
        (name,),
    ).fetchone()  # type: ignore[misc]
    cols = conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s AND attnum > 0"
        " AND NOT attisdropped AND attname NOT LIKE '\\_\\_pgt\\_%%' ORDER BY attnum",
        (relid,),
    ).fetchall()
    exprs = [
        f'round("{c}"::numeric, 6)' if t.startswith(("numeric", "double", "real")) else f'"{c}"'
        for c, t in cols
    ]
    proj = ", ".join(exprs)
    st, q = f"SELECT {proj} FROM {name}", f"SELECT {proj} FROM pgtrickle.pgt_def_{pgt_id}"
    return int(
        scalar(
            conn,
            f"SELECT (SELECT count(*) FROM ({q} EXCEPT ALL {st}) a)"
            f" + (SELECT count(*) FROM ({st} EXCEPT ALL {q}) b)",
        )
    )


def timed_refresh(settings: Settings, dsn: str, name: str) -> tuple[float, str, int | None]:
    started = time.monotonic()
    [outcome] = refresh_sync(settings, dsn, [name])
    return time.monotonic() - started, outcome.action.value, outcome.spark_jobs


def run_round(
    conn: psycopg.Connection, settings: Settings, dsn: str, results: dict[str, QueryResult], record: bool
) -> None:
    for name, res in results.items():
        if not res.accepted:
            continue
        try:
            diff, action, jobs = timed_refresh(settings, dsn, f"{name}_diff")
            full, _, _ = timed_refresh(settings, dsn, f"{name}_full")
            started = time.monotonic()
            conn.execute(f"REFRESH MATERIALIZED VIEW {name}_mv")
            mv = time.monotonic() - started
        except (PgTrickleError, psycopg.Error) as exc:
            res.errors.append(str(exc).splitlines()[0])
            print(f"    {name}: refresh failed: {res.errors[-1]}", flush=True)
            continue
        check = verify(conn, f"{name}_diff")
        exact = check.missing + check.extra
        rounded = rounded_mismatch(conn, f"{name}_diff") if exact else 0
        full_check = verify(conn, f"{name}_full")
        full_exact = full_check.missing + full_check.extra
        full_rounded = rounded_mismatch(conn, f"{name}_full") if full_exact else 0
        if not record:
            if exact or full_exact:
                res.errors.append(
                    f"warm-up: {exact} (DIFFERENTIAL) and {full_exact} (FULL) rows differ from the query"
                )
            continue
        res.diff_s.append(round(diff, 4))
        res.full_s.append(round(full, 4))
        res.matview_s.append(round(mv, 4))
        res.diff_actions.append(action)
        res.diff_jobs.append(jobs)
        res.oracle_exact.append(exact)
        res.oracle_rounded.append(rounded)
        res.full_oracle_exact.append(full_exact)
        res.full_oracle_rounded.append(full_rounded)
        flag = (
            ""
            if not exact
            else (
                f"  ORACLE: {exact} rows differ"
                + (f", {rounded} after rounding" if rounded else " (in digits beyond 6)")
            )
        )
        if full_exact:
            flag += f"  FULL ORACLE: {full_exact} rows differ"
        print(
            f"    {name}: diff {diff:6.3f}s ({action}, {jobs} Spark jobs)  full {full:6.3f}s  matview {mv:6.3f}s{flag}",
            flush=True,
        )
    cleanup_buffers(conn)


# ------------------------------------------------------------------ output
def strategy(reason: str) -> str:
    """A short name for the delta strategy pgtrickle reports."""
    text = reason.lower()
    for key, label in (
        ("hidden stream table", "needs a hidden table"),
        ("no delta rule", "no delta rule"),
        ("algebraic", "algebraic (stored state)"),
        ("touched groups", "touched groups"),
        ("touched partitions", "touched partitions"),
        ("touched rows", "touched rows"),
        ("outer join", "outer join"),
        ("anti join", "anti join"),
        ("semi join", "semi join"),
        ("telescoping", "telescoping join"),
        ("linear", "linear"),
    ):
        if key in text:
            return label
    return reason[:40]


def summary_rows(results: dict[str, QueryResult]) -> list[list[Any]]:
    rows = []
    for name, r in results.items():
        if not r.accepted:
            continue
        m = r.medians()
        actions = ", ".join(f"{a}×{r.diff_actions.count(a)}" for a in sorted(set(r.diff_actions))) or "–"
        jobs = sorted({j for j in r.diff_jobs if j is not None})
        if jobs:
            actions += f" ({'/'.join(map(str, jobs))} Spark job{'s' if jobs != [1] else ''})"
        wrong = max([*r.oracle_exact, *r.full_oracle_exact], default=0)
        ok = "✓" if not wrong else f"**✗ {wrong} rows**"
        rows.append(
            [
                name.upper(),
                strategy(r.reason),
                r.result_rows,
                actions,
                "–" if m["diff_s"] is None else f"{m['diff_s']:.3f}",
                "–" if m["full_s"] is None else f"{m['full_s']:.3f}",
                "–" if m["matview_s"] is None else f"{m['matview_s']:.3f}",
                fmt_ratio(m["full_over_diff"]),
                fmt_ratio(m["matview_over_diff"]),
                ok,
            ]
        )
    return rows


def plot(results: dict[str, QueryResult], path: Path) -> None:
    plt = pyplot()
    names, ratios, mv = [], [], []
    for name, r in results.items():
        m = r.medians()
        if r.accepted and m["full_over_diff"]:
            names.append(name.upper())
            ratios.append(m["full_over_diff"])
            mv.append(m["matview_over_diff"] or 0.0)
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(names) + 2), 4))
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], ratios, 0.4, label="pgtrickle FULL / DIFFERENTIAL", color="#e76f51")
    ax.bar([x + 0.2 for x in xs], mv, 0.4, label="REFRESH MATERIALIZED VIEW / DIFFERENTIAL", color="#8d99ae")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks(list(xs), names, fontsize=7, rotation=45)
    ax.set_ylabel("time ratio (>1: DIFFERENTIAL faster)")
    ax.legend(fontsize=7)
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.set_title("TPC-H-derived queries: refresh time ratios to DIFFERENTIAL (medians)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def docs_section(report: dict[str, Any], results: dict[str, QueryResult], plot_path: Path) -> str:
    accepted = [r for r in results.values() if r.accepted]
    refused = [r for r in results.values() if not r.accepted]
    title = (
        "TPC-H-derived workload: DIFFERENTIAL vs FULL per query"
        if report["rounds"]
        else "TPC-H-derived queries: which ones pgtrickle accepts as DIFFERENTIAL"
    )
    if report["char_columns"]:
        title += ", the specification's `char(n)` columns"
    lines = header_lines(title, report, "benchmarks/tpch.py")
    counts = report["table_rows"]
    ch = report["changes_per_round"]
    if not report["rounds"]:
        lines += [
            f"Scale factor {report['sf']:g}, schema with "
            + ("the specification's `char(n)` columns" if report["char_columns"] else "`varchar(n)` columns")
            + ". Each query is created with `refresh_mode => 'DIFFERENTIAL'` and refreshed once (no rounds of "
            "changes).",
            "",
            f"**{len(accepted)} of {len(results)} queries accepted**, {len(refused)} refused.",
            "",
        ]
        if accepted:
            lines += [
                "Accepted: " + ", ".join(f"{r.name.upper()} ({strategy(r.reason)})" for r in accepted),
                "",
            ]
        if refused:
            lines += ["Refused (pgtrickle's reason):", ""]
            lines += [f"- **{r.name.upper()}** at {r.refused_at}: {r.reason}" for r in refused]
        return "\n".join(lines)
    lines += [
        f"Scale factor {report['sf']:g}, "
        + (
            "the specification's `char(n)` columns"
            if report["char_columns"]
            else "`varchar(n)` columns where TPC-H has `char(n)` (see below)"
        )
        + f" (lineitem {counts['lineitem']:,} rows, orders {counts['orders']:,}, "
        f"customer {counts['customer']:,}, part {counts['part']:,}, partsupp {counts['partsupp']:,}), generated "
        "locally by `benchmarks/tpch_data.py` (TPC-H schema and value rules, no dbgen). Every round commits one "
        f"transaction of {ch['orders_inserted']} new orders with their lines, {ch['orders_deleted']} orders "
        f"deleted with their lines, {ch['lineitems_updated']} lines and {ch['orders_updated']} orders updated, "
        f"and a few customers, part-suppliers and suppliers; then every query's DIFFERENTIAL stream table, FULL "
        "stream table and materialized view is refreshed (one at a time), and both stream tables are checked "
        "with the oracle (two-way `EXCEPT ALL` against the defining query). Medians of "
        f"{report['rounds']} round(s) after a warm-up round.",
        "",
        f"**{len(accepted)} of {len(results)} queries accepted** as DIFFERENTIAL stream tables, "
        f"{len(refused)} refused.",
        "",
        *md_table(
            [
                "query",
                "strategy",
                "rows",
                "DIFF refreshes",
                "DIFF s",
                "FULL s",
                "matview s",
                "FULL/DIFF",
                "matview/DIFF",
                "oracle",
            ],
            summary_rows(results),
            right_from=2,
        ),
        "",
    ]
    if refused:
        lines += ["Refused (pgtrickle's reason):", ""]
        lines += [f"- **{r.name.upper()}** at {r.refused_at}: {r.reason}" for r in refused]
        lines.append("")
    strategies = [(r.name.upper(), r.reason) for r in accepted]
    if strategies:
        lines += ["<details><summary>pgtrickle's mode reason per accepted query</summary>", ""]
        lines += [f"- {n}: {why}" for n, why in strategies]
        lines += ["", "</details>", ""]
    problems = report["problems"]
    if problems:
        lines += ["Problems seen in this run:", ""] + [f"- {p}" for p in problems] + [""]
    lines.append(f"![TPC-H ratios](img/{plot_path.name})")
    return "\n".join(lines)


def problems_of(results: dict[str, QueryResult]) -> list[str]:
    out = []
    for r in results.values():
        for label, exact, rounded in (
            ("DIFFERENTIAL", r.oracle_exact, r.oracle_rounded),
            ("FULL", r.full_oracle_exact, r.full_oracle_rounded),
        ):
            if r.accepted and any(exact):
                beyond = (
                    " (all beyond 6 decimals)"
                    if not any(rounded)
                    else f" ({rounded} after rounding to 6 decimals)"
                )
                out.append(
                    f"{r.name.upper()}: the {label} stream table differed from its query by {exact} rows "
                    f"per round{beyond}"
                )
        out += [f"{r.name.upper()}: {e}" for e in r.errors]
        not_diff = [a for a in r.diff_actions if a != "DIFFERENTIAL"]
        if not_diff:
            out.append(
                f"{r.name.upper()}: {len(not_diff)} of {len(r.diff_actions)} refreshes ran {set(not_diff)}"
            )
    return out


# ------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sf", type=float, default=0.01, help="TPC-H scale factor (1 = 6M lineitems)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--new-orders",
        type=int,
        default=0,
        help="new (and deleted) orders per round; default 0.1 %% of the orders (TPC-H's RF1/RF2)",
    )
    parser.add_argument("--queries", default="", help="comma-separated subset, e.g. q01,q06 (default all 22)")
    add_output_args(parser, SECTION, PLOT)
    parser.add_argument("--keep", action="store_true", help="keep the run's database")
    parser.add_argument(
        "--render",
        type=Path,
        default=None,
        help="rewrite the docs section and plot from an earlier run's JSON, run nothing",
    )
    parser.add_argument(
        "--char-columns",
        action="store_true",
        help="use the specification's char(n) columns (default varchar(n): see tpch_data.schema)",
    )
    return parser.parse_args(argv)


def render(path: Path, section: str, plot_path: Path) -> int:
    """The docs section (and plot) of an earlier run, from its JSON."""
    import json

    report = json.loads(path.read_text())
    results = {name: QueryResult(**fields) for name, fields in report["queries"].items()}
    if report["rounds"]:
        plot(results, plot_path)
    write_section(section, docs_section(report, results, plot_path))
    print(f"{DOCS.name} section {section} rewritten from {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        return render(args.render, args.section, args.plot)
    stop_on_signals()
    settings = Settings.from_env().with_overrides(dsn=args.dsn, spark_master=args.spark_master)
    admin_dsn = resolve_dsn(settings)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        host = machine(conn)
    command = command_line("benchmarks/tpch.py", argv)
    all_queries = tpch_data.queries(args.sf)
    wanted = [q.strip() for q in args.queries.split(",") if q.strip()] or list(all_queries)
    queries = {q: all_queries[q] for q in wanted}
    new_orders = args.new_orders or max(5, round(tpch_data.counts(args.sf)["orders"] * 0.001))
    _, generate_s = ensure_dataset(admin_dsn, args.sf, args.char_columns)
    run_db = f"pgtrickle_bench_tpch_run_{__import__('os').getpid()}"
    copy_s = recreate_database(admin_dsn, run_db, template=tpch_db(args.sf, args.char_columns))
    dsn = bench_dsn(admin_dsn, run_db)
    run_settings = settings.with_overrides(dsn=dsn)
    changes: dict[str, int] = {}
    try:
        with spark_running(run_settings) as spark_start, psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP TABLE bench_dataset")
            install(conn)
            counts = table_counts(conn)
            print(
                f"SF {args.sf:g}: {counts}; creating {len(queries)} queries × (DIFFERENTIAL, FULL, matview)…",
                flush=True,
            )
            results = create_all(conn, run_settings, dsn, queries)
            if args.rounds:
                print("  warm-up round", flush=True)
                tpch_data.apply_changes(conn, args.sf, new_orders, 0.5)
                run_round(conn, run_settings, dsn, results, record=False)
            for i in range(args.rounds):
                started = time.monotonic()
                changes = tpch_data.apply_changes(conn, args.sf, new_orders, (i + 1) / 100)
                print(
                    f"  round {i + 1}/{args.rounds}: changes {changes} in {time.monotonic() - started:.2f}s",
                    flush=True,
                )
                run_round(conn, run_settings, dsn, results, record=True)
    finally:
        if args.keep:
            print(f"kept database {run_db}")
        else:
            drop_database(admin_dsn, run_db)
    report: dict[str, Any] = {
        "command": command,
        "date": now_text(),
        "preset": args.preset,
        "machine": host,
        "revision": revision(),
        "spark_master": settings.spark_master,
        "spark_startup_s": round(spark_start, 2),
        "sf": args.sf,
        "char_columns": args.char_columns,
        "rounds": args.rounds,
        "new_orders": new_orders,
        "table_rows": counts,
        "changes_per_round": changes,
        "generate_s": round(generate_s, 1),
        "copy_s": round(copy_s, 1),
        "accepted": [r.name for r in results.values() if r.accepted],
        "refused": {
            r.name: {"at": r.refused_at, "reason": r.reason} for r in results.values() if not r.accepted
        },
        "summary": {r.name: r.medians() for r in results.values() if r.accepted},
        "queries": {name: asdict(r) for name, r in results.items()},
        "problems": problems_of(results),
    }
    print(
        "\n"
        + "\n".join(
            md_table(
                [
                    "query",
                    "strategy",
                    "rows",
                    "DIFF refreshes",
                    "DIFF s",
                    "FULL s",
                    "matview s",
                    "FULL/DIFF",
                    "matview/DIFF",
                    "oracle",
                ],
                summary_rows(results),
                right_from=2,
            )
        )
    )
    for r in results.values():
        if not r.accepted:
            print(f"refused {r.name}: {r.refused_at}: {r.reason}")
    write_json(report, args.json, "tpch")
    if not args.no_docs:
        if args.rounds:
            plot(results, args.plot)
        write_section(args.section, docs_section(report, results, args.plot))
        print(f"{DOCS.name} section {args.section} and {args.plot.name} updated", flush=True)
    for p in report["problems"]:
        print(f"PROBLEM: {p}", file=sys.stderr)
    return (
        1 if any(r.accepted and any([*r.oracle_exact, *r.full_oracle_exact]) for r in results.values()) else 0
    )


if __name__ == "__main__":
    sys.exit(main())
