"""Statement-trigger capture designs side by side: pgtrickle's packed batches vs one buffer row per change.

Three identical tables ``(id bigint primary key, grp int, v numeric(12,2), note text)``:

* ``none``    no capture (the baseline);
* ``rows``    the design pgtrickle had before: a statement-level AFTER INSERT trigger with a transition
              table writing one buffer row per inserted row (identity change id, xid, action,
              captured_at, new_/old_ columns);
* ``packed``  pgtrickle's capture as installed by ``pgtrickle.create_stream_table`` (rows packed up to
              4096 to a batch row, one array per column).

Each of ``--repeat`` rounds runs, for every design in a rotating order, a ``--rows``-row bulk INSERT
into the emptied table right after the same INSERT into the baseline table (both after a CHECKPOINT),
and records wall time and the CPU time of the server process (from ``/proc``; the server must run on
this machine — the embedded one does). Reported per design: the median over rounds of the paired
wall-time overhead per row, its quartiles, and the difference of median CPU times per row.

    .venv/bin/python benchmarks/capture_designs.py [--rows 200000] [--repeat 9] [--json out.json]

Works in a database ``pgtrickle_capture_bench`` of the embedded PostgreSQL (created and dropped).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402
from psycopg.conninfo import make_conninfo  # noqa: E402

from pgtrickle.catalog.install import install  # noqa: E402
from pgtrickle.config import Settings  # noqa: E402
from pgtrickle.db.connection import resolve_dsn  # noqa: E402

DATABASE = "pgtrickle_capture_bench"
DESIGNS = ("rows", "packed")

ROWS_TRIGGER = """
CREATE TABLE rows_buffer (
    change_id bigint GENERATED ALWAYS AS IDENTITY (CACHE 1000), xid xid8 NOT NULL, action "char" NOT NULL,
    captured_at timestamptz NOT NULL DEFAULT now(),
    new_id bigint, new_grp int, new_v numeric(12,2), new_note text,
    old_id bigint, old_grp int, old_v numeric(12,2), old_note text) WITH (autovacuum_enabled = off);
CREATE FUNCTION rows_capture() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    INSERT INTO rows_buffer (xid, action, new_id, new_grp, new_v, new_note)
    SELECT pg_current_xact_id(), 'I', n.id, n.grp, n.v, n.note FROM __new n;
    RETURN NULL;
END $$;
CREATE TRIGGER rows_capture AFTER INSERT ON t_rows REFERENCING NEW TABLE AS __new
    FOR EACH STATEMENT EXECUTE FUNCTION rows_capture();
"""


def backend_cpu(conn: psycopg.Connection) -> float:
    fields = Path(f"/proc/{conn.info.backend_pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def setup(conn: psycopg.Connection) -> str:
    install(conn)
    for name in ("none", *DESIGNS):
        conn.execute(
            f"CREATE TABLE t_{name} (id bigint PRIMARY KEY, grp int, v numeric(12,2), note text)"
            " WITH (autovacuum_enabled = off)"
        )
    conn.execute(ROWS_TRIGGER)
    conn.execute(
        "SELECT pgtrickle.create_stream_table('st_packed', 'SELECT id, grp, v, note FROM t_packed',"
        " schedule => '1h', refresh_mode => 'FULL', initialize => false)"
    )
    buffer = conn.execute(
        "SELECT buffer_name FROM pgtrickle.pgt_change_sources WHERE source_relid = 't_packed'::regclass"
    ).fetchone()[0]  # type: ignore[index]
    return str(buffer)


def timed(conn: psycopg.Connection, name: str, rows: int, buffer: str) -> tuple[float, float]:
    conn.execute(f"TRUNCATE t_{name}")
    if name == "rows":
        conn.execute("TRUNCATE rows_buffer")
    elif name == "packed":
        conn.execute(f'TRUNCATE pgtrickle_changes."{buffer}_rows", pgtrickle_changes."{buffer}_batches"')
    conn.execute("CHECKPOINT")
    cpu, started = backend_cpu(conn), time.perf_counter()
    conn.execute(
        f"INSERT INTO t_{name} SELECT g, g % 1000, (g % 99991) / 100.0, 'note ' || g"
        f" FROM generate_series(1, {rows}) g"
    )
    return time.perf_counter() - started, backend_cpu(conn) - cpu


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    admin_dsn = resolve_dsn(Settings())
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        admin.execute(f"CREATE DATABASE {DATABASE}")
    try:
        with psycopg.connect(make_conninfo(admin_dsn, dbname=DATABASE), autocommit=True) as conn:
            buffer = setup(conn)
            wall: dict[str, list[float]] = {d: [] for d in DESIGNS}
            cpu: dict[str, list[float]] = {d: [] for d in ("none", *DESIGNS)}
            for round_no in range(args.repeat):
                for i in range(len(DESIGNS)):
                    design = DESIGNS[(i + round_no) % len(DESIGNS)]
                    base_s, base_cpu = timed(conn, "none", args.rows, buffer)
                    s, c = timed(conn, design, args.rows, buffer)
                    wall[design].append((s - base_s) / args.rows * 1e6)
                    cpu["none"].append(base_cpu)
                    cpu[design].append(c)
                print(
                    f"round {round_no + 1}: " + ", ".join(f"{d} +{wall[d][-1]:.2f}" for d in DESIGNS),
                    file=sys.stderr,
                )
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
    result = {}
    print("| design | wall µs/row over none (median, q1–q3) | server CPU µs/row over none |")
    print("| --- | ---: | ---: |")
    for design in DESIGNS:
        q = statistics.quantiles(wall[design], n=4)
        extra_cpu = (statistics.median(cpu[design]) - statistics.median(cpu["none"])) / args.rows * 1e6
        result[design] = {
            "wall_us_per_row": round(statistics.median(wall[design]), 3),
            "wall_q1_q3": [round(q[0], 3), round(q[2], 3)],
            "cpu_us_per_row": round(extra_cpu, 3),
        }
        print(
            f"| {design} | +{statistics.median(wall[design]):.2f} ({q[0]:.2f}–{q[2]:.2f}) | +{extra_cpu:.2f} |"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"rows": args.rows, "repeat": args.repeat, "designs": result}, indent=2)
        )


if __name__ == "__main__":
    main()
