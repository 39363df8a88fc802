"""should_trip: every mode, cold start, σ floors, ceilings, deletions (pure)."""

from __future__ import annotations

import math
import random

from hypothesis import given
from hypothesis import strategies as st

from pgtrickle.gates.circuit_breaker import (
    BreakerConfig,
    Volume,
    compute_baseline,
    should_trip,
    thresholds,
)

ADAPTIVE = BreakerConfig("adaptive")
STEADY = [(120, 0)] * 20


def poisson(rng: random.Random, lam: float) -> int:
    # Knuth's method is fine for λ ~ 120 with a log-space trick
    total, k = 0.0, 0
    while True:
        total += -math.log(1.0 - rng.random())
        if total > lam:
            return k
        k += 1


def test_none_never_trips() -> None:
    assert not should_trip(BreakerConfig("none"), Volume(10**9, 10**9, ("public.t",)), []).trip


def test_truncate_trips_any_enabled_breaker() -> None:
    decision = should_trip(ADAPTIVE, Volume(0, 0, ("public.orders",)), STEADY)
    assert decision.trip and "public.orders was truncated" in decision.reason


def test_fixed_ceiling_and_ratio() -> None:
    cfg = BreakerConfig("fixed", ceiling=1000)
    assert not should_trip(cfg, Volume(1000, 0), []).trip
    assert should_trip(cfg, Volume(1001, 0), []).trip
    ratio = BreakerConfig("fixed", max_ratio=0.5)
    assert not should_trip(ratio, Volume(400, 0, source_rows=1000), []).trip
    decision = should_trip(ratio, Volume(600, 0, source_rows=1000), [])
    assert decision.trip and "0.5 × 1,000" in decision.reason


def test_cold_start_uses_the_backstop_ceiling() -> None:
    cfg = BreakerConfig("adaptive", window=20, cold_start_ceiling=5000)
    short = [(100, 0)] * 19
    assert not should_trip(cfg, Volume(4000, 0), short).trip, "no baseline yet: only the backstop"
    decision = should_trip(cfg, Volume(5001, 0), short)
    assert decision.trip and "cold-start ceiling" in decision.reason and "19 of 20" in decision.reason


def test_adaptive_trips_above_mean_plus_k_sigma() -> None:
    history = [(100 + (i % 5) * 10, 0) for i in range(20)]  # 100..140
    base = compute_baseline(history, 20, "window")
    limit, _ = thresholds(base, 3.0)
    assert not should_trip(ADAPTIVE, Volume(int(limit), 0), history).trip
    decision = should_trip(ADAPTIVE, Volume(int(limit) + 1, 0), history)
    assert decision.trip and "adaptive threshold" in decision.reason and "μ=120" in decision.reason


def test_zero_sigma_history_does_not_trip_on_plus_one() -> None:
    assert not should_trip(ADAPTIVE, Volume(121, 0), STEADY).trip
    assert not should_trip(ADAPTIVE, Volume(160, 0), STEADY).trip  # within 3·√(2·120) ≈ 46
    assert should_trip(ADAPTIVE, Volume(170, 0), STEADY).trip


def test_ceiling_overrides_the_adaptive_test() -> None:
    cfg = BreakerConfig("adaptive", ceiling=50_000)
    huge_baseline = [(40_000 + i * 1000, 0) for i in range(20)]
    assert not should_trip(BreakerConfig("adaptive"), Volume(55_000, 0), huge_baseline).trip
    decision = should_trip(cfg, Volume(55_000, 0), huge_baseline)
    assert decision.trip and "ceiling 50000" in decision.reason


def test_deletions_alone_trip() -> None:
    history = [(120, 0)] * 20
    decision = should_trip(ADAPTIVE, Volume(100, 90), history)  # total is normal, deletions are not
    assert decision.trip and decision.reason.startswith("deletions 90")
    assert not should_trip(ADAPTIVE, Volume(120, 10), history).trip, "a few deletions are tolerated"


def test_seed_scenario_mass_delete_trips() -> None:
    rng = random.Random(7)
    history = [(max(0, int(rng.gauss(120, 45))), 0) for _ in range(100)]
    decision = should_trip(ADAPTIVE, Volume(50_000, 50_000), history)
    assert decision.trip


def test_no_false_alarm_over_200_poisson_cycles_with_defaults() -> None:
    rng = random.Random(2026)
    history: list[tuple[int, int]] = []
    trips = 0
    for _ in range(200):
        total = poisson(rng, 120)
        deletes = int(total * rng.uniform(0.0, 0.2))
        if should_trip(ADAPTIVE, Volume(total, deletes), history).trip:
            trips += 1
        history.append((total, deletes))
    assert trips == 0


def test_slow_growth_then_catastrophe_trips_the_ceiling() -> None:
    cfg = BreakerConfig("adaptive", ceiling=100_000, baseline="ewma")
    history: list[tuple[int, int]] = []
    volume = 100.0
    for _ in range(300):  # boiling frog: +3% per refresh, the baseline follows
        decision = should_trip(cfg, Volume(int(volume), 0), history)
        assert not decision.trip or "ceiling" in decision.reason
        history.append((int(volume), 0))
        volume = min(volume * 1.03, 90_000)
    decision = should_trip(cfg, Volume(150_000, 0), history)
    assert decision.trip and "ceiling" in decision.reason


def test_ewma_adapts_faster_to_a_legitimate_shift() -> None:
    history = [(100, 0)] * 40 + [(400, 0)] * 8
    window_base = compute_baseline(history, 20, "window")
    ewma_base = compute_baseline(history, 20, "ewma")
    assert ewma_base.mean > window_base.mean


@given(
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), max_size=60),
    st.integers(0, 10**7),
    st.integers(0, 10**7),
    st.sampled_from(["window", "ewma"]),
)
def test_decision_is_total_and_explained(
    history: list[tuple[int, int]], total: int, deletes: int, method: str
) -> None:
    for mode in ("none", "fixed", "adaptive"):
        cfg = BreakerConfig(mode, ceiling=10**6, baseline=method)
        decision = should_trip(cfg, Volume(total, min(deletes, total)), history)
        assert decision.reason
        if decision.trip:
            assert mode != "none"
