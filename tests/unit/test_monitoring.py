"""The monitoring integration (integrations/monitoring): the generated Grafana dashboard is the committed
one, every query names metrics correctly, and the Prometheus alerting rules pass ``promtool check rules``
and their unit tests (``promtool test rules``: each alert has a case that fires and one that does not)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from integrations.monitoring import dashboard, references

MONITORING = Path(dashboard.__file__).parent
RULES = MONITORING / "pgtrickle-alerts.yml"
RULE_TESTS = MONITORING / "pgtrickle-alerts.test.yml"


def promtool() -> str:
    """promtool's path; in CI (CI=true) a missing promtool fails the test instead of skipping it."""
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing: scripts/ensure-promtool.sh installs it (Debian's prometheus)")
        pytest.skip("promtool is not installed (scripts/ensure-promtool.sh installs it)")
    return path


# --------------------------------------------------------------- dashboard


def test_committed_dashboard_is_what_the_generator_makes() -> None:
    assert dashboard.JSON_PATH.read_text() == dashboard.render(), (
        "run: python -m integrations.monitoring.dashboard"
    )
    assert dashboard.main(["--check"]) == 0


def test_check_fails_on_a_stale_dashboard(tmp_path: Path) -> None:
    stale = tmp_path / "dashboard.json"
    stale.write_text("{}\n")
    assert dashboard.main(["--check", "--output", str(stale)]) == 1
    assert dashboard.main(["--output", str(stale)]) == 0
    assert dashboard.main(["--check", "--output", str(stale)]) == 0


def test_dashboard_is_importable_grafana_json() -> None:
    document = json.loads(dashboard.JSON_PATH.read_text())
    assert document["uid"] == dashboard.UID and document["title"] == "pgtrickle"
    ids = [panel["id"] for panel in document["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    variables = {v["name"]: v for v in document["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in document["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and panel["options"], panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24


def test_dashboard_covers_the_task() -> None:
    """Freshness, refresh durations and modes, breaker and watermark states, CDC lag and buffers, errors."""
    used = references.dashboard_uses(json.loads(dashboard.JSON_PATH.read_text()))
    for name in (
        "pgtrickle_staleness_seconds",
        "pgtrickle_stream_table_status",
        "pgtrickle_refresh_duration_seconds_bucket",
        "pgtrickle_spark_job_seconds_bucket",
        "pgtrickle_refreshes_total",
        "pgtrickle_refresh_rows_total",
        "pgtrickle_circuit_breaker_open",
        "pgtrickle_refresh_skips_total",
        "pgtrickle_slot_lag_bytes",
        "pgtrickle_change_buffer_rows",
        "pgtrickle_change_buffer_bytes",
        "pgtrickle_refresh_failures_total",
        "pgtrickle_consecutive_errors",
        "pgtrickle_change_capture_broken",
    ):
        assert name in used, name
    assert used["pgtrickle_refresh_duration_seconds_bucket"] >= {"st", "mode", "le"}


# --------------------------------------------------------------- references


def test_uses_reads_selectors_groupings_and_legends() -> None:
    got = references.uses(
        "histogram_quantile(0.95, sum by (st, mode, le) "
        '(rate(pgtrickle_refresh_duration_seconds_bucket{st=~"$st"}[$__rate_interval])))',
        "{{st}} {{mode}}",
    )
    assert got == {"pgtrickle_refresh_duration_seconds_bucket": {"st", "mode", "le"}}
    got = references.uses(
        'increase(pgtrickle_refresh_skips_total{reason="watermark"}[30m]) > 0 '
        "unless on (st) "
        'increase(pgtrickle_refreshes_total{action=~"FULL|NO_DATA"}[30m]) > 0',
        "{{ $labels.st }} is stuck",
    )
    assert got == {
        "pgtrickle_refresh_skips_total": {"reason", "st"},
        "pgtrickle_refreshes_total": {"action", "st"},
    }
    assert references.uses("max(pgtrickle_catalog_snapshot_age_seconds)") == {
        "pgtrickle_catalog_snapshot_age_seconds": set()
    }
    # by (...) applies to what is aggregated, not to the other side of a comparison
    assert references.uses("sum by (st) (pgtrickle_a) > on () group_left max(pgtrickle_b)") == {
        "pgtrickle_a": {"st"},
        "pgtrickle_b": set(),
    }
    assert references.uses("sum without (mode) (pgtrickle_a)", "{{st}}") == {"pgtrickle_a": {"st"}}


def test_uses_refuses_a_legend_the_query_drops_and_foreign_queries() -> None:
    with pytest.raises(references.QueryError, match=r"reads label\(s\) \['st'\]"):
        references.uses("sum(pgtrickle_refresh_failures_total)", "{{st}}")
    with pytest.raises(references.QueryError, match=r"\['source'\]"):
        references.uses("sum by (st) (pgtrickle_refresh_failures_total)", "{{st}} {{source}}")
    with pytest.raises(references.QueryError, match="no pgtrickle metric"):
        references.uses("up == 0")
    with pytest.raises(ValueError):
        references.uses("sum by (st) (pgtrickle_a")


def test_missing_names_each_problem() -> None:
    served = {"pgtrickle_a": {"st"}, "pgtrickle_b": {"source"}}
    assert references.missing({"pgtrickle_a": {"st"}}, served) == []
    assert references.missing({"pgtrickle_a": {"st", "mode"}, "pgtrickle_c": set()}, served) == [
        "pgtrickle_a: lacks label(s) ['mode'] (has ['st'])",
        "pgtrickle_c: not served",
    ]


def test_rules_cover_the_task() -> None:
    used = references.rules_uses(RULES.read_text())
    assert used == {
        "pgtrickle_staleness_seconds": {"st"},
        "pgtrickle_circuit_breaker_open": {"st"},
        "pgtrickle_refresh_skips_total": {"st", "reason"},
        "pgtrickle_refreshes_total": {"st", "action"},
        "pgtrickle_slot_lag_bytes": {"slot"},
        "pgtrickle_stream_table_status": {"st", "status"},
        "pgtrickle_change_capture_broken": {"source"},
    }


# --------------------------------------------------------------- promtool


def test_promtool_checks_the_rules() -> None:
    result = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 6 rules found" in result.stdout


def test_promtool_rule_tests_pass() -> None:
    result = subprocess.run(
        [promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, cwd=MONITORING
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    import yaml

    groups = yaml.safe_load(RULES.read_text())["groups"]
    alerts = {rule["alert"] for group in groups for rule in group["rules"]}
    firing: set[str] = set()
    silent: set[str] = set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else silent).add(check["alertname"])
    assert firing == alerts and silent == alerts


def test_rule_tests_catch_a_broken_rule(tmp_path: Path) -> None:
    """The rule tests are not vacuous: loosen one threshold and they fail."""
    broken = RULES.read_text().replace(
        "pgtrickle_slot_lag_bytes > 1073741824", "pgtrickle_slot_lag_bytes > 0"
    )
    assert broken != RULES.read_text()
    (tmp_path / RULES.name).write_text(broken)
    (tmp_path / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    result = subprocess.run(
        [promtool(), "test", "rules", RULE_TESTS.name], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode != 0 and "PgTrickleReplicationSlotLag" in result.stdout + result.stderr
