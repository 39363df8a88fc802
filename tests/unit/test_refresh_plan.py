"""plan_refresh: which action runs, and why (pure)."""

from __future__ import annotations

from pgtrickle.catalog.store import Source
from pgtrickle.cdc.buffers import PendingChanges
from pgtrickle.refresh.plan import Action, plan_refresh

ORDERS = Source(1, "public", "orders", "TABLE", "changes_1")
UPSTREAM = Source(2, "public", "summary", "STREAM_TABLE", "changes_2")


def pending(source: Source = ORDERS, i: int = 0, d: int = 0, u: int = 0, t: bool = False) -> PendingChanges:
    return PendingChanges(source, i, d, u, t)


def test_no_frontier_means_initial_population() -> None:
    plan = plan_refresh("AUTO", None, True, None)
    assert plan.action is Action.FULL and plan.reason == "initial population"


def test_no_changes_means_no_data() -> None:
    plan = plan_refresh("AUTO", "10:10:", False, [pending(), pending(UPSTREAM)])
    assert plan.action is Action.NO_DATA and plan.delta_rows == 0


def test_changes_count_all_kinds() -> None:
    plan = plan_refresh("FULL", "10:10:", False, [pending(i=3, d=2, u=1), pending(UPSTREAM, i=4)])
    assert plan.action is Action.FULL and plan.delta_rows == 10 and plan.reason == "refresh_mode is FULL"


def test_auto_refreshes_full_and_says_why() -> None:
    plan = plan_refresh("AUTO", "10:10:", False, [pending(i=1)])
    assert plan.action is Action.FULL and "differential" in plan.reason


def test_reinit_wins_even_without_changes() -> None:
    plan = plan_refresh("AUTO", "10:10:", True, [pending()])
    assert plan.action is Action.FULL and "reinitialization" in plan.reason


def test_reinit_says_why_when_pgtrickle_asked_for_it() -> None:
    why = "partition public.pt_3 was attached to source public.pt with rows already in it"
    plan = plan_refresh("AUTO", "10:10:", True, [pending(i=1)], None, why)
    assert plan.action is Action.FULL and plan.reason == f"reinitialization requested: {why}"


def test_truncate_forces_full_and_names_the_source() -> None:
    plan = plan_refresh("AUTO", "10:10:", False, [pending(t=True)])
    assert plan.action is Action.FULL and "public.orders was truncated" in plan.reason


def test_upstream_full_refresh_is_not_called_a_truncate() -> None:
    plan = plan_refresh("AUTO", "10:10:", False, [pending(UPSTREAM, t=True)])
    assert "public.summary was refreshed in full" in plan.reason


def test_a_query_that_reads_the_clock_is_recomputed_without_changes() -> None:
    from pgtrickle.refresh.plan import READS_CLOCK_REASON, ModeContext

    clock = ModeContext(reads_clock=True)
    for mode in ("AUTO", "FULL"):
        plan = plan_refresh(mode, "10:10:", False, [pending()], clock)
        assert plan.action is Action.FULL and plan.reason == READS_CLOCK_REASON and plan.delta_rows == 0
    plan = plan_refresh("AUTO", "10:10:", False, [pending(i=2)], clock)
    assert plan.action is Action.FULL and plan.delta_rows == 2
    assert plan_refresh("AUTO", None, False, None, clock).reason == "initial population"
