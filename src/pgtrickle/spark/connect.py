"""Spark Connect: every refresh runs on a remote Spark Connect server, no JVM in this process.

With ``--spark-remote sc://host:port`` (``PGTRICKLE_SPARK_REMOTE``) the
SparkSession is a Spark Connect client (``pyspark.sql.connect``, which the
Java-free ``pyspark-client`` package provides). The refresh code is the same:
it uses only APIs both kinds of session have (SQL, DataFrames, JDBC reads
and writes, runtime SQL settings, job tags); what differs is in
:mod:`pgtrickle.spark.capabilities`.

What moves to the server: the JDBC reads and writes run there, so the
PostgreSQL JDBC driver must be on the *server's* classpath (``--jars``) and
the DSN pgtrickle gives Spark must be reachable *from the server*; a Spark
master, the driver's memory and other static settings are the server's own.
pgtrickle sets only runtime SQL settings on its session (time zone, ANSI
mode, case sensitivity, shuffle partitions, and every ``spark.sql.*`` entry
of ``PGTRICKLE_SPARK_CONF``). See docs/DEPLOYMENT.md.

Snapshot and exactness guarantees are unchanged: every JDBC connection the
server opens starts with the same ``sessionInitStatement`` (the exported
snapshot and the source guard), and values cross by the same carry rules.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from pgtrickle.config import Settings
from pgtrickle.errors import ConfigError, SparkConnectUnreachableError

DEFAULT_PORT = 15002
"""Spark Connect's default port (``spark.connect.grpc.binding.port``)."""

RUNTIME_PREFIX = "spark.sql."
"""Settings a Spark Connect client may set on its own session (static ones are the server's)."""


@dataclass(frozen=True)
class RemoteAddress:
    """Where a Spark Connect URL points (``sc://host:port/;param=value;…``)."""

    url: str
    host: str
    port: int

    @property
    def shown(self) -> str:
        """The URL without its parameters (a ``token=`` must not reach logs or errors)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"sc://{host}:{self.port}"


def parse_remote(url: str) -> RemoteAddress:
    """Check a Spark Connect URL and say where it points (pure).

    Refuses anything but ``sc://host[:port][/;param=value…]`` with a
    :class:`~pgtrickle.errors.ConfigError` that names the accepted form.
    """
    form = (
        "use sc://host:port (parameters after a '/;', e.g. sc://host:443/;use_ssl=true;token=…) "
        "for --spark-remote / PGTRICKLE_SPARK_REMOTE"
    )
    text = url.strip()
    if not text.startswith("sc://"):
        raise ConfigError(f"{_without_params(text)!r} is not a Spark Connect URL; {form}")
    parts = urlsplit(text)
    try:
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise ConfigError(f"{_without_params(text)!r} has no valid port; {form}") from exc
    if (
        not host
        or parts.username
        or parts.password
        or (parts.path not in ("", "/") and not parts.path.startswith("/;"))
    ):
        raise ConfigError(f"{_without_params(text)!r} is not a Spark Connect URL; {form}")
    return RemoteAddress(text, host, port or DEFAULT_PORT)


def _without_params(url: str) -> str:
    return url.split(";", 1)[0]


def reach(address: RemoteAddress, timeout: float = 5.0) -> None:
    """Fail at once, naming the URL, when nothing accepts connections there.

    (The Spark Connect client itself retries an unreachable server for
    about ten minutes before it gives up.)
    """
    try:
        with socket.create_connection((address.host, address.port), timeout=timeout):
            return
    except OSError as exc:
        raise SparkConnectUnreachableError(
            f"no Spark Connect server answers at {address.shown} ({exc.strerror or exc}); is the server "
            "running and reachable from here, and is --spark-remote / PGTRICKLE_SPARK_REMOTE right?",
            address.shown,
        ) from None


def session_conf(defaults: dict[str, str], settings: Settings) -> dict[str, str]:
    """The runtime settings pgtrickle sets on its Spark Connect session (pure).

    pgtrickle's own ``spark.sql.*`` defaults, then every ``spark.sql.*``
    entry of ``PGTRICKLE_SPARK_CONF``; other keys (memory, local dirs, jars)
    belong to the server and are left out.
    """
    conf = {
        k: v for k, v in defaults.items() if k.startswith(RUNTIME_PREFIX) and k != "spark.sql.warehouse.dir"
    }
    conf.update({k: v for k, v in settings.spark_conf.items() if k.startswith(RUNTIME_PREFIX)})
    return conf


def open_session(settings: Settings, defaults: dict[str, str]):
    """A new Spark Connect session on ``settings.spark_remote``, with :func:`session_conf` set."""
    assert settings.spark_remote is not None
    address = parse_remote(settings.spark_remote)
    reach(address)
    try:
        from pyspark.sql.connect.session import SparkSession as RemoteSparkSession
    except ImportError as exc:
        raise SparkConnectUnreachableError(
            f"Spark Connect needs the client libraries (grpcio, pyarrow, pandas, zstandard…): "
            f"pip install 'pgtrickle[connect]' ({exc})",
            address.shown,
        ) from exc
    # The Connect builder, not SparkSession.builder.remote(): that one switches every
    # pyspark.sql.functions call of the process to Spark Connect.
    session = RemoteSparkSession.builder.remote(address.url).create()
    try:
        for key, value in session_conf(defaults, settings).items():
            session.conf.set(key, value)
    except Exception as exc:
        session.stop()
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SparkConnectUnreachableError(
            f"the Spark Connect server at {address.shown} did not accept pgtrickle's session: {detail}",
            address.shown,
        ) from exc
    return session
