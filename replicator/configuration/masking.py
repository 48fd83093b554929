"""The one rule for what is secret and how it is hidden: API responses, the UI, logs and error messages.

Every layer masks with this module (connector configs, `mirus verify`, the Dagster assets), so a value hidden in
one place is hidden in all of them, always as `SECRET_MASK`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from replicator.configuration.secrets import has_reference

SECRET_MASK = "********"

# Client settings whose values are safe to repeat in free text (see `redact_settings`).
PUBLIC_SETTINGS = frozenset({"bootstrap.servers", "group.id", "client.id", "security.protocol", "sasl.mechanism"})
# Where a URL's `user:password@` can stand: a run of characters without whitespace, `/` or `,`.
_URL_TOKEN = re.compile(r"[^\s/,]+")
_SECRET_PARTS = ("password", "secret", "jaas.config", ".pem", "token", "credentials")
# Shorter values are masked in free text only where quoted: elsewhere they would garble messages.
_MIN_REDACTED_LENGTH = 4


def is_secret_property(name: str) -> bool:
    """Whether a property's (or client setting's) value must never be shown.

    Decided by name alone so that any layer can mask a config without parsing it: names containing `password`,
    `secret`, `jaas.config`, `.pem`, `token` or `credentials`, or ending in `.key` (case-insensitive). This
    over-masks a few harmless settings (e.g. `sasl.oauthbearer.token.endpoint.url`) rather than risk a leak.
    """
    lowered = name.lower()
    return any(part in lowered for part in _SECRET_PARTS) or lowered.endswith(".key")


def mask_url_credentials(value: object) -> object:
    """A string with the password of any `user:password@host` in it (a URL's credentials, or a bootstrap server
    written `u:p@host:9092`) masked. Linear in the length of the value (values of any size are shown masked)."""
    if not isinstance(value, str) or "@" not in value:
        return value
    return _URL_TOKEN.sub(_mask_token_credentials, value)


def _mask_token_credentials(match: re.Match[str]) -> str:
    *before_at, rest = match.group().split("@")
    masked = []
    for part in before_at:  # each is followed by `@`: `user:password` there is a credential
        user, colon, password = part.partition(":")
        masked.append(f"{user}:{SECRET_MASK}" if user and colon and password else part)
    return "@".join([*masked, rest])


def mask_properties(props: Mapping[str, object]) -> dict[str, object]:
    """`props` with every literal secret value replaced by `SECRET_MASK`: safe to return from an API or log.

    A secret value that contains a `${provider:...}` reference is shown as written: the secret is wherever the
    reference points. Any text around the reference is shown too (e.g. a JAAS config's login module and user
    name), so a secret must be entirely inside the referenced value. Only for submitted properties: resolved
    values (client settings) must be masked with `mask_settings`.
    """
    return {
        name: SECRET_MASK if is_secret_property(str(name)) and not has_reference(value) else mask_url_credentials(value)
        for name, value in props.items()
    }


def mask_settings(settings: Mapping[str, str], also: Iterable[str] = ()) -> dict[str, str]:
    """Resolved client settings with secrets, and the settings named in `also`, masked (by name only)."""
    hidden = set(also)
    return {
        key: SECRET_MASK if is_secret_property(key) or key in hidden else str(mask_url_credentials(value))
        for key, value in settings.items()
    }


def literal_secrets(props: Mapping[str, object]) -> list[str]:
    """Names of the secret properties whose value is given in clear, in `props` order.

    That is every secret property with a non-empty value containing no `${provider:...}` reference (values that
    are not even strings count as literals). A layer that stores configs where they are shown (e.g. Dagster's run
    history) uses this to insist on references.
    """
    return [
        str(name)
        for name, value in props.items()
        if is_secret_property(str(name)) and value is not None and value != "" and not has_reference(value)
    ]


def redact(text: str, values: Iterable[object]) -> str:
    """`text` with each of `values` that occurs in it (as is, or escaped as `repr()` quotes it) masked.

    For free text that may echo a secret, e.g. a librdkafka error message quoting the value it rejected.
    """
    forms: set[str] = set()
    quoted: set[str] = set()
    for value in map(str, values):
        if len(value) >= _MIN_REDACTED_LENGTH:
            forms.update({value, repr(value)[1:-1]})
        elif value:
            quoted.add(value)  # a short value only where it is quoted: elsewhere it would garble the text
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, SECRET_MASK)
    for value in quoted:
        text = text.replace(f'"{value}"', f'"{SECRET_MASK}"').replace(f"'{value}'", f"'{SECRET_MASK}'")
    return text


def redact_settings(text: str, settings: Mapping[str, object]) -> str:
    """`text` (e.g. a client's error message) with the value of every setting in `settings` masked.

    Stricter than `is_secret_property`: settings typed on a command line may hold a secret under any name, so
    only the values of `PUBLIC_SETTINGS` may appear.
    """
    return redact(text, [value for key, value in settings.items() if key not in PUBLIC_SETTINGS and value != ""])
