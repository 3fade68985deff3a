"""The project-local PostgreSQL that ``make serve`` runs Prefect and MLflow on.

Debian's ``postgresql`` (``sudo apt-get install -y postgresql``, or ``make serve-prereqs``) gives the
binaries; the cluster lives in ``<project>/data/postgres`` (``$CONCORD_POSTGRES_DIR`` for another
folder): its data in ``db/``, the password of its one role (``concord``, made at ``initdb``) in
``password`` (mode 0600, readable by whoever runs ``make serve`` only). It listens on 127.0.0.1 only
(no Unix socket), on ``$CONCORD_POSTGRES_PORT`` or a free port, and every connection needs the
password (``scram-sha-256``). PostgreSQL refuses to run as root: run as root, the cluster belongs to
the ``postgres`` user Debian's package creates, and its server runs as that user (``runuser``); the
password file stays root's. Each database (``prefect``, ``mlflow``) is created on first use.

Only the standard library is imported at module level; :meth:`Cluster.ensure_database` imports ``psycopg``
(3), the driver MLflow's URL names too (``postgresql+psycopg://``).
"""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

DIR_ENV = "CONCORD_POSTGRES_DIR"
PORT_ENV = "CONCORD_POSTGRES_PORT"
ROLE = "concord"
#: the user a cluster belongs to when ``make serve`` runs as root (Debian's package creates it)
ROOT_OWNER = "postgres"
INSTALL = "sudo apt-get install -y postgresql, or `make serve-prereqs`"
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


class PostgresError(RuntimeError):
    """The cluster could not be made, started or reached; the message says what to do."""


def bindir() -> Path | None:
    """The folder of PostgreSQL's server binaries (``initdb``, ``postgres``, ``pg_isready``): the
    newest ``/usr/lib/postgresql/<version>/bin`` (Debian's layout), else the folder of ``initdb`` on
    the PATH; None when PostgreSQL is not installed."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                      key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    if versions:
        return versions[-1].parent
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


def owner() -> str | None:
    """The user the cluster and its server run as: None (the current user) unless this is root."""
    return ROOT_OWNER if os.geteuid() == 0 else None


def as_owner(command: Sequence[str], user: str | None) -> list[str]:
    """``command`` run as ``user`` (``runuser -u USER --``), or as it is when ``user`` is None."""
    return [shutil.which("runuser") or "runuser", "-u", user, "--", *command] if user else list(command)


@dataclass(frozen=True)
class Cluster:
    """A cluster's folder, the binaries that run it and the user it runs as."""

    root: Path
    bin: Path
    user: str | None = None

    @property
    def data(self) -> Path:
        return self.root / "db"

    @property
    def password_file(self) -> Path:
        return self.root / "password"

    def password(self) -> str:
        return self.password_file.read_text().strip()

    def url(self, port: int, database: str, *, driver: str = "") -> str:
        """``postgresql[+driver]://concord:PASSWORD@127.0.0.1:PORT/DATABASE``."""
        scheme = f"postgresql+{driver}" if driver else "postgresql"
        return f"{scheme}://{ROLE}:{urllib.parse.quote(self.password(), safe='')}@127.0.0.1:{port}/{database}"

    def exists(self) -> bool:
        return (self.data / "PG_VERSION").is_file() and self.password_file.is_file()

    def init(self, say: Callable[[str], None]) -> None:
        """Make the cluster (``initdb``) unless it exists: its one role ``concord`` with a new
        random password, UTF-8, no locale."""
        if self.exists():
            return
        if self.data.exists() and any(self.data.iterdir()):
            raise PostgresError(f"{self.data} holds files but no cluster with its password file {self.password_file}: "
                                f"move it away (or set {DIR_ENV} to another folder), then start again")
        self.root.mkdir(parents=True, exist_ok=True)
        say(f"creating a PostgreSQL cluster in {self.root} (initdb, role {ROLE}, listening on 127.0.0.1 only)")
        password = secrets.token_urlsafe(24)
        pwfile = self.root / "initdb-password"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
        try:
            self.data.mkdir(mode=0o700, exist_ok=True)
            if self.user:
                entry = pwd.getpwnam(self.user)
                os.chown(self.data, entry.pw_uid, entry.pw_gid)
                os.chown(pwfile, entry.pw_uid, entry.pw_gid)  # initdb, as that user, reads it once
                reach = subprocess.run(as_owner(["test", "-w", str(self.data)], self.user), capture_output=True)
                if reach.returncode != 0:
                    raise PostgresError(f"the {self.user} user cannot reach {self.data} (PostgreSQL refuses to run as root, "
                                        f"so its cluster belongs to {self.user}): set {DIR_ENV} to a folder every parent "
                                        "of which others may enter (mode o+x), e.g. under /var/tmp")
            done = subprocess.run(as_owner([str(self.bin / "initdb"), "-D", str(self.data), "-U", ROLE,
                                            "--pwfile", str(pwfile), "--auth=scram-sha-256", "-E", "UTF8",
                                            "--no-locale"], self.user), capture_output=True, text=True)
            if done.returncode != 0:
                raise PostgresError(f"initdb of {self.data} failed: {(done.stderr or done.stdout).strip()[-800:]}")
            if self.user:
                os.chown(pwfile, os.geteuid(), os.getegid())
            os.replace(pwfile, self.password_file)  # last: a cluster is whole once its password is in place
        finally:
            pwfile.unlink(missing_ok=True)

    def command(self, port: int) -> list[str]:
        """The command that runs the cluster's server in the foreground on 127.0.0.1:``port``."""
        return as_owner([str(self.bin / "postgres"), "-D", str(self.data), "-p", str(port),
                         "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
                         "-c", "max_connections=200"], self.user)

    def ready(self, port: int) -> bool:
        done = subprocess.run([str(self.bin / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port), "-t", "2"],
                              capture_output=True)
        return done.returncode == 0

    def wait_ready(self, port: int, alive: Callable[[], bool], timeout: float, log: str) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready(port):
            if not alive():
                raise PostgresError(f"the PostgreSQL server exited; see {log}")
            if time.monotonic() > deadline:
                raise PostgresError(f"PostgreSQL does not accept connections on 127.0.0.1:{port} after {timeout:.0f} s; see {log}")
            time.sleep(0.3)

    def ensure_database(self, port: int, name: str) -> bool:
        """Create the database ``name`` unless it exists; True when it was created."""
        if not _NAME.match(name):
            raise PostgresError(f"{name!r} is no database name Concord makes (lower-case letters, digits, _)")
        import psycopg

        try:
            # autocommit: CREATE DATABASE cannot run in a transaction
            with psycopg.connect(host="127.0.0.1", port=port, user=ROLE, password=self.password(), dbname="postgres",
                                 connect_timeout=10, autocommit=True) as conn:
                if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                    return False
                conn.execute(f'CREATE DATABASE "{name}"')
                return True
        except psycopg.Error as exc:
            raise PostgresError(f"PostgreSQL on 127.0.0.1:{port} (cluster {self.root}) refused to create the database "
                                f"{name}: {exc}".strip()) from exc


def cluster(project_dir: Path) -> Cluster | None:
    """The cluster of ``project_dir`` (``$CONCORD_POSTGRES_DIR``, else ``<project>/data/postgres``),
    None when PostgreSQL is not installed."""
    found = bindir()
    if found is None:
        return None
    root = os.environ.get(DIR_ENV, "").strip()
    return Cluster(Path(root).resolve() if root else Path(project_dir).resolve() / "data" / "postgres", found, owner())
