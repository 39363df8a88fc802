"""Pure parts of WAL capture: xid widening, slot names, capture-mode decisions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pgtrickle.cdc.modes import Move, SourceCapture, desired_move, hierarchy_blocker, wal_blocker
from pgtrickle.cdc.wal import slot_name_for, widen_xid


@given(full=st.integers(2**31, 2**60), offset=st.integers(-(2**31) + 1, 2**31 - 1))
def test_widen_xid_recovers_the_full_xid(full: int, offset: int) -> None:
    reference = full + offset  # usually after the transaction; just before it in a commit race
    assert widen_xid(full & 0xFFFFFFFF, reference) == full


def test_widen_xid_when_the_reference_lags_the_commit() -> None:
    # The snapshot's xmax (1291) does not yet cover the just-committed xid 1291.
    assert widen_xid(1291, 1291) == 1291
    assert widen_xid(1295, 1291) == 1295
    assert widen_xid(5, (7 << 32) | 0xFFFFFFF0) == (8 << 32) | 5  # ... across an epoch boundary


def test_widen_xid_across_an_epoch_boundary() -> None:
    reference = (5 << 32) | 10  # epoch 5, low 10
    assert widen_xid(0xFFFFFFF0, reference) == (4 << 32) | 0xFFFFFFF0
    assert widen_xid(7, reference) == (5 << 32) | 7


def test_slot_names_are_safe() -> None:
    assert slot_name_for("pgtrickle") == "pgtrickle_pgtrickle"
    assert slot_name_for("My-DB.2") == "pgtrickle_my_db_2"
    assert len(slot_name_for("x" * 200)) == 63


def source(current: str = "trigger", setting: str = "default", refreshed: bool = True) -> SourceCapture:
    return SourceCapture(1, "public.t", current, setting, refreshed, None)


def test_trigger_mode_stays_or_goes_back() -> None:
    assert desired_move(source(), "trigger") is None
    assert desired_move(source("wal"), "trigger") is Move.TO_TRIGGER
    assert desired_move(source("wal", "trigger"), "auto") is Move.TO_TRIGGER


def test_auto_waits_for_the_first_refresh() -> None:
    assert desired_move(source(refreshed=False), "auto") is None
    assert desired_move(source(refreshed=True), "auto") is Move.TO_WAL
    assert desired_move(source("wal"), "auto") is None


def test_wal_mode_moves_at_once_and_source_setting_wins() -> None:
    assert desired_move(source(refreshed=False), "wal") is Move.TO_WAL
    assert desired_move(source(setting="wal", refreshed=False), "trigger") is Move.TO_WAL
    assert desired_move(source(setting="trigger"), "wal") is None


def test_wal_blockers_say_what_to_change() -> None:
    assert "wal_level" in (wal_blocker("replica", 10, 0, False) or "")
    assert "max_replication_slots" in (wal_blocker("logical", 4, 4, False) or "")
    assert wal_blocker("logical", 4, 4, True) is None
    assert wal_blocker("logical", 4, 1, False) is None


def test_a_source_with_partitions_or_children_stays_on_triggers() -> None:
    assert hierarchy_blocker(0) is None
    reason = hierarchy_blocker(3)
    assert reason is not None and "3 partition" in reason and "trigger capture" in reason
