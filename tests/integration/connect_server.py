"""A Spark Connect server for tests, started from the installed PySpark on loopback.

``pyspark/sbin/start-connect-server.sh --wait`` runs the server in the
foreground: it is started in a session of its own (so the whole process
group, JVM included, is stopped at the end and none is left behind), on a
free port bound to 127.0.0.1, with the PostgreSQL JDBC driver on its
classpath and its logs, pid file and scratch space in a temporary
directory. :func:`start` waits until it accepts connections.

Policy: where it cannot start, the tests that need it FAIL in CI
(``CI`` set) and are skipped, with the reason, elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyspark

from tests.conftest import FAST_JVM

START_TIMEOUT = 300.0
"""Seconds to wait for the server to accept connections (it takes 10-60 s on a loaded 2-core machine)."""


@dataclass
class ConnectServer:
    url: str
    port: int
    process: subprocess.Popen  # type: ignore[type-arg]
    workdir: Path

    def log_tail(self, lines: int = 30) -> str:
        log = self.workdir / "server.log"
        if not log.exists():
            return ""
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the server's whole process group (TERM, then KILL) and remove its directory."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        else:
            # The launcher ended; a JVM it started may not have.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        shutil.rmtree(self.workdir, ignore_errors=True)


class ConnectServerError(RuntimeError):
    """The test Spark Connect server could not be started."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def start(jdbc_jar: str, timeout: float = START_TIMEOUT) -> ConnectServer:
    """Start a Spark Connect server (local[2]) on a free loopback port; wait until it accepts."""
    spark_home = Path(pyspark.__file__).parent
    script = spark_home / "sbin" / "start-connect-server.sh"
    if not script.exists():
        raise ConnectServerError(f"the installed PySpark has no {script}")
    if not Path(jdbc_jar).is_file():
        raise ConnectServerError(f"the PostgreSQL JDBC driver is not at {jdbc_jar} (scripts/ensure-jdbc.sh)")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise ConnectServerError("no Java to run the Spark Connect server with")
    workdir = Path(tempfile.mkdtemp(prefix="pgtrickle-connect-", dir="/tmp"))
    port = _free_port()
    env = dict(
        os.environ,
        SPARK_HOME=str(spark_home),
        SPARK_PID_DIR=str(workdir),
        SPARK_LOG_DIR=str(workdir),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_IDENT_STRING=f"pgtrickle-test-{port}",
    )
    env.pop("SPARK_REMOTE", None)
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    conf = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.grpc.port.maxRetries": "0",
        "spark.ui.enabled": "false",
        "spark.local.dir": str(workdir / "local"),
        "spark.sql.warehouse.dir": str(workdir / "warehouse"),
        "spark.driver.memory": "1g",
        # C1-only JIT and the serial GC (tests/conftest.py): the server's start dominates its work here.
        "spark.driver.defaultJavaOptions": FAST_JVM,
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={workdir} -Duser.timezone=UTC",
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    }
    args = [str(script), "--wait", "--master", "local[2]", "--jars", jdbc_jar]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    log = (workdir / "server.log").open("wb")
    process = subprocess.Popen(
        args,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=workdir,
        start_new_session=True,
    )
    log.close()
    server = ConnectServer(f"sc://127.0.0.1:{port}", port, process, workdir)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = server.log_tail()
            server.stop()
            raise ConnectServerError(f"the Spark Connect server exited with {process.returncode}:\n{tail}")
        if _accepts(port):
            return server
        time.sleep(0.5)
    tail = server.log_tail()
    server.stop()
    raise ConnectServerError(
        f"the Spark Connect server did not accept connections within {timeout:.0f}s:\n{tail}"
    )
