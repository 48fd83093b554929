"""What secured kit brokers need, made fresh at each start: TLS material, SCRAM users and client settings.

As a production cluster is set up (and as the shared kit's `start.sh --secure` does): a throwaway CA, one broker
certificate (SAN `IP:127.0.0.1`, `DNS:localhost`, so that librdkafka's host-name check passes), a client certificate
of the `replicator` user for mutual TLS, and SCRAM-SHA-256/512 users with random passwords: `admin` (the brokers'
super user, which they also log in as) and `replicator` (no ACLs until a test grants some).

Certificates are made with Java's keytool, which every machine that runs the kit has (openssl is not on every
clean machine); the stores are PKCS12, which both Kafka and librdkafka read. SCRAM credentials are computed here as
Kafka's ScramFormatter does and written into ZooKeeper before the brokers start, where `kafka-configs.sh` would put
them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

SCRAM_MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
SCRAM_ITERATIONS = 4096  # Kafka's minimum
USERS = ("admin", "replicator")
SUPER_USER = "admin"
VALIDITY_DAYS = "30"
BROKER_NAMES = "ip:127.0.0.1,dns:localhost"  # the broker certificate's subject alternative names


class CertificateError(RuntimeError):
    """keytool failed; the message holds its output."""


def scram_credential(password: str, mechanism: str) -> str:
    """A SCRAM credential as Kafka keeps it in ZooKeeper (`ScramCredentialUtils.credentialToString`)."""
    digest = SCRAM_MECHANISMS[mechanism]
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac(digest, password.encode(), salt, SCRAM_ITERATIONS)
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    stored_key = hashlib.new(digest, client_key).digest()
    server_key = hmac.new(salted, b"Server Key", digest).digest()
    parts = {"salt": salt, "stored_key": stored_key, "server_key": server_key}
    return ",".join(f"{k}={base64.b64encode(v).decode()}" for k, v in parts.items()) + f",iterations={SCRAM_ITERATIONS}"


def user_config(password: str) -> str:
    """The ZooKeeper node of a user (`/config/users/<name>`): its credentials for every SCRAM mechanism."""
    config = {mechanism: scram_credential(password, mechanism) for mechanism in SCRAM_MECHANISMS}
    return json.dumps({"version": 1, "config": config}, separators=(",", ":"))


@dataclass(frozen=True)
class KitSecurity:
    """The TLS material under `directory` and the users' passwords (`passwords[user]`)."""

    directory: Path
    store_password: str
    passwords: dict[str, str]

    @classmethod
    def make(cls, directory: Path) -> KitSecurity:
        directory.mkdir(parents=True, exist_ok=True)
        security = cls(directory, secrets.token_hex(12), {user: secrets.token_hex(12) for user in USERS})
        security._make_certificates()
        return security

    @property
    def ca_pem(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def broker_keystore(self) -> Path:
        return self.directory / "broker.p12"

    @property
    def truststore(self) -> Path:
        return self.directory / "truststore.p12"

    @property
    def client_keystore(self) -> Path:
        """The `replicator` user's certificate and key (PKCS12, `store_password`), for mutual TLS."""
        return self.directory / "replicator.p12"

    def client_settings(self, user: str, mechanism: str = "SCRAM-SHA-256") -> dict[str, str]:
        """librdkafka settings of `user` (SASL_SSL, the kit's CA); add `bootstrap.servers`."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": self.passwords[user],
            "ssl.ca.location": str(self.ca_pem),
        }

    def certificate_settings(self) -> dict[str, str]:
        """librdkafka settings of the `replicator` certificate's holder, `User:CN=replicator`, on the mutual-TLS
        listener (SSL, client certificate required); add `bootstrap.servers`."""
        return {
            "security.protocol": "SSL",
            "ssl.ca.location": str(self.ca_pem),
            "ssl.keystore.location": str(self.client_keystore),
            "ssl.keystore.password": self.store_password,
        }

    def jaas(self) -> Path:
        """The brokers' JAAS file: their SCRAM server and the login they use with each other, as `admin`."""
        path = self.directory / "jaas.conf"
        login = f'username="{SUPER_USER}" password="{self.passwords[SUPER_USER]}"'
        module = "org.apache.kafka.common.security.scram.ScramLoginModule"
        path.write_text(f"KafkaServer {{\n  {module} required {login};\n}};\n")
        return path

    def broker_properties(self) -> list[str]:
        return [
            "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-256",
            f"sasl.enabled.mechanisms={','.join(SCRAM_MECHANISMS)}",
            f"ssl.keystore.location={self.broker_keystore}",
            "ssl.keystore.type=PKCS12",
            f"ssl.keystore.password={self.store_password}",
            f"ssl.key.password={self.store_password}",
            f"ssl.truststore.location={self.truststore}",
            "ssl.truststore.type=PKCS12",
            f"ssl.truststore.password={self.store_password}",
            "authorizer.class.name=kafka.security.auth.SimpleAclAuthorizer",
            "allow.everyone.if.no.acl.found=false",
            f"super.users=User:{SUPER_USER}",
        ]

    def zookeeper_commands(self, chroot: str) -> list[str]:
        """ZooKeeperMain commands that create a cluster's chroot with its users, before its broker starts."""
        paths = [f"/{chroot}", f"/{chroot}/config", f"/{chroot}/config/changes", f"/{chroot}/config/users"]
        users = [f"create /{chroot}/config/users/{user} {user_config(p)}" for user, p in self.passwords.items()]
        return [f'create {path} ""' for path in paths] + users

    # -- certificates --

    def _keytool(self, *args: str) -> None:
        try:
            done = subprocess.run(
                ["keytool", *args], cwd=self.directory, capture_output=True, text=True, stdin=subprocess.DEVNULL
            )
        except FileNotFoundError:
            raise CertificateError("keytool not found: install a Java runtime (it ships keytool)") from None
        if done.returncode != 0:
            raise CertificateError(f"keytool {' '.join(args[:2])} failed:\n{done.stdout}{done.stderr}")

    def _store(self, name: str) -> tuple[str, ...]:
        return ("-keystore", name, "-storetype", "PKCS12", "-storepass", self.store_password)

    def _keypair(self, alias: str, subject: str, *extra: str) -> None:
        self._keytool(
            "-genkeypair", "-alias", alias, "-keyalg", "RSA", "-keysize", "2048", "-dname", subject,
            "-validity", VALIDITY_DAYS, *extra, *self._store(f"{alias}.p12"),
        )  # fmt: skip

    def _signed(self, alias: str, extensions: tuple[str, ...]) -> None:
        """`alias`'s key pair certified by the CA, with the CA's certificate as its chain."""
        self._keytool("-certreq", "-alias", alias, "-file", f"{alias}.csr", *self._store(f"{alias}.p12"))
        self._keytool(
            "-gencert", "-alias", "ca", "-infile", f"{alias}.csr", "-outfile", f"{alias}.pem", "-rfc",
            "-validity", VALIDITY_DAYS, *extensions, *self._store("ca.p12"),
        )  # fmt: skip
        self._keytool("-importcert", "-noprompt", "-alias", "ca", "-file", "ca.pem", *self._store(f"{alias}.p12"))
        self._keytool("-importcert", "-alias", alias, "-file", f"{alias}.pem", *self._store(f"{alias}.p12"))

    def _make_certificates(self) -> None:
        # Each keytool run is a JVM start (1-2 s on a busy machine): independent steps run side by side.
        with ThreadPoolExecutor(3) as pool:
            keypairs = [
                pool.submit(self._keypair, "ca", "CN=mirus kit test CA", "-ext", "bc:c"),
                pool.submit(self._keypair, "broker", "CN=localhost"),
                pool.submit(self._keypair, "replicator", "CN=replicator"),
            ]
            for future in keypairs:
                future.result()
        self._keytool("-exportcert", "-rfc", "-alias", "ca", "-file", "ca.pem", *self._store("ca.p12"))
        with ThreadPoolExecutor(3) as pool:
            signed = [
                pool.submit(self._signed, "broker", ("-ext", f"SAN={BROKER_NAMES}", "-ext", "EKU=serverAuth")),
                pool.submit(self._signed, "replicator", ("-ext", "EKU=clientAuth")),
                pool.submit(
                    self._keytool, "-importcert", "-noprompt", "-alias", "ca", "-file", "ca.pem",
                    *self._store("truststore.p12"),
                ),
            ]  # fmt: skip
            for future in signed:
                future.result()
