"""The soak (benchmarks/soak.py): 50 stream tables over 10 sources under steady writes and bursts.

The daemon runs in its own process (with its own Spark driver JVM) against a
database of its own on the test server. The checks are the script's: no
failed refresh, staleness within schedule + grace, buffers cleaned, memory of
the daemon and of the JVM flat from the second to the last quarter, and every
stream table equal to its query at the end.

``make test`` runs a short soak: 30 s of writes (``PGTRICKLE_SOAK_SECONDS``, default 30) with a
burst every quarter of the run and a memory sample every second. ``make soak`` runs the 2-minute
one (``PGTRICKLE_SOAK_SECONDS=120``); longer runs:
``.venv/bin/python benchmarks/soak.py --duration 1800`` (docs/BENCHMARKS.md).
Select or skip it with ``-m soak`` / ``-m "not soak"``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import FAST_JVM_CONF

pytestmark = [pytest.mark.integration, pytest.mark.soak, pytest.mark.timeout(1800)]

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def _soak_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("pgtrickle_soak", SOAK)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_specs_mix_shapes_modes_and_schedules() -> None:
    soak = _soak_module()
    specs = soak.stream_table_specs(50, 10)
    assert len(specs) == 50 and len({s.name for s in specs}) == 50
    assert {s.shape for s in specs} == {"aggregate", "filter", "join", "min_max", "downstream"}
    assert {s.mode for s in specs} == {"DIFFERENTIAL", "FULL", "AUTO"}
    assert {s.schedule for s in specs} == set(soak.SCHEDULES)
    assert {q for s in specs for q in range(10) if f"soak.src_{q} " in s.query + " "} == set(range(10))
    for k, s in enumerate(specs):  # a stream table over another one comes after it
        if s.shape == "downstream":
            assert f"soak.st_{k - 4:02d}" in s.query and specs[k - 4].shape == "aggregate"


#: Seconds of writes: short in ``make test``, 120 in ``make soak``.
SOAK_SECONDS = float(os.environ.get("PGTRICKLE_SOAK_SECONDS", "30"))


def test_soak(pg_server, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    # The daemon's memory is checked: its JVM runs as users run it, not with the tests' fast JVM
    # options (tests/conftest.py), whose serial GC grows and keeps the heap differently.
    if os.environ.get("PGTRICKLE_SPARK_CONF") == FAST_JVM_CONF:
        monkeypatch.delenv("PGTRICKLE_SPARK_CONF")
    soak = _soak_module()
    cfg = soak.SoakConfig(
        dsn=pg_server.admin_dsn,
        duration=SOAK_SECONDS,
        # 4 bursts and the 8 memory samples the soak needs however short the run, even when a sample
        # takes 2 s on a loaded machine (every 30 s / 5 s in the long run)
        burst_every=min(30.0, SOAK_SECONDS / 4),
        sample_every=min(5.0, SOAK_SECONDS / 30),
        spark_master=os.environ.get("PGTRICKLE_TEST_SPARK_MASTER", "local[2]"),
        grace=float(os.environ.get("PGTRICKLE_SOAK_GRACE", "120")),
        # Two minutes are the Spark driver's warm-up: its heap (spark.driver.memory, 1 GB) is still
        # filling, so its RSS only shows a leak in the long run (30 min: flat at 0.9-1.6 GB).
        jvm_growth_mb=float(os.environ.get("PGTRICKLE_SOAK_JVM_GROWTH_MB", "768")),
        quiet=False,
    )
    report = soak.run_soak(cfg)
    soak.print_report(report)
    assert report.problems == [], "\n".join(report.problems + report.summary.get("daemon_log_tail", []))
    assert len(report.verified) == 50 and set(report.verified.values()) == {"ok"}
    assert report.writes["bursts"] >= 3 and report.writes["rows_changed"] > 1000
    assert report.summary["refreshes"] > 0
