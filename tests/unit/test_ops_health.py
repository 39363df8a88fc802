"""Operational decisions, without a database: auto-suspension, staleness, skip labels, metrics."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pgtrickle.config import Settings
from pgtrickle.errors import ConfigError, RefreshError, UnsupportedQueryError
from pgtrickle.ops import health
from pgtrickle.ops.metrics import CatalogSnapshot, Metrics
from pgtrickle.refresh.plan import Action

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


# ------------------------------------------------------------ suspension


@pytest.mark.parametrize("status", ["ACTIVE", "INITIALIZING"])
def test_failures_below_the_threshold_only_alert_refresh_failed(status: str) -> None:
    for errors in (1, 2):
        verdict = health.after_failure(status, errors, 3, fatal=False)
        assert verdict == health.FailureVerdict(status, ("refresh_failed",))


@pytest.mark.parametrize("status", ["ACTIVE", "INITIALIZING"])
def test_the_third_failure_suspends(status: str) -> None:
    verdict = health.after_failure(status, 3, 3, fatal=False)
    assert verdict.status == "SUSPENDED"
    assert verdict.events == ("refresh_failed", "auto_suspended")


def test_an_already_suspended_table_is_not_suspended_again() -> None:
    verdict = health.after_failure("SUSPENDED", 7, 3, fatal=False)
    assert verdict == health.FailureVerdict("SUSPENDED", ("refresh_failed",))


def test_an_error_table_stays_in_error() -> None:
    assert health.after_failure("ERROR", 5, 3, fatal=False).status == "ERROR"


@pytest.mark.parametrize("threshold", [0, -1])
def test_threshold_zero_never_suspends(threshold: int) -> None:
    assert health.after_failure("ACTIVE", 1000, threshold, fatal=False).status == "ACTIVE"


def test_threshold_one_suspends_on_the_first_failure() -> None:
    assert health.after_failure("ACTIVE", 1, 1, fatal=False).status == "SUSPENDED"


@pytest.mark.parametrize("status", health.STATUSES)
def test_a_fatal_error_goes_straight_to_error(status: str) -> None:
    verdict = health.after_failure(status, 1, 3, fatal=True)
    assert verdict == health.FailureVerdict("ERROR", ("refresh_failed",))


def test_after_failure_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="status"):
        health.after_failure("PAUSED", 1, 3, fatal=False)
    with pytest.raises(ValueError, match="at least 1"):
        health.after_failure("ACTIVE", 0, 3, fatal=False)


def test_only_an_unsupported_query_is_fatal() -> None:
    assert health.is_fatal(UnsupportedQueryError("no longer compiles"))
    assert not health.is_fatal(RefreshError("Spark job failed"))
    assert not health.is_fatal(ValueError("cast"))


# ------------------------------------------------------------- staleness


def check(**kw: object) -> health.StalenessVerdict:
    args: dict[str, object] = dict(
        status="ACTIVE",
        data_timestamp=NOW - timedelta(seconds=100),
        created_at=NOW - timedelta(days=1),
        period_seconds=60.0,
        factor=3.0,
        alerted=False,
        now=NOW,
    )
    args.update(kw)
    return health.staleness_check(**args)  # type: ignore[arg-type]


def test_fresh_data_is_not_stale() -> None:
    verdict = check()
    assert not verdict.stale and verdict.event is None
    assert verdict.age == timedelta(seconds=100) and verdict.threshold == timedelta(seconds=180)


def test_data_older_than_three_periods_is_stale_once() -> None:
    verdict = check(data_timestamp=NOW - timedelta(seconds=181))
    assert verdict.stale and verdict.event == "stale_data"
    again = check(data_timestamp=NOW - timedelta(seconds=500), alerted=True)
    assert again.stale and again.event is None, "sent once per episode"


def test_exactly_at_the_threshold_is_not_stale() -> None:
    assert not check(data_timestamp=NOW - timedelta(seconds=180)).stale


def test_fresh_again_resolves() -> None:
    assert check(alerted=True).event == "stale_data_resolved"


@pytest.mark.parametrize("status", ["SUSPENDED", "ERROR"])
def test_suspended_and_error_tables_do_not_alert_stale(status: str) -> None:
    verdict = check(status=status, data_timestamp=NOW - timedelta(hours=5))
    assert verdict.stale and verdict.event is None


def test_never_refreshed_is_measured_from_creation() -> None:
    young = check(status="INITIALIZING", data_timestamp=None, created_at=NOW - timedelta(seconds=30))
    assert not young.stale and young.age is None
    old = check(status="INITIALIZING", data_timestamp=None, created_at=NOW - timedelta(minutes=10))
    assert old.stale and old.event == "stale_data" and old.age is None


def test_factor_zero_turns_stale_alerts_off() -> None:
    verdict = check(factor=0, data_timestamp=NOW - timedelta(days=30))
    assert not verdict.stale and verdict.threshold is None and verdict.event is None
    assert check(factor=0, alerted=True).event == "stale_data_resolved"


def test_skip_categories() -> None:
    assert health.skip_category("circuit breaker open: 80 changes exceed the ceiling 50") == "circuit_breaker"
    assert health.skip_category("circuit breaker tripped: x") == "circuit_breaker"
    assert health.skip_category("watermark gate closed: group g not aligned") == "watermark"
    assert health.skip_category("something else") == "other"


# --------------------------------------------------------------- metrics


@dataclass
class _St:
    display: str


@dataclass
class _Outcome:
    st: _St
    action: Action
    reason: str
    rows_inserted: int = 0
    rows_deleted: int = 0
    seconds: float = 0.0
    spark_seconds: float = 0.0


def samples(metrics: Metrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_record_outcomes_skips_and_failures() -> None:
    m = Metrics()
    m.observe_outcome(_Outcome(_St("public.a"), Action.FULL, "initial", 10, 0, 1.5, 0.7))
    m.observe_outcome(_Outcome(_St("public.a"), Action.DIFFERENTIAL, "d", 2, 1, 0.3, 0.1))
    m.observe_outcome(_Outcome(_St("public.a"), Action.SKIP, "circuit breaker open: too many"))
    m.observe_outcome(_Outcome(_St("public.a"), Action.NO_DATA, "no changes"))
    m.observe_failure("public.a")
    got = samples(m)
    assert got[("pgtrickle_refreshes_total", (("action", "FULL"), ("st", "public.a")))] == 1
    assert got[("pgtrickle_refreshes_total", (("action", "NO_DATA"), ("st", "public.a")))] == 1
    assert got[("pgtrickle_refresh_skips_total", (("reason", "circuit_breaker"), ("st", "public.a")))] == 1
    assert got[("pgtrickle_refresh_failures_total", (("st", "public.a"),))] == 1
    assert (
        got[("pgtrickle_refresh_rows_total", (("change", "inserted"), ("mode", "FULL"), ("st", "public.a")))]
        == 10
    )
    assert (
        got[
            (
                "pgtrickle_refresh_rows_total",
                (("change", "deleted"), ("mode", "DIFFERENTIAL"), ("st", "public.a")),
            )
        ]
        == 1
    )
    assert got[("pgtrickle_refresh_duration_seconds_sum", (("mode", "FULL"), ("st", "public.a")))] == 1.5
    assert got[("pgtrickle_spark_job_seconds_count", (("mode", "DIFFERENTIAL"), ("st", "public.a")))] == 1


def test_state_series_come_from_one_snapshot() -> None:
    m = Metrics()
    m._state.snapshot = CatalogSnapshot(  # noqa: SLF001 - what update_from_catalog publishes
        stream_tables=[
            ("public.a", "SUSPENDED", 12.5, True, 3),
            ("public.b", "INITIALIZING", None, False, 0),
        ],
        buffers=[("public.src", 7.0, 8192.0)],
        slots=[("pgtrickle_slot", 1024.0)],
        taken_at=1.0,
    )
    got = samples(m)
    assert got[("pgtrickle_stream_table_status", (("st", "public.a"), ("status", "SUSPENDED")))] == 1
    assert got[("pgtrickle_stream_table_status", (("st", "public.a"), ("status", "ACTIVE")))] == 0
    assert got[("pgtrickle_staleness_seconds", (("st", "public.a"),))] == 12.5
    assert ("pgtrickle_staleness_seconds", (("st", "public.b"),)) not in got
    assert got[("pgtrickle_circuit_breaker_open", (("st", "public.a"),))] == 1
    assert got[("pgtrickle_consecutive_errors", (("st", "public.a"),))] == 3
    assert got[("pgtrickle_change_buffer_rows", (("source", "public.src"),))] == 7
    assert got[("pgtrickle_slot_lag_bytes", (("slot", "pgtrickle_slot"),))] == 1024


# ---------------------------------------------------------------- config


def test_metrics_are_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGTRICKLE_METRICS_PORT", raising=False)
    assert Settings().metrics_port is None
    assert Settings.from_env().metrics_port is None


def test_metrics_port_from_env_and_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGTRICKLE_METRICS_PORT", "9187")
    monkeypatch.setenv("PGTRICKLE_METRICS_ADDRESS", "0.0.0.0")
    settings = Settings.from_env()
    assert settings.metrics_port == 9187 and settings.metrics_address == "0.0.0.0"
    assert settings.with_overrides(metrics_port=9999).metrics_port == 9999
    monkeypatch.setenv("PGTRICKLE_METRICS_PORT", "off")
    assert Settings.from_env().metrics_port is None


@pytest.mark.parametrize("raw", ["abc", "70000", "-1"])
def test_bad_metrics_port_is_a_config_error(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("PGTRICKLE_METRICS_PORT", raw)
    with pytest.raises(ConfigError, match="METRICS_PORT|metrics port"):
        Settings.from_env()
