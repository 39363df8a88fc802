"""Driver-side calls run side by side (spark/overlap.py): pure threads, no JVM."""

from __future__ import annotations

import threading
import time
from contextvars import ContextVar

import pytest

from pgtrickle.spark import jdbc, overlap

SEEN: ContextVar[str | None] = ContextVar("seen", default=None)


def test_calls_run_side_by_side_and_results_keep_their_order() -> None:
    """Two calls that each wait for the other: one after the other they would time out."""
    barrier = threading.Barrier(2, timeout=10)

    def call(n: int) -> int:
        barrier.wait()
        return n

    assert overlap.run_all([lambda: call(1), lambda: call(2)]) == [1, 2]


def test_every_call_finishes_before_the_first_error_is_raised() -> None:
    finished: list[str] = []

    def fails() -> None:
        raise ValueError("first")

    def slow() -> None:
        time.sleep(0.2)
        finished.append("slow")

    def fails_later() -> None:
        time.sleep(0.1)
        raise KeyError("second")

    with pytest.raises(ValueError, match="first"):
        overlap.run_all([fails, slow, fails_later])
    assert finished == ["slow"]


def test_calls_see_the_callers_context() -> None:
    """What a refresh records per context (the reads whose values are checked) sees the reads
    its calls start in the pool's threads."""
    token = SEEN.set("refresh")
    try:
        assert overlap.run_all([SEEN.get, SEEN.get]) == ["refresh", "refresh"]
    finally:
        SEEN.reset(token)
    with jdbc.checked_reads() as reads:
        overlap.run_all(
            [lambda: jdbc._recording.get().append("a"), lambda: jdbc._recording.get().append("b")]
        )
    assert sorted(reads) == ["a", "b"]


def test_one_call_runs_in_the_callers_thread() -> None:
    assert overlap.run_all([threading.get_ident]) == [threading.get_ident()]
    assert overlap.run_all([]) == []
