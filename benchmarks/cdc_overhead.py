"""Write overhead of change capture: none, row trigger, pgtrickle's statement trigger, WAL.

Four identical tables ``(id bigint PRIMARY KEY, grp int, v numeric(12,2), note text)``:

* ``none``              no capture (the baseline);
* ``row_trigger``       a PL/pgSQL ``FOR EACH ROW`` AFTER trigger, written here, filling a buffer of the
                        same shape as pgtrickle's one-row-per-change table (``LIKE`` the statement-trigger
                        buffer's ``_rows`` table, so the same identity and defaults) with xid, action and
                        new_/old_ columns — the design pgtrickle chose not to build;
* ``statement_trigger`` pgtrickle's capture: statement-level triggers with transition tables, installed by
                        ``pgtrickle.create_stream_table(..., initialize => false)`` (INSERTed and DELETEd
                        rows packed 4096 to a row in the buffer's ``_batches`` table);
* ``wal``               pgtrickle's WAL capture: the same, then ``pgtrickle.set_cdc_mode(table, 'wal')`` and
                        ``CaptureManager.reconcile()`` with a :class:`DecoderThread` started as the daemon
                        starts it — no triggers, REPLICA IDENTITY FULL, a logical slot decoded into the
                        buffer.

Method. Each of ``--repeat`` runs starts from an empty (TRUNCATEd) table and times, each in its own
autocommit transaction (so the time includes the commit's WAL flush), a bulk ``INSERT … SELECT
generate_series`` of ``--rows`` rows, an ``UPDATE`` of every row (``SET v = v + 1``) and a ``DELETE`` of
every row. Operations are interleaved — all variants do the INSERT, then all the UPDATE, … — and the
variant order rotates from run to run, so drift on this noisy machine spreads over all variants. Before
every timed statement, untimed and identically for every variant: the change buffer is emptied
(``DELETE`` from every table behind it) and the table and buffer are ``VACUUM``ed (dead rows, hint bits and the visibility map are
then the same for everybody), then a ``CHECKPOINT`` (every variant pays the same full-page images).
Autovacuum is off on these tables. Reported: the median seconds; the overhead ``(variant − none) / rows``
in µs per row and the ratio ``variant / none``, each the median over runs of the run's own pair (the two
were measured seconds apart, so slow drift cancels); the server process's CPU time per row over the
baseline's (medians; read from ``/proc`` when the server runs on this machine — steadier than wall time
when other work competes for the CPUs, but blind to waiting for WAL flushes); and the WAL written.

The WAL variant's figure is the write path only: the decoder works asynchronously. Separately, the
decoder's throughput is the number of changes divided by the time from the commit of the statement to
:func:`pgtrickle.cdc.wal.wait_for_decoder` returning (every change is then in the buffer). The decoder
runs only while the ``wal`` variant is measured (it is caught up before the timed statement and stopped
afterwards): a running walsender decodes every write of the database, including the other variants', and
on two cores it would compete with them. ``--decoder-always-on`` keeps it running throughout, as the
daemon does, to see that cost. Every capture variant's buffer is checked to hold exactly one row per
changed row.

    .venv/bin/python benchmarks/cdc_overhead.py [--rows 200000] [--repeat 3] [--dsn ...] [--json out.json]

Uses the embedded PostgreSQL (started if needed) unless --dsn is given; works in a database named
``pgtrickle_cdc_bench`` (created, and dropped at the end together with its replication slot).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402
from psycopg.conninfo import make_conninfo  # noqa: E402

from common import command_line, header_lines, machine, now_text, revision, write_section  # noqa: E402
from pgtrickle.catalog.install import install  # noqa: E402
from pgtrickle.cdc.modes import CaptureManager  # noqa: E402
from pgtrickle.cdc.wal import DecoderThread, decoder_slot, wait_for_decoder  # noqa: E402
from pgtrickle.config import Settings  # noqa: E402
from pgtrickle.db.connection import resolve_dsn  # noqa: E402

DATABASE = "pgtrickle_cdc_bench"
VARIANTS = ("none", "row_trigger", "statement_trigger", "wal")
OPERATIONS = ("insert", "update", "delete")
ROW_BUFFER = "row_trigger_changes"
TARGET_STATEMENT_US_PER_ROW = 1.0
TARGET_DECODER_CHANGES_PER_S = 100_000.0
DECODER_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Variant:
    name: str
    table: str
    buffer: tuple[str, str] | None  # (schema, name) of the change buffer; None for the baseline
    parts: tuple[tuple[str, str], ...] = ()  # the tables behind the buffer (pgtrickle's is a view)

    def buffer_ident(self) -> sql.Identifier:
        assert self.buffer is not None
        return sql.Identifier(*self.buffer)

    def part_idents(self) -> list[sql.Identifier]:
        return [sql.Identifier(*p) for p in (self.parts or ((self.buffer,) if self.buffer else ()))]


@dataclass
class Samples:
    """Raw per-run figures of one (variant, operation)."""

    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)  # of the backend running the statement
    wal_bytes: list[int] = field(default_factory=list)
    decoder_seconds: list[float] = field(default_factory=list)


# ------------------------------------------------------------------- the decoder


class Decoder:
    """Starts and stops the WAL decoder thread the way ``Scheduler.ensure_decoder`` does."""

    def __init__(self, conn: psycopg.Connection, dsn: str) -> None:
        self.conn = conn
        self.dsn = dsn
        self.thread: DecoderThread | None = None
        self.errors: list[str] = []

    def ensure(self) -> None:
        """The ``start_decoder`` callback of :class:`CaptureManager`."""
        slot = decoder_slot(self.conn)
        if slot is None:
            return
        if self.thread is None or not self.thread.alive:
            self.thread = DecoderThread(self.dsn, slot, on_error=lambda exc: self.errors.append(str(exc)))
            self.thread.start()
            # Until the thread holds the slot, wait_for_decoder would decode in this process instead.
            self._wait_slot(active=True)

    def stop(self) -> None:
        """Stop the thread and wait until the server has released the slot."""
        if self.thread is None:
            return
        self.thread.stop()
        self.thread = None
        self._wait_slot(active=False)

    def _wait_slot(self, *, active: bool, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            row = self.conn.execute(
                "SELECT coalesce(bool_or(active), false) FROM pg_replication_slots"
                " WHERE database = current_database()"
            ).fetchone()
            if row is not None and row[0] == active:
                return
            time.sleep(0.02)
        raise RuntimeError(
            f"the replication slot did not become {'active' if active else 'inactive'} within {timeout:.0f}s"
        )

    def catch_up(self) -> float:
        """Seconds until every committed change is in the buffers."""
        started = time.perf_counter()
        wait_for_decoder(self.conn, self.dsn, timeout=DECODER_TIMEOUT_S)
        return time.perf_counter() - started


# ------------------------------------------------------------------------- setup


def scalar(conn: psycopg.Connection, query: str, params: tuple[object, ...] = ()) -> object:
    row = conn.execute(query, params or None).fetchone()
    assert row is not None
    return row[0]


def create_sources(conn: psycopg.Connection) -> None:
    for name in VARIANTS:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigint PRIMARY KEY, grp int, v numeric(12,2), note text)"
                " WITH (autovacuum_enabled = off)"
            ).format(sql.Identifier(f"src_{name}"))
        )


def create_stream_table(conn: psycopg.Connection, variant: str) -> tuple[str, str]:
    """A stream table reading every column of the source; returns the source's change buffer."""
    table = f"src_{variant}"
    conn.execute(
        "SELECT pgtrickle.create_stream_table(%s, %s, schedule => '1h', refresh_mode => 'FULL',"
        " initialize => false)",
        (f"st_{variant}", f"SELECT id, grp, v, note FROM {table}"),
    )
    buffer = str(
        scalar(
            conn,
            "SELECT buffer_name FROM pgtrickle.pgt_change_sources WHERE source_relid = %s::regclass",
            (table,),
        )
    )
    for part in buffer_parts(buffer):
        conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = off)").format(sql.Identifier(*part)))
    return ("pgtrickle_changes", buffer)


