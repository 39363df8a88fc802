"""What ``pgtrickle refresh`` and ``install`` print about failures and repairs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pgtrickle.daemon.serving import Summary
from pgtrickle.db.redaction import scrub

_RESULT_STYLE = {"REFRESHED": "green", "FAILED": "red", "SKIPPED": "yellow"}


def refresh_results(console: Console, document: Mapping[str, Any]) -> None:
    """One row per stream table (upstream first), each failure's error in full, and the summary.

    Drawn from the ``--json`` document (``results_document``), refreshed here or by a daemon alike.
    """
    # Name and reason fold; result, action and the figures are never cut (scripts grep them).
    table = Table()
    table.add_column("stream table", overflow="fold", ratio=2)
    for name in ("result", "action"):
        table.add_column(name, no_wrap=True, min_width=len("DIFFERENTIAL") if name == "action" else None)
    table.add_column("why", overflow="fold", ratio=3)
    for name in ("inserted", "deleted", "seconds", "jobs"):
        table.add_column(name, no_wrap=True, justify="right")
    tables = document["stream_tables"]
    for t in tables:
        ran = t["action"] is not None
        why = "see below" if t["result"] == "FAILED" else t["reason"]
        table.add_row(
            escape(t["name"]),
            f"[{_RESULT_STYLE[t['result']]}]{t['result']}[/]",
            t["action"] if ran else "-",
            escape(scrub(why)),
            f"{t['rows_inserted']:,}" if ran else "-",
            f"{t['rows_deleted']:,}" if ran else "-",
            f"{t['seconds']:.2f}" if ran else "-",
            str(t["spark_jobs"]) if t.get("spark_jobs") is not None else "-",
        )
    console.print(table)
    for t in tables:
        if t["result"] == "FAILED":
            console.print(
                f"[red]✗[/] {escape(t['name'])} FAILED: {escape(scrub(t['reason']))}",
                highlight=False,
                soft_wrap=True,
            )
    s = document["summary"]
    summary = Summary(s["refreshed"], s["failed"], s["skipped"])
    colour = "red" if summary.failed else "green"
    console.print(f"[{colour}]{escape(summary.text())}[/]", highlight=False)


def capture_repairs(console: Console, repaired: Sequence) -> None:
    """What ``pgtrickle install`` repaired (nothing printed when nothing was broken)."""
    for r in repaired:
        console.print(
            f"[yellow]repaired[/] the change capture of {escape(r.source)}: {escape('; '.join(r.problems))}",
            highlight=False,
            soft_wrap=True,
        )
        if r.reinitialized:
            readers = escape(", ".join(r.reinitialized))
            console.print(
                f"  changes may have been lost: the next refresh of {readers} is FULL (reinitialization)",
                highlight=False,
                soft_wrap=True,
            )
