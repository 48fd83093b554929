"""PgBouncer in transaction pooling mode in front of the session's Postgres, from Debian's `pgbouncer` package.

Not a test module. `start_pgbouncer` installs the package with apt-get when the machine lacks it (as the browser
tests install chromium: `tests/debian.py`, an error with apt's output when impossible, never a skip) and starts it
on a free port, routing every database name to the Postgres of `database_url`.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psycopg2
from sqlalchemy.engine import make_url

from mirus.local.stack import free_port, log_tail
from mirus.waiting import wait_until
from tests.debian import ensure_debian_packages

PGBOUNCER = Path("/usr/sbin/pgbouncer")
SYSTEM_USER = "postgres"  # PgBouncer refuses to run as root; the package creates this user


@dataclass
class PgBouncer:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def url(self, database_url: str, database: str | None = None) -> str:
        """`database_url` pointed at PgBouncer instead of its server (and at `database`, if given)."""
        url = make_url(database_url).set(host="127.0.0.1", port=self.port)
        return url.set(database=database or url.database).render_as_string(hide_password=False)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


def start_pgbouncer(database_url: str, directory: Path) -> PgBouncer:
    ensure_debian_packages(("pgbouncer",), (PGBOUNCER,))
    server = make_url(database_url)
    port = free_port()
    auth_file = directory / "userlist.txt"
    auth_file.write_text(f'"{server.username}" "{server.password or ""}"\n')
    config = directory / "pgbouncer.ini"
    # A wildcard database: any name a test connects to goes to the same server (tests migrate a database of their
    # own). A pool larger than the tests' owners, standbys and checks together, so that none waits for a server.
    config.write_text(
        "[databases]\n"
        f"* = host={server.host} port={server.port}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {auth_file}\n"
        "pool_mode = transaction\ndefault_pool_size = 40\nmax_client_conn = 400\n"
    )
    log = directory / "pgbouncer.log"
    user = ["-u", SYSTEM_USER] if os.geteuid() == 0 else []
    with log.open("ab") as out:
        process = subprocess.Popen([str(PGBOUNCER), *user, str(config)], stdout=out, stderr=subprocess.STDOUT)
    bouncer = PgBouncer(process, port, log)

    def answers() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"pgbouncer exited with {process.returncode}:\n{log_tail(log)}")
        try:
            psycopg2.connect(
                host="127.0.0.1",
                port=port,
                user=server.username,
                password=server.password,
                dbname=server.database,
                connect_timeout=2,
            ).close()
        except psycopg2.OperationalError:
            return False
        return True

    try:
        wait_until(answers, timeout=30, what=f"pgbouncer answering on port {port}")
    except BaseException:
        bouncer.stop()
        raise
    return bouncer
