"""Spark Connect URLs and the session settings pgtrickle sets on a Spark Connect server (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgtrickle.config import Settings
from pgtrickle.errors import ConfigError
from pgtrickle.spark.connect import DEFAULT_PORT, parse_remote, session_conf
from pgtrickle.spark.session import default_conf


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        ("sc://127.0.0.1:15002", "127.0.0.1", 15002),
        ("sc://spark.internal", "spark.internal", DEFAULT_PORT),
        ("sc://spark.internal:443/;use_ssl=true;token=abc", "spark.internal", 443),
        ("sc://[::1]:9000", "::1", 9000),
    ],
)
def test_urls_that_are_accepted(url: str, host: str, port: int) -> None:
    address = parse_remote(url)
    assert (address.host, address.port, address.url) == (host, port, url)
    assert "token" not in address.shown and address.shown.startswith("sc://")


@pytest.mark.parametrize(
    "url",
    [
        "http://host:15002",
        "host:15002",
        "sc://",
        "sc://host:notaport",
        "sc://user:pw@host:1",
        "sc://host:1/path",
        "local[2]",
    ],
)
def test_urls_that_are_refused_say_the_form(url: str) -> None:
    with pytest.raises(ConfigError, match="sc://host:port"):
        parse_remote(url)


def test_a_refused_url_does_not_echo_its_token() -> None:
    with pytest.raises(ConfigError) as err:
        parse_remote("https://host/;token=s3cret")
    assert "s3cret" not in str(err.value)


def test_only_runtime_sql_settings_go_to_the_server() -> None:
    settings = Settings(
        data_dir=Path("/tmp/x"),
        spark_conf={
            "spark.sql.shuffle.partitions": "7",
            "spark.executor.memory": "4g",
            "spark.sql.ansi.enabled": "true",
        },
    )
    conf = session_conf(default_conf(settings), settings)
    assert conf["spark.sql.shuffle.partitions"] == "7"
    assert conf["spark.sql.session.timeZone"] == "UTC" and conf["spark.sql.caseSensitive"] == "true"
    assert all(k.startswith("spark.sql.") for k in conf)
    assert "spark.sql.warehouse.dir" not in conf and "spark.executor.memory" not in conf


def test_the_environment_variable_sets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGTRICKLE_SPARK_REMOTE", "sc://h:1")
    assert Settings.from_env().spark_remote == "sc://h:1"
    monkeypatch.setenv("PGTRICKLE_SPARK_REMOTE", "")
    assert Settings.from_env().spark_remote is None


def test_a_lost_session_is_recognised_by_its_error_condition() -> None:
    from pyspark.errors.exceptions.connect import SparkConnectGrpcException

    from pgtrickle.spark.session import session_lost

    lost = SparkConnectGrpcException(
        "gone", errorClass="INVALID_HANDLE.SESSION_CLOSED", messageParameters={"handle": "h"}
    )
    assert session_lost(lost)
    try:
        raise RuntimeError("refresh failed") from lost
    except RuntimeError as wrapped:
        assert session_lost(wrapped)
    other = SparkConnectGrpcException("bad", errorClass="DIVIDE_BY_ZERO", messageParameters={"config": "c"})
    assert not session_lost(other) and not session_lost(ValueError("x"))
