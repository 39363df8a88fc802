"""Pure decisions behind the tools' handling of failures: manual refresh skips and summary,
the broken-capture error, the reinitialization reason, the capture metric."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from pgtrickle.ops.metrics import CatalogSnapshot, Metrics
from pgtrickle.refresh.capture_check import BrokenCapture, broken_message
from pgtrickle.refresh.plan import Action, plan_refresh, reinit_text
from pgtrickle.daemon.manual import ManualRefresh, Result, Summary, blocked_by, summarize


def test_a_stream_table_is_blocked_by_an_upstream_that_failed_or_was_skipped() -> None:
    upstream = {1: set(), 2: {1}, 3: {2}, 4: set(), 5: {4, 2}}
    assert blocked_by([1], upstream, {}) is None
    not_done = {1: "upstream public.a failed in this run"}
    assert blocked_by([2], upstream, not_done) == "upstream public.a failed in this run"
    assert blocked_by([4], upstream, not_done) is None
    not_done[2] = "upstream public.b was skipped (upstream public.a failed in this run)"
    assert blocked_by([3], upstream, not_done) == not_done[2]
    assert blocked_by([5], upstream, not_done) == not_done[2]


def test_an_atomic_group_is_blocked_only_by_an_upstream_outside_it() -> None:
    upstream = {1: set(), 2: {1}, 3: {2}}
    assert blocked_by([2, 3], upstream, {2: "x"}) is None  # its own member: the group refreshes as one
    assert blocked_by([2, 3], upstream, {1: "upstream public.a failed in this run"}) is not None


@dataclass(frozen=True)
class _St:
    display: str


def _result(result: Result) -> ManualRefresh:
    return ManualRefresh(_St("public.x"), result, "why")  # type: ignore[arg-type]


def test_summary_and_exit_status() -> None:
    ok = summarize([_result(Result.REFRESHED), _result(Result.REFRESHED), _result(Result.SKIPPED)])
    assert ok == Summary(2, 0, 1) and ok.exit_code == 0
    assert ok.text() == "3 stream tables: 2 refreshed, 0 failed, 1 skipped"
    bad = summarize([_result(Result.FAILED), _result(Result.SKIPPED), _result(Result.REFRESHED)])
    assert bad.exit_code == 1 and bad.text() == "3 stream tables: 1 refreshed, 1 failed, 1 skipped"
    assert summarize([]).text() == "0 stream tables: 0 refreshed, 0 failed, 0 skipped"
    assert summarize([_result(Result.REFRESHED)]).text() == "1 stream table: 1 refreshed, 0 failed, 0 skipped"


def test_the_broken_capture_error_names_every_problem_and_the_repair() -> None:
    message = broken_message(
        [
            BrokenCapture(
                1, "public.t", ("change buffer table pgtrickle_changes.changes_1_rows is missing",)
            ),
            BrokenCapture(2, "public.u", ("capture trigger(s) pgt_capture_ins on u missing", "x disabled")),
        ]
    )
    assert "public.t is broken (change buffer table pgtrickle_changes.changes_1_rows is missing)" in message
    assert "public.u is broken (capture trigger(s) pgt_capture_ins on u missing; x disabled)" in message
    assert "changes may have been lost" in message and "run `pgtrickle install`" in message


def test_a_reinitialization_says_why_when_known() -> None:
    assert reinit_text(None) == "reinitialization requested"
    assert reinit_text("capture repaired") == "reinitialization requested: capture repaired"
    plan = plan_refresh("AUTO", "1:2:", True, [], reinit_reason="capture repaired")
    assert plan.action is Action.FULL and plan.reason == "reinitialization requested: capture repaired"
    assert plan_refresh("AUTO", "1:2:", True, []).reason == "reinitialization requested"


def test_the_broken_capture_metric() -> None:
    m = Metrics()
    m._state.snapshot = CatalogSnapshot(
        capture=[("public.t", True), ("public.u", False)],  # noqa: SLF001
        taken_at=1.0,
    )
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(m.render().decode())
        for s in f.samples
    }
    assert got[("pgtrickle_change_capture_broken", (("source", "public.t"),))] == 1
    assert got[("pgtrickle_change_capture_broken", (("source", "public.u"),))] == 0