def buffer_parts(buffer: str) -> tuple[tuple[str, str], ...]:
    """The tables behind pgtrickle's buffer view: one row per change, and packed statement batches."""
    return (("pgtrickle_changes", f"{buffer}_rows"), ("pgtrickle_changes", f"{buffer}_batches"))


def buffer_columns(conn: psycopg.Connection, table: str) -> list[tuple[str, str]]:
    """(source column, buffer column suffix) pairs pgtrickle captures for ``table``."""
    cols = scalar(
        conn, "SELECT columns FROM pgtrickle.pgt_change_sources WHERE source_relid = %s::regclass", (table,)
    )
    return [(c["name"], c["buf"]) for c in cols]


def create_row_trigger(
    conn: psycopg.Connection, like_buffer: tuple[str, str], columns: list[tuple[str, str]]
) -> tuple[str, str]:
    """The row-level alternative: same buffer shape, one INSERT per changed row.

    No ``SET search_path`` on the function (names are qualified instead): a per-function setting is
    restored on every call, which a row trigger would pay per row.
    """
    conn.execute(
        sql.SQL("CREATE TABLE public.{} (LIKE {} INCLUDING ALL) WITH (autovacuum_enabled = off)").format(
            sql.Identifier(ROW_BUFFER), sql.Identifier(*buffer_parts(like_buffer[1])[0])
        )
    )

    def cols(prefix: str) -> sql.Composable:
        return sql.SQL(", ").join(sql.Identifier(f"{prefix}_{buf}") for _, buf in columns)

    def vals(record: str) -> sql.Composable:
        return sql.SQL(", ").join(
            sql.SQL("{}.{}").format(sql.SQL(record), sql.Identifier(name)) for name, _ in columns
        )

    target = sql.SQL("public.{}").format(sql.Identifier(ROW_BUFFER))
    body = sql.SQL("""
CREATE FUNCTION public.row_capture() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {t} (xid, action, {new}) VALUES (pg_catalog.pg_current_xact_id(), 'I', {nv});
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO {t} (xid, action, {new}, {old}) VALUES (pg_catalog.pg_current_xact_id(), 'U', {nv}, {ov});
    ELSE
        INSERT INTO {t} (xid, action, {old}) VALUES (pg_catalog.pg_current_xact_id(), 'D', {ov});
    END IF;
    RETURN NULL;
END
$f$""").format(t=target, new=cols("new"), old=cols("old"), nv=vals("NEW"), ov=vals("OLD"))
    conn.execute(body)
    conn.execute(
        "CREATE TRIGGER row_capture AFTER INSERT OR UPDATE OR DELETE ON src_row_trigger"
        " FOR EACH ROW EXECUTE FUNCTION public.row_capture()"
    )
    return ("public", ROW_BUFFER)


