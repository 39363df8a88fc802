"""Watermark gating decisions (pure): alignment, applicable groups, modes, hold-back points, snapshots."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgtrickle.gates import watermark as wm
from tests.hypothesis_profiles import examples

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
ORDERS, LINES, STOCK, HOUSES, FX = 101, 102, 103, 104, 105


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def adv(
    source: int, minutes: float, ident: int = 1, xid: int = 900, snapshot: str = "890:895:891"
) -> wm.Advancement:
    return wm.Advancement(ident, source, at(minutes), xid, snapshot)


def group(
    sources=(ORDERS, LINES),
    watermarks=None,
    tolerance=timedelta(0),
    name="order_pipeline",
    gid=1,
    effective=None,
    aligned=None,
) -> wm.Group:
    return wm.Group(gid, name, frozenset(sources), tolerance, watermarks or {}, effective, aligned or {})


# ------------------------------------------------------------------ alignment


def test_advance_watermark_monotonic_and_idempotent_are_sql_side() -> None:
    # (The SQL function enforces monotonicity; the group state only compares.) Same values: aligned.
    assert wm.group_state(group(watermarks={ORDERS: at(5), LINES: at(5)})).state == wm.ALIGNED


def test_watermark_group_alignment_check() -> None:
    g = group(watermarks={ORDERS: at(5), LINES: at(-5)})
    state = wm.group_state(g)
    assert (state.state, state.min_watermark, state.max_watermark, state.lag) == (
        wm.MISALIGNED,
        at(-5),
        at(5),
        timedelta(minutes=10),
    )
    assert (
        wm.group_state(
            group(watermarks={ORDERS: at(5), LINES: at(-5)}, tolerance=timedelta(minutes=10))
        ).state
        == wm.ALIGNED
    )
    assert (
        wm.group_state(
            group(watermarks={ORDERS: at(5), LINES: at(-5)}, tolerance=timedelta(minutes=9, seconds=59))
        ).state
        == wm.MISALIGNED
    )


def test_bootstrapping_until_every_member_has_a_watermark() -> None:
    state = wm.group_state(group(watermarks={ORDERS: at(5)}))
    assert state.state == wm.BOOTSTRAPPING and state.min_watermark == at(5)
    assert wm.gate_decision("gate", [group(watermarks={ORDERS: at(5)})]).blocked is False


@given(
    st.lists(st.integers(min_value=-10_000, max_value=10_000), min_size=2, max_size=6),
    st.integers(min_value=0, max_value=20_000),
)
def test_alignment_is_max_minus_min_within_tolerance(offsets: list[int], tolerance: int) -> None:
    sources = list(range(1, len(offsets) + 1))
    g = group(
        sources=sources,
        watermarks={s: at(o / 60) for s, o in zip(sources, offsets)},
        tolerance=timedelta(seconds=tolerance),
    )
    aligned = max(offsets) - min(offsets) <= tolerance
    assert (wm.group_state(g).state == wm.ALIGNED) is aligned
    assert wm.gate_decision("gate", [g]).blocked is not aligned


# ----------------------------------------------------------- which groups, mode

# order_summary (1) <- orders; line_summary (2) <- order_lines; order_report (3) <- 1, 2
DIRECT = {1: [ORDERS], 2: [LINES], 3: [1001, 1002], 4: [1003, STOCK]}
ST_RELIDS = {1001: 1, 1002: 2, 1003: 3}


def test_base_sources_are_transitive() -> None:
    assert wm.base_sources(3, DIRECT, ST_RELIDS) == {ORDERS, LINES}
    assert wm.base_sources(4, DIRECT, ST_RELIDS) == {ORDERS, LINES, STOCK}
    assert wm.base_sources(1, DIRECT, ST_RELIDS) == {ORDERS}


def test_base_sources_survive_a_cycle() -> None:
    assert wm.base_sources(1, {1: [1002, ORDERS], 2: [1001]}, {1001: 1, 1002: 2}) == {ORDERS}


def test_applicable_groups_and_inferred_mode() -> None:
    pipeline = group()
    inventory = group(sources=(STOCK, HOUSES), name="inventory_pipeline", gid=2)
    report = wm.base_sources(3, DIRECT, ST_RELIDS)
    summary = wm.base_sources(1, DIRECT, ST_RELIDS)
    assert wm.applicable_groups(report, [pipeline, inventory]) == [pipeline]
    assert wm.applicable_groups(summary, [pipeline, inventory]) == [pipeline]
    assert wm.inferred_mode(report, [pipeline, inventory]) == "gate", "converges two members through STs"
    assert wm.inferred_mode(summary, [pipeline, inventory]) == "none", "one member only"
    assert wm.effective_mode("inferred", report, [pipeline]) == ("gate", "inferred")
    assert wm.effective_mode("none", report, [pipeline]) == ("none", "set")
    assert wm.effective_mode("hold_back", summary, [pipeline]) == ("hold_back", "set")
    with pytest.raises(ValueError):
        wm.effective_mode("sometimes", report, [pipeline])


def test_gate_blocks_while_any_applicable_group_is_misaligned() -> None:
    pipeline = group(watermarks={ORDERS: at(5), LINES: at(-5)})
    inventory = group(
        sources=(STOCK, HOUSES), watermarks={STOCK: at(0), HOUSES: at(0)}, name="inventory_pipeline", gid=2
    )
    decision = wm.gate_decision("gate", [inventory, pipeline])
    assert decision.blocked and "order_pipeline is misaligned" in decision.reason
    assert "inventory" not in decision.reason
    assert decision.effective_watermark is None
    ok = wm.gate_decision("gate", [inventory, group(watermarks={ORDERS: at(5), LINES: at(5)})])
    assert not ok.blocked and ok.effective_watermark == at(0), "the minimum over the groups"
    assert not wm.gate_decision("none", [pipeline]).blocked


# ------------------------------------------------------------------ hold_back


def test_hold_back_reads_members_at_the_last_aligned_point() -> None:
    aligned = {ORDERS: adv(ORDERS, -5, 1), LINES: adv(LINES, -5, 2)}
    g = group(watermarks={ORDERS: at(5), LINES: at(-5)}, effective=at(-5), aligned=aligned)
    plan = wm.hold_back_plan([g], [ORDERS], [])
    assert plan.skip_reason is None
    assert plan.caps == {ORDERS: aligned[ORDERS]} and plan.effective_watermark == at(-5)
    assert plan.group_points == {1: at(-5)}


def test_hold_back_waits_for_a_first_alignment_and_ignores_bootstrapping() -> None:
    never = group(watermarks={ORDERS: at(5), LINES: at(-5)})
    assert "has not been aligned yet" in (wm.hold_back_plan([never], [ORDERS], []).skip_reason or "")
    booting = group(watermarks={ORDERS: at(5)})
    plan = wm.hold_back_plan([booting], [ORDERS], [])
    assert plan.skip_reason is None and not plan.caps and plan.effective_watermark is None


def test_hold_back_source_in_two_groups_is_read_at_the_earlier_point() -> None:
    a = group(
        watermarks={ORDERS: at(10), LINES: at(10)},
        effective=at(10),
        aligned={ORDERS: adv(ORDERS, 10, 5), LINES: adv(LINES, 10, 6)},
    )
    b = group(
        sources=(ORDERS, STOCK),
        name="audit",
        gid=2,
        watermarks={ORDERS: at(10), STOCK: at(0)},
        effective=at(0),
        aligned={ORDERS: adv(ORDERS, 0, 3), STOCK: adv(STOCK, 0, 4)},
    )
    plan = wm.hold_back_plan([a, b], [ORDERS, STOCK], [])
    assert plan.caps[ORDERS].advancement_id == 3 and plan.caps[STOCK].advancement_id == 4
    assert plan.effective_watermark == at(0) and plan.group_points == {1: at(10), 2: at(0)}


def test_hold_back_needs_upstream_stream_tables_at_the_same_point() -> None:
    g = group(
        watermarks={ORDERS: at(5), LINES: at(5)},
        effective=at(5),
        aligned={ORDERS: adv(ORDERS, 5, 1), LINES: adv(LINES, 5, 2)},
    )
    held = wm.UpstreamMark(1001, "public.order_summary", frozenset({ORDERS}), "hold_back", {1: at(5)})
    lines = wm.UpstreamMark(1002, "public.line_summary", frozenset({LINES}), "hold_back", {1: at(5)})
    plan = wm.hold_back_plan([g], [], [held, lines])
    assert plan.skip_reason is None and not plan.caps and plan.effective_watermark == at(5)
    lagging = wm.UpstreamMark(1002, "public.line_summary", frozenset({LINES}), "hold_back", {1: at(-5)})
    assert "held back to" in (wm.hold_back_plan([g], [], [held, lagging]).skip_reason or "")
    free = wm.UpstreamMark(1002, "public.line_summary", frozenset({LINES}), "none", {})
    reason = wm.hold_back_plan([g], [], [held, free]).skip_reason or ""
    assert "line_summary" in reason and "'none'" in reason and "hold_back" in reason
    unrelated = wm.UpstreamMark(1003, "public.stock", frozenset({STOCK}), "none", {})
    assert wm.hold_back_plan([g], [], [held, lines, unrelated]).skip_reason is None


# ------------------------------------------------------------------ snapshots


def test_including_the_advancing_transaction() -> None:
    # measured: xid 756 in a transaction whose snapshot is 755:755: (755 running)
    assert wm.including("755:755:", 756) == "755:757:755"
    assert wm.visible_in("755:757:755", 756) and not wm.visible_in("755:757:755", 755)
    assert wm.including("700:760:705,730", 730) == "700:760:705"
    assert wm.including("700:760:705", 600) == "700:760:705"


snapshots = st.builds(
    lambda xmin, width, xip: (xmin, xmin + width, sorted({xmin + x for x in xip if x < width})),
    st.integers(min_value=3, max_value=1000),
    st.integers(min_value=0, max_value=40),
    st.lists(st.integers(min_value=0, max_value=40), max_size=10),
)


@settings(max_examples=examples(300))
@given(snapshots, st.integers(min_value=0, max_value=60))
def test_including_makes_exactly_one_more_xid_visible(snap, offset: int) -> None:
    xmin, xmax, xip = snap
    text = wm.format_snapshot(xmin, xmax, xip)
    xid = xmin + offset
    widened = wm.including(text, xid)
    assert wm.visible_in(widened, xid)
    for other in range(0, xmax + 70):
        if other != xid:
            assert wm.visible_in(widened, other) == wm.visible_in(text, other), other
    assert wm.snapshot_xmin(widened) == xmin


# ---------------------------------------------------------------- stale alerts


def test_stuck_alert_once_after_stale_after() -> None:
    stale = timedelta(minutes=30)
    assert not wm.stuck_due(at(0), stale, at(29), alerted=False)
    assert wm.stuck_due(at(0), stale, at(30), alerted=False)
    assert not wm.stuck_due(at(0), stale, at(90), alerted=True), "once per stall"
    assert not wm.stuck_due(at(0), None, at(900), alerted=False), "no stale_after: no alerts"


def test_interval_text_matches_postgresql() -> None:
    assert wm.interval_text(timedelta(minutes=10)) == "00:10:00"
    assert wm.interval_text(timedelta(0)) == "00:00:00"
    assert wm.interval_text(timedelta(days=2, hours=1)) == "2 days 01:00:00"
    assert wm.interval_text(timedelta(seconds=1.5)) == "00:00:01.5"
