"""Daemon-served refresh: the pure decisions (daemon/serving.py) and the output drawn from the document."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from pgtrickle.cli.json_output import dumps, refresh_document, served_document
from pgtrickle.cli.reports import refresh_results
from pgtrickle.daemon.manual import ManualRefresh, Result, results_document
from pgtrickle.daemon.serving import CommandState, Step, error_text, may_claim, next_step, poll_delay
from pgtrickle.errors import PgTrickleError
from pgtrickle.refresh.engine import RefreshOutcome
from pgtrickle.refresh.plan import Action
from tests.unit.test_cli_render import _SqlError, _st

# ------------------------------------------------------------------ waiting


@pytest.mark.parametrize(
    ("state", "live", "elapsed", "step"),
    [
        (CommandState(True, 42, True), [], 0.0, Step.DONE),  # finished, then the daemon exited: still done
        (CommandState(True, 42, True), [42], 999.0, Step.DONE),  # a result beats the timeout
        (CommandState(True, None, False), [7], 1.0, Step.WAIT),  # queued, a daemon will take it
        (CommandState(True, 42, False), [42], 1.0, Step.WAIT),  # being refreshed
        (CommandState(True, None, False), [], 1.0, Step.RUN_HERE),  # the only daemon stopped
        (CommandState(True, 42, False), [7], 1.0, Step.RUN_HERE),  # the daemon that took it died
        (CommandState(True, 42, False), [], 1.0, Step.RUN_HERE),
        (CommandState(True, 42, False), [42], 10.0, Step.TIMEOUT),
        (CommandState(True, None, False), [7], 10.0, Step.TIMEOUT),
        (CommandState(False), [42], 1.0, Step.GONE),
    ],
)
def test_next_step(state: CommandState, live: list[int], elapsed: float, step: Step) -> None:
    assert next_step(state, live, elapsed, timeout=10.0) is step


def test_poll_delay_doubles_to_a_cap() -> None:
    delays = [poll_delay(i) for i in range(10)]
    assert delays[0] == pytest.approx(0.02)
    assert all(b >= a for a, b in zip(delays, delays[1:], strict=False))
    assert max(delays) == 0.5
    assert poll_delay(-3) == poll_delay(0)
    assert sum(delays[:4]) < 0.5  # a quick refresh is noticed quickly even without the NOTIFY


def test_may_claim_leaves_a_stream_table_to_the_process_refreshing_it() -> None:
    assert may_claim([1, 2], [])
    assert may_claim([1, 2], [3])
    assert not may_claim([1, 2], [2])
    assert may_claim(None, [1, 2])  # --all is taken at once


def test_error_text_is_what_the_command_line_prints() -> None:
    assert error_text(PgTrickleError("the circuit breaker of stream table public.t is open")) == (
        "the circuit breaker of stream table public.t is open"
    )

    class Diag:
        message_hint = "Create it first."

    class PgError(Exception):
        diag = Diag()

    assert error_text(PgError("stream table x does not exist\nCONTEXT: PL/pgSQL")) == (
        "stream table x does not exist\nhint: Create it first."
    )
    Diag.message_hint = None  # type: ignore[assignment]
    assert error_text(PgError("no hint")) == "no hint"


# ------------------------------------------------------------------ output


def _results() -> list[ManualRefresh]:
    good = _st("good")
    return [
        ManualRefresh(
            good,
            Result.REFRESHED,
            "3 changes",
            RefreshOutcome(
                good, Action.DIFFERENTIAL, "3 changes", rows_inserted=1234, rows_deleted=1, seconds=0.256
            ),
        ),
        ManualRefresh(
            _st("bad"), Result.FAILED, "refresh of public.bad failed: boom", error=_SqlError("boom")
        ),
        ManualRefresh(_st("bad_down"), Result.SKIPPED, "upstream public.bad failed in this run"),
    ]


def _text(document: dict) -> str:
    console = Console(width=160, record=True, file=io.StringIO(), color_system=None)
    refresh_results(console, document)
    return console.export_text()


def test_a_stored_document_prints_what_the_results_print() -> None:
    """The daemon stores results_document as JSON; the command line prints the same from it."""
    results = _results()
    stored = json.loads(json.dumps(results_document(results)))  # through the json column and back
    assert dumps(served_document(stored)) == dumps(refresh_document(results))
    text = _text(stored)
    assert text == _text(results_document(results))
    assert "1,234" in text and "0.26" in text and "DIFFERENTIAL" in text
    assert "✗ public.bad FAILED: refresh of public.bad failed: boom" in text
    assert "3 stream tables: 1 refreshed, 1 failed, 1 skipped" in text
    assert stored["summary"]["exit_code"] == 1
    assert "schema_version" not in stored and served_document(stored)["schema_version"] == 1