def move_to_wal(conn: psycopg.Connection, decoder: Decoder) -> None:
    """As the daemon does it: the source's cdc_mode, then one reconcile, which starts the decoder."""
    conn.execute("SELECT pgtrickle.set_cdc_mode('src_wal', 'wal')")
    moves = CaptureManager(conn, decoder.ensure).reconcile()
    row = conn.execute(
        "SELECT (SELECT count(*) FROM pg_trigger WHERE tgrelid = 'src_wal'::regclass AND NOT tgisinternal),"
        " (SELECT relreplident FROM pg_class WHERE oid = 'src_wal'::regclass), cdc_mode, cdc_reason"
        " FROM pgtrickle.pgt_change_sources WHERE source_relid = 'src_wal'::regclass"
    ).fetchone()
    assert row is not None
    triggers, identity, mode, reason = row
    if mode != "wal" or triggers or identity != "f":
        raise RuntimeError(
            f"src_wal did not move to WAL capture (mode {mode}, {triggers} triggers, "
            f"replica identity {identity!r}, reason {reason!r}, moves {moves})"
        )


def setup(conn: psycopg.Connection, decoder: Decoder) -> dict[str, Variant]:
    install(conn)
    create_sources(conn)
    buffers: dict[str, tuple[str, str] | None] = {"none": None}
    buffers["statement_trigger"] = create_stream_table(conn, "statement_trigger")
    buffers["wal"] = create_stream_table(conn, "wal")
    buffers["row_trigger"] = create_row_trigger(
        conn, buffers["statement_trigger"], buffer_columns(conn, "src_statement_trigger")
    )
    move_to_wal(conn, decoder)
    return {
        name: Variant(
            name,
            f"src_{name}",
            buffers[name],
            buffer_parts(buffers[name][1]) if buffers[name] and name != "row_trigger" else (),
        )
        for name in VARIANTS
    }


