"""The secret references docs/DEPLOYMENT.md tells operators to write, resolved as a deployed process would."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import pytest

from replicator.configuration.secrets import (
    ENV_ALLOWED_ENV,
    ENV_ALLOWED_PATHS,
    SecretReferenceError,
    resolve_references,
)

DEPLOYMENT = Path(__file__).resolve().parents[1] / "docs" / "DEPLOYMENT.md"
# The API's own bearer token: read by `mirus api` itself at start (`mirus/api/auth.py`, any path), never by a
# connector's clients, so the connectors' allow-lists do not apply to it.
API_TOKEN_REFERENCE = "${file:/etc/mirus/api/token}"


def documented_references() -> list[str]:
    """The references connectors' configs are told to use (the platform's processes resolve them under the
    deployment's allow-lists)."""
    found = sorted(set(re.findall(r"\$\{(?:env|file):[^}]+\}", DEPLOYMENT.read_text())) - {API_TOKEN_REFERENCE})
    assert any(r.startswith("${env:") for r in found) and any(r.startswith("${file:") for r in found), found
    return found


def assert_documented_references_resolve(environment: Mapping[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """With a process's environment as the deployment sets it (its allow-lists) and each referenced variable set,
    every documented reference resolves, or fails only because the mounted file is not on this machine."""
    for name in (ENV_ALLOWED_ENV, ENV_ALLOWED_PATHS):
        if name in environment:
            monkeypatch.setenv(name, environment[name])
        else:
            monkeypatch.delenv(name, raising=False)
    for reference in documented_references():
        variable = re.fullmatch(r"\$\{env:([^}]+)\}", reference)
        if variable:
            monkeypatch.setenv(variable.group(1), "from-the-environment")
            assert resolve_references(reference) == "from-the-environment", reference
        else:
            with pytest.raises(SecretReferenceError, match="cannot read"):  # allowed; absent here
                resolve_references(reference)
