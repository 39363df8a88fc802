"""Spark start-up checks that give a clear error instead of "Java gateway process exited" (no JVM started)."""

from __future__ import annotations

import socket

import pytest

from pgtrickle.errors import SparkError
from pgtrickle.spark.session import check_java, check_master, reach_master


@pytest.mark.parametrize(
    "master",
    [
        "local",
        "local[1]",
        "local[*]",
        "local[4,2]",
        "local[*,3]",
        "local-cluster[2,1,1024]",
        "local-cluster[2, 1, 1024]",
        "spark://127.0.0.1:7077",
        "spark://h1:7077,h2:7077",
        "yarn",
        "k8s://https://k8s.example:443",
    ],
)
def test_master_urls_spark_accepts(master: str) -> None:
    check_master(master)


@pytest.mark.parametrize(
    "master",
    [
        "",
        "nonsense",
        "local[0]",
        "local[x]",
        "local-cluster[2,1]",
        "spark://",
        "mesos://h:5050",
        "LOCAL",
        "local[*] ",
    ],
)
def test_master_urls_spark_refuses_are_refused_with_the_forms(master: str) -> None:
    with pytest.raises(SparkError, match=r"is not a Spark master URL; use local, local\[N\]"):
        check_master(master)


def test_an_unreachable_standalone_master_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connection refused
        with pytest.raises(SparkError, match=rf"no Spark master answers at spark://127.0.0.1:{port}"):
            reach_master(f"spark://127.0.0.1:{port}", timeout=2)


def test_a_listening_standalone_master_passes() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        reach_master(f"spark://127.0.0.1:1,127.0.0.1:{s.getsockname()[1]}", timeout=2)
    reach_master("local[2]")  # nothing to reach


def test_missing_java_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(SparkError, match="has no bin/java"):
        check_java()
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SparkError, match="no java on PATH; install one"):
        check_java()