# --------------------------------------------------------------------- measuring


def statement(operation: str, table: str, rows: int) -> sql.Composable:
    ident = sql.Identifier(table)
    if operation == "insert":
        return sql.SQL(
            "INSERT INTO {} SELECT g, g % 1000, (g % 99991) / 100.0, 'note ' || g"
            " FROM generate_series(1, {}) g"
        ).format(ident, sql.Literal(rows))
    if operation == "update":
        return sql.SQL("UPDATE {} SET v = v + 1").format(ident)
    return sql.SQL("DELETE FROM {}").format(ident)


def backend_cpu_seconds(conn: psycopg.Connection) -> float | None:
    """CPU time (user + system) the connection's server process has used, when the server is local.

    Less disturbed by other work on a shared machine than wall time (it leaves out
    waiting for the CPU and for WAL flushes); ``None`` for a remote server.
    """
    pid = conn.info.backend_pid
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wal_lsn(conn: psycopg.Connection) -> int:
    return int(scalar(conn, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))


def prepare(
    conn: psycopg.Connection, variant: Variant, operation: str, decoder: Decoder, decoder_always_on: bool
) -> None:
    """Bring the variant to the same starting state as every other one (untimed)."""
    if operation == "insert":
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(variant.table)))
    if variant.name == "wal" or decoder_always_on:
        decoder.ensure()
        decoder.catch_up()  # everything before, including a TRUNCATE, is in the buffer now
    for part in variant.part_idents():
        conn.execute(sql.SQL("DELETE FROM {}").format(part))
        conn.execute(sql.SQL("VACUUM {}").format(part))
    conn.execute(sql.SQL("VACUUM {}").format(sql.Identifier(variant.table)))
    conn.execute("CHECKPOINT")


def check_captured(conn: psycopg.Connection, variant: Variant, operation: str, rows: int) -> None:
    if variant.buffer is None:
        return
    action = {"insert": "I", "update": "U", "delete": "D"}[operation]
    got = conn.execute(
        sql.SQL("SELECT count(*) FILTER (WHERE action = %s), count(*) FROM {}").format(
            variant.buffer_ident()
        ),
        (action,),
    ).fetchone()
    if got is None or tuple(got) != (rows, rows):
        raise RuntimeError(
            f"{variant.name} {operation}: expected {rows} '{action}' rows in "
            f"{'.'.join(variant.buffer)}, found {got}"
        )


def measure(
    conn: psycopg.Connection,
    variant: Variant,
    operation: str,
    rows: int,
    decoder: Decoder,
    decoder_always_on: bool,
    samples: Samples,
) -> None:
    prepare(conn, variant, operation, decoder, decoder_always_on)
    query = statement(operation, variant.table, rows)
    lsn = wal_lsn(conn)
    cpu = backend_cpu_seconds(conn)
    started = time.perf_counter()
    conn.execute(query)
    samples.seconds.append(time.perf_counter() - started)
    if cpu is not None:
        samples.cpu_seconds.append((backend_cpu_seconds(conn) or 0.0) - cpu)
    samples.wal_bytes.append(wal_lsn(conn) - lsn)
    if variant.name == "wal":
        samples.decoder_seconds.append(decoder.catch_up())
        if not decoder_always_on:
            decoder.stop()
    check_captured(conn, variant, operation, rows)


