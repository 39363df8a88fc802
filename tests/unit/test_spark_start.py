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


def _gateway_exited() -> Exception:
    from pyspark.errors import PySparkRuntimeError

    return PySparkRuntimeError(errorClass="JAVA_GATEWAY_EXITED", messageParameters={})


def test_a_jvm_that_exits_before_reporting_its_port_is_retried() -> None:
    from pgtrickle.spark.session import LAUNCH_PAUSES, launch

    calls: list[int] = []
    pauses: list[float] = []

    def start() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise _gateway_exited()
        return "session"

    assert launch(start, sleep=pauses.append) == "session"
    assert len(calls) == 3
    assert pauses == list(LAUNCH_PAUSES)


def test_a_jvm_that_never_starts_fails_after_the_last_attempt() -> None:
    from pyspark.errors import PySparkRuntimeError

    from pgtrickle.spark.session import LAUNCH_ATTEMPTS, launch

    calls: list[int] = []

    def start() -> str:
        calls.append(1)
        raise _gateway_exited()

    with pytest.raises(PySparkRuntimeError):
        launch(start, sleep=lambda _s: None)
    assert len(calls) == LAUNCH_ATTEMPTS


@pytest.mark.parametrize(
    "error",
    [
        ValueError("JAVA_GATEWAY_EXITED"),  # the text alone does not make it a gateway exit
        RuntimeError("Java gateway process exited before sending its port number"),
    ],
)
def test_other_start_errors_are_not_retried(error: Exception) -> None:
    from pgtrickle.spark.session import launch

    calls: list[int] = []

    def start() -> str:
        calls.append(1)
        raise error

    with pytest.raises(type(error)):
        launch(start, sleep=lambda _s: None)
    assert len(calls) == 1
