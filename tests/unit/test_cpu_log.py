"""tests/cpu_log.py: the CPU seconds read from /proc/<pid>/stat."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.cpu_log import stat_cpu_seconds


def test_own_and_waited_children_ticks_after_a_command_name_with_spaces_and_parentheses() -> None:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    # cutime cstime priority ...
    stat = "4242 (java (main) x) S 1 4242 4242 0 -1 4194560 10 0 0 0 250 50 120 30 20 0 30 0"
    assert stat_cpu_seconds(stat, 100) == 4.5


def test_a_run_with_the_log_set_writes_one_line_per_test(tmp_path) -> None:  # type: ignore[no-untyped-def]
    test = tmp_path / "test_busy.py"
    test.write_text(
        "import subprocess, sys\n"
        "def test_spins_a_child():\n"
        "    subprocess.run([sys.executable, '-c', 'sum(range(3_000_000))'], check=True)\n"
        "def test_idle():\n"
        "    pass\n"
    )
    log = tmp_path / "cpu.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.cpu_log", str(test)],
        env={**os.environ, "PGTRICKLE_TEST_CPU_LOG": str(log)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["id"].split("::")[1] for line in lines] == ["test_spins_a_child", "test_idle"]
    # the child that ran and ended within the test counts (waited for by pytest)
    assert lines[0]["cpu"] >= 0.05 and lines[1]["cpu"] < lines[0]["cpu"], lines
    assert [line["ended"] for line in lines] == [0, 0]  # no process below pytest outlived a test