def run(
    conn: psycopg.Connection,
    variants: dict[str, Variant],
    rows: int,
    repeat: int,
    decoder: Decoder,
    decoder_always_on: bool,
    progress: Callable[[str], None],
) -> dict[tuple[str, str], Samples]:
    samples = {(v, op): Samples() for v in VARIANTS for op in OPERATIONS}
    if not decoder_always_on:
        decoder.stop()
    for run_no in range(repeat):
        order = VARIANTS[run_no % len(VARIANTS) :] + VARIANTS[: run_no % len(VARIANTS)]
        for operation in OPERATIONS:
            for name in order:
                measure(
                    conn,
                    variants[name],
                    operation,
                    rows,
                    decoder,
                    decoder_always_on,
                    samples[name, operation],
                )
            progress(
                f"  run {run_no + 1} {operation:<6} "
                + ", ".join(f"{name} {samples[name, operation].seconds[-1]:.3f}s" for name in VARIANTS)
            )
    return samples


# ----------------------------------------------------------------------- figures


def figures(samples: dict[tuple[str, str], Samples], rows: int) -> dict[str, dict[str, dict[str, object]]]:
    out: dict[str, dict[str, dict[str, object]]] = {}
    for name in VARIANTS:
        out[name] = {}
        for operation in OPERATIONS:
            s, base = samples[name, operation], samples["none", operation]
            # Paired: each run's variant against the same run's baseline, measured seconds apart.
            overheads = [(x - b) / rows * 1e6 for x, b in zip(s.seconds, base.seconds, strict=True)]
            ratios = [x / b for x, b in zip(s.seconds, base.seconds, strict=True)]
            entry: dict[str, object] = {
                "median_s": round(statistics.median(s.seconds), 4),
                "cpu_overhead_us_per_row": (
                    round(
                        (statistics.median(s.cpu_seconds) - statistics.median(base.cpu_seconds)) / rows * 1e6,
                        3,
                    )
                    if s.cpu_seconds and base.cpu_seconds
                    else None
                ),
                "runs_s": [round(x, 4) for x in s.seconds],
                "overhead_us_per_row": round(statistics.median(overheads), 3),
                "ratio_to_none": round(statistics.median(ratios), 3),
                "wal_mb": round(statistics.median(s.wal_bytes) / 2**20, 1),
            }
            if s.decoder_seconds:
                decode = statistics.median(s.decoder_seconds)
                entry["decoder_commit_to_buffer_s"] = round(decode, 4)
                entry["decoder_runs_s"] = [round(x, 4) for x in s.decoder_seconds]
                entry["decoder_changes_per_s"] = round(rows / decode)
            out[name][operation] = entry
    return out


