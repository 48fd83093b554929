"""What secured kit brokers need, made fresh at each start: TLS material, SCRAM users and client settings.

As a production cluster is set up (and as the shared kit's `start.sh --secure` does): a throwaway CA, one broker
certificate (SAN `IP:127.0.0.1`, `DNS:localhost`, so that librdkafka's host-name check passes), a client certificate
of the `replicator` user for mutual TLS, and SCRAM-SHA-256/512 users with random passwords: `admin` (the brokers'
super user, which they also log in as) and `replicator` (no ACLs until a test grants some).

Certificates are made with the `cryptography` package, in the process (a keytool run is a JVM start: the 26 that
one secured kit took cost 40 s of CPU in the suite); the stores are PKCS12, which both Kafka and librdkafka read,
and the truststore holds the CA as Java's trusted-certificate entry. SCRAM credentials are computed here as
Kafka's ScramFormatter does and written into ZooKeeper before the brokers start, where `kafka-configs.sh` would put
them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SCRAM_MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
SCRAM_ITERATIONS = 4096  # Kafka's minimum
USERS = ("admin", "replicator")
SUPER_USER = "admin"
VALIDITY_DAYS = 30


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

    def _make_certificates(self) -> None:
        """A CA, the broker's certificate and the `replicator` user's, each key stored with its chain."""
        password = serialization.BestAvailableEncryption(self.store_password.encode())
        ca_key = _key()
        ca_name = _name("mirus kit test CA")
        ca = (
            _builder(ca_name, ca_name, ca_key.public_key(), ca_key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_key_usage(key_cert_sign=True, crl_sign=True), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        # The broker's subject alternative names, so that librdkafka's host-name check passes.
        names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        holders = {
            "broker": ("localhost", ExtendedKeyUsageOID.SERVER_AUTH, x509.SubjectAlternativeName(names)),
            "replicator": ("replicator", ExtendedKeyUsageOID.CLIENT_AUTH, None),
        }
        for alias, (common_name, usage, alternative_names) in holders.items():
            key = _key()
            builder = (
                _builder(_name(common_name), ca_name, key.public_key(), ca_key.public_key())
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(_key_usage(digital_signature=True, key_encipherment=True), critical=True)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            )
            if alternative_names is not None:
                builder = builder.add_extension(alternative_names, critical=False)
            certificate = builder.sign(ca_key, hashes.SHA256())
            store = pkcs12.serialize_key_and_certificates(alias.encode(), key, certificate, [ca], password)
            (self.directory / f"{alias}.p12").write_bytes(store)
        self.ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        self.truststore.write_bytes(pkcs12.serialize_java_truststore([pkcs12.PKCS12Certificate(ca, b"ca")], password))


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: x509.Name, issuer: x509.Name, key: rsa.RSAPublicKey, issuer_key: rsa.RSAPublicKey
) -> x509.CertificateBuilder:
    now = datetime.now(UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))  # clocks a little apart
        .not_valid_after(now + timedelta(days=VALIDITY_DAYS))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key), critical=False)
    )


def _key_usage(**granted: bool) -> x509.KeyUsage:
    usages = [
        "digital_signature",
        "content_commitment",
        "key_encipherment",
        "data_encipherment",
        "key_agreement",
        "key_cert_sign",
        "crl_sign",
        "encipher_only",
        "decipher_only",
    ]
    return x509.KeyUsage(**{usage: granted.get(usage, False) for usage in usages})
