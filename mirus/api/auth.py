"""Where the API listens and who may call it: settings from the environment, HTTP basic and bearer checks.

Credentials are given only as Kafka Connect config-provider references (`${env:NAME}`, `${file:/path}`,
`${file:/path.properties:key}`), resolved once at start, so they never sit in a command line or a settings dump.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import json
import logging
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from pydantic import BaseModel, Field, field_validator

from replicator.configuration.secrets import has_reference, parse_java_properties, resolve_references

ENV_HOST = "MIRUS_API_HOST"
ENV_PORT = "MIRUS_API_PORT"
ENV_BASIC_AUTH_USERS = "MIRUS_API_BASIC_AUTH_USERS"
ENV_BEARER_TOKEN = "MIRUS_API_BEARER_TOKEN"
ENV_METRICS_AUTH = "MIRUS_API_METRICS_AUTH"

log = logging.getLogger(__name__)

# Kafka Connect's own port, so that scripts written for Mirus work unchanged.
DEFAULT_PORT = 8083
# Readable without credentials, as in Kafka Connect (version probe); /metrics too unless `metrics_auth`.
OPEN_PATHS = frozenset({"/", "/metrics"})


class ApiSettings(BaseModel):
    host: str = Field(default="127.0.0.1", description="Interface to listen on (MIRUS_API_HOST).")
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535, description="TCP port (MIRUS_API_PORT).")
    basic_auth_users: str | None = Field(
        default=None,
        description="Reference to `user=password` lines (Java properties), e.g. ${file:/etc/mirus/api-users"
        ".properties} (MIRUS_API_BASIC_AUTH_USERS). Unset with no token: no authentication.",
    )
    bearer_token: str | None = Field(
        default=None, description="Reference to the bearer token, e.g. ${env:MIRUS_TOKEN} (MIRUS_API_BEARER_TOKEN)."
    )
    metrics_auth: bool = Field(
        default=False, description="/metrics requires the same credentials as the API (MIRUS_API_METRICS_AUTH)."
    )

    @field_validator("basic_auth_users", "bearer_token")
    @classmethod
    def _reference_only(cls, value: str | None) -> str | None:
        if value is not None and not has_reference(value):
            raise ValueError("must be a reference such as ${env:NAME} or ${file:/path}, never the secret itself")
        return value

    @classmethod
    def from_env(cls, **overrides: Any) -> ApiSettings:
        values: dict[str, Any] = {}
        for field, var in (
            ("host", ENV_HOST),
            ("port", ENV_PORT),
            ("basic_auth_users", ENV_BASIC_AUTH_USERS),
            ("bearer_token", ENV_BEARER_TOKEN),
            ("metrics_auth", ENV_METRICS_AUTH),
        ):
            if os.environ.get(var):
                values[field] = os.environ[var]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


class Credentials:
    """The resolved users and token; `SecretReferenceError` at construction if a reference cannot be read, and
    `ValueError` for an API that would listen beyond loopback without any (or guard /metrics with none)."""

    def __init__(self, settings: ApiSettings) -> None:
        self.users: dict[str, str] = {}
        self.token: str | None = None
        if settings.basic_auth_users:
            self.users = parse_java_properties(resolve_references(settings.basic_auth_users, restricted=False))
            if not self.users:
                raise ValueError(f"{ENV_BASIC_AUTH_USERS}: the referenced value holds no user=password line")
        if settings.bearer_token:
            self.token = resolve_references(settings.bearer_token, restricted=False).strip()
            if not self.token:
                raise ValueError(f"{ENV_BEARER_TOKEN}: the referenced value is empty")
        if not self.required and not settings.loopback:
            raise ValueError(
                f"the API would listen on {settings.host} without authentication: set {ENV_BEARER_TOKEN} or "
                f"{ENV_BASIC_AUTH_USERS}, or listen on a loopback address ({ENV_HOST}=127.0.0.1)"
            )
        if settings.metrics_auth and not self.required:
            raise ValueError(f"{ENV_METRICS_AUTH} needs {ENV_BEARER_TOKEN} or {ENV_BASIC_AUTH_USERS}")
        self.open_paths = OPEN_PATHS - ({"/metrics"} if settings.metrics_auth else set())

    @property
    def required(self) -> bool:
        return bool(self.users or self.token)

    def accepts(self, authorization: str | None) -> bool:
        scheme, _, value = (authorization or "").partition(" ")
        value = value.strip()
        if scheme.lower() == "bearer" and self.token is not None:
            return hmac.compare_digest(value.encode(), self.token.encode())
        if scheme.lower() == "basic" and self.users:
            try:
                user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return False
            expected = self.users.get(user)
            # Compare even for unknown users so that timing does not tell which users exist.
            return hmac.compare_digest(password.encode(), (expected or "\0").encode()) and expected is not None
        return False

    def challenge(self) -> str:
        return 'Basic realm="mirus"' if self.users else 'Bearer realm="mirus"'


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class AuthMiddleware:
    """Refuses every request but `OPEN_PATHS` without valid credentials: 401 with Kafka Connect's error body."""

    def __init__(self, app: ASGIApp, credentials: Credentials) -> None:
        self.app = app
        self.credentials = credentials

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.credentials.required or scope["path"] in self.credentials.open_paths:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        authorization = headers.get("authorization")
        if self.credentials.accepts(authorization):
            await self.app(scope, receive, send)
            return
        # A known scheme's name alone: a wrong password or token may be a right one mistyped, and a header without
        # a scheme may be a bare token.
        scheme = (authorization or "").partition(" ")[0]
        shown = scheme if scheme.lower() in ("basic", "bearer") else "no credentials" if not scheme else "other"
        client = scope.get("client") or ("?", 0)
        log.warning("refused %s %s from %s: 401 (%s)", scope["method"], scope["path"], client[0], shown)
        body = json.dumps({"error_code": 401, "message": "Unauthorized: valid credentials are required"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", self.credentials.challenge().encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