def markdown(table: dict[str, dict[str, dict[str, object]]]) -> str:
    lines = [
        "| variant | operation | seconds | µs/row overhead | backend CPU µs/row | ratio to none | WAL MB |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in VARIANTS:
        for operation in OPERATIONS:
            e = table[name][operation]
            cpu = e["cpu_overhead_us_per_row"]
            lines.append(
                f"| {name} | {operation} | {e['median_s']:.3f} | {e['overhead_us_per_row']:+.2f} | "
                f"{'n/a' if cpu is None else format(cpu, '+.2f')} | "
                f"×{e['ratio_to_none']:.2f} | {e['wal_mb']:.0f} |"
            )
    lines += ["", "| WAL decoder | commit → all changes in the buffer | changes/s |", "| --- | ---: | ---: |"]
    for operation in OPERATIONS:
        e = table["wal"][operation]
        lines.append(
            f"| {operation} | {e['decoder_commit_to_buffer_s']:.3f}s | {e['decoder_changes_per_s']:,} |"
        )
    return "\n".join(lines)


def targets(table: dict[str, dict[str, dict[str, object]]]) -> dict[str, dict[str, object]]:
    statement_us = float(str(table["statement_trigger"]["insert"]["overhead_us_per_row"]))
    decoder = {op: float(str(table["wal"][op]["decoder_changes_per_s"])) for op in ("insert", "update")}
    return {
        "statement_trigger_insert_overhead_us_per_row": {
            "target": f"<= {TARGET_STATEMENT_US_PER_ROW}",
            "measured": statement_us,
            "result": "PASS" if statement_us <= TARGET_STATEMENT_US_PER_ROW else "MISS",
        },
        **{
            f"decoder_{op}_changes_per_s": {
                "target": f">= {TARGET_DECODER_CHANGES_PER_S:.0f}",
                "measured": rate,
                "result": "PASS" if rate >= TARGET_DECODER_CHANGES_PER_S else "MISS",
            }
            for op, rate in decoder.items()
        },
    }


# ------------------------------------------------------------------ the database


def drop_database(admin_dsn: str) -> None:
    """Drop the benchmark database and its replication slots (a slot would keep the database alive)."""
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        for slot, pid in admin.execute(
            "SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s", (DATABASE,)
        ).fetchall():
            if pid is not None:  # a walsender of this benchmark's decoder
                admin.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))
            admin.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dsn", default=None)
    parser.add_argument(
        "--decoder-always-on",
        action="store_true",
        help="keep the WAL decoder running while the other variants are measured too",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--section",
        default=None,
        help="also rewrite this generated section of docs/BENCHMARKS.md (e.g. suite-cdc)",
    )
    parser.add_argument("--preset", default=None, help="the suite preset this run belongs to (a label)")
    args = parser.parse_args()

    admin_dsn = resolve_dsn(Settings.from_env().with_overrides(dsn=args.dsn))
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        host = machine(admin)
    drop_database(admin_dsn)
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    dsn = make_conninfo(admin_dsn, dbname=DATABASE)
    try:
        with psycopg.connect(dsn, autocommit=True, application_name="pgtrickle-cdc-bench") as conn:
            decoder = Decoder(conn, dsn)
            try:
                print(f"{args.rows:,} rows, {args.repeat} runs; setting up the four variants…", flush=True)
                variants = setup(conn, decoder)
                samples = run(
                    conn,
                    variants,
                    args.rows,
                    args.repeat,
                    decoder,
                    args.decoder_always_on,
                    lambda line: print(line, flush=True),
                )
                server = str(scalar(conn, "SHOW server_version"))
            finally:
                decoder.stop()
    finally:
        drop_database(admin_dsn)

    table = figures(samples, args.rows)
    verdicts = targets(table)
    result = {
        "machine": f"{platform.machine()} {platform.processor() or ''} cores={os.cpu_count()}",
        "postgresql": server,
        "rows": args.rows,
        "repeat": args.repeat,
        "decoder_always_on": args.decoder_always_on,
        "decoder_errors": decoder.errors,
        "variants": table,
        "targets": verdicts,
    }
    print()
    print(markdown(table))
    print()
    for key, verdict in verdicts.items():
        print(f"{verdict['result']}: {key} = {verdict['measured']:,} (target {verdict['target']})")
    if decoder.errors:
        print(f"decoder errors (it restarted): {decoder.errors}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    if args.section:
        report = {
            "command": command_line("benchmarks/cdc_overhead.py", None),
            "date": now_text(),
            "preset": args.preset,
            "machine": host,
            "revision": revision(),
        }
        lines = header_lines(
            "Change capture: write overhead and decoder throughput", report, "benchmarks/cdc_overhead.py"
        )
        lines += [
            f"{args.rows:,} rows per statement, median of {args.repeat} run(s); variants and method as "
            "described in the hand-written section above (`none`, a row-level trigger, pgtrickle's "
            "statement-level triggers, pgtrickle's WAL capture).",
            "",
            markdown(table),
            "",
        ]
        lines += [
            f"- {verdict['result']}: {key} = {verdict['measured']:,} (target {verdict['target']})"
            for key, verdict in verdicts.items()
        ]
        write_section(args.section, "\n".join(lines))


if __name__ == "__main__":
    main()
