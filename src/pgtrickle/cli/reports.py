"""What ``pgtrickle refresh`` and ``install`` print about failures and repairs."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pgtrickle.db.redaction import scrub

_RESULT_STYLE = {"REFRESHED": "green", "FAILED": "red", "SKIPPED": "yellow"}


def refresh_results(console: Console, results: Sequence) -> None:
    """One row per stream table (upstream first), each failure's error in full, and the summary."""
    from pgtrickle.daemon.manual import Result, summarize

    # Name and reason fold; result, action and the figures are never cut (scripts grep them).
    table = Table()
    table.add_column("stream table", overflow="fold", ratio=2)
    for name in ("result", "action"):
        table.add_column(name, no_wrap=True, min_width=len("DIFFERENTIAL") if name == "action" else None)
    table.add_column("why", overflow="fold", ratio=3)
    for name in ("inserted", "deleted", "seconds", "jobs"):
        table.add_column(name, no_wrap=True, justify="right")
    for r in results:
        o = r.outcome
        why = "see below" if r.result is Result.FAILED else r.reason
        table.add_row(
            escape(r.st.display),
            f"[{_RESULT_STYLE[r.result.value]}]{r.result.value}[/]",
            o.action.value if o else "-",
            escape(scrub(why)),
            f"{o.rows_inserted:,}" if o else "-",
            f"{o.rows_deleted:,}" if o else "-",
            f"{o.seconds:.2f}" if o else "-",
            str(o.spark_jobs) if o and o.spark_jobs is not None else "-",
        )
    console.print(table)
    for r in results:
        if r.result is Result.FAILED:
            console.print(
                f"[red]✗[/] {escape(r.st.display)} FAILED: {escape(scrub(r.reason))}",
                highlight=False,
                soft_wrap=True,
            )
    summary = summarize(results)
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
