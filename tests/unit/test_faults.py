"""The fault-injection hook: parsing (pure) and the kill itself (in a child process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pgtrickle import faults
from pgtrickle.errors import ConfigError

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_parse_name_nth_and_delay() -> None:
    assert faults.parse("refresh.apply") == faults.FaultSpec("refresh.apply", 1, 0.0)
    assert faults.parse("refresh.apply:3") == faults.FaultSpec("refresh.apply", 3, 0.0)
    assert faults.parse(" wal.after_flush:2:0.25 ") == faults.FaultSpec("wal.after_flush", 2, 0.25)


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "nowhere",
        "refresh.apply:0",
        "refresh.apply:x",
        "refresh.apply:1:-1",
        "refresh.apply:1:soon",
        "refresh.apply:1:2:3",
        "REFRESH.APPLY",
    ],
)
def test_parse_refuses_what_would_never_fire(raw: str) -> None:
    with pytest.raises(ConfigError, match=faults.ENV):
        faults.parse(raw)


def test_every_point_in_the_code_is_a_known_name() -> None:
    import re

    used = set()
    for path in Path(SRC, "pgtrickle").rglob("*.py"):
        used |= set(re.findall(r'faults\.point\("([^"]+)"\)', path.read_text()))
    assert used == faults.POINTS


def test_point_is_inert_when_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(faults.ENV, raising=False)
    for _ in range(3):
        faults.point("refresh.apply")  # still alive


def test_point_is_inert_for_another_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.ENV, "wal.after_flush")
    faults.point("refresh.apply")


def test_a_malformed_setting_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.ENV, "refresh.aply")
    with pytest.raises(ConfigError, match="refresh.aply"):
        faults.point("refresh.apply")


def _child(spec: str, script: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=SRC, **{faults.ENV: spec})
    return subprocess.run(
        [sys.executable, "-c", "from pgtrickle import faults\n" + script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_nth_hit_kills_the_process_with_sigkill() -> None:
    done = _child(
        "refresh.apply:3", "for i in range(5):\n    print(i, flush=True)\n    faults.point('refresh.apply')"
    )
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split() == ["0", "1", "2"]
    assert "fault point refresh.apply reached (hit 3)" in done.stderr


def test_a_delayed_kill_lets_the_following_work_run_first() -> None:
    started = time.monotonic()
    done = _child(
        "refresh.spark_job:1:0.5",
        "import time\nfaults.point('refresh.spark_job')\nprint('after the point', flush=True)\n"
        "time.sleep(30)\nprint('never')",
    )
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split("\n")[0] == "after the point" and "never" not in done.stdout
    assert 0.5 <= time.monotonic() - started < 20
