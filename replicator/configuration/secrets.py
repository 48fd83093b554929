"""Kafka Connect ConfigProvider-style references in connector property values, so secrets need not be stored.

A property value may contain references that are replaced when the config is parsed, in the process that parses
it (the one that submits a config, and every engine process that loads it), with the same syntax as Kafka
Connect's config providers:

- `${env:NAME}`: the environment variable `NAME` (Kafka's EnvVarConfigProvider).
- `${file:/path/to/file.properties:key}`: the value of `key` in a Java properties file (Kafka's
  FileConfigProvider): `key=value` or `key: value` per line, whitespace around the separator ignored, `#` and `!`
  comment lines, backslash escapes and line continuations as `java.util.Properties` reads them.
- `${file:/path/to/file}`: the whole file (UTF-8) without its trailing newline, e.g. a PEM key.

A value may hold several references and text around them, e.g.
`org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="${env:KAFKA_PW}";`.
Resolution is a single pass (a resolved value is not searched for references again). Text of the form `${...}`
without a colon (e.g. a RegexRouter replacement's `${group}`) is not a reference and is left alone.

Unlike Kafka Connect, which leaves a reference it cannot resolve in place, every failure raises
`SecretReferenceError`, whose message names the reference but never a resolved value or file content.

What a connector config may reference is an allowlist set where the platform runs, denying everything else
(whoever can submit a config must not be able to read the machine's environment or files through it); the
operator's own settings (e.g. the API's credentials) are resolved with `restricted=False`:

- `MIRUS_CONFIG_PROVIDER_ALLOWED_PATHS`: comma-separated directories whose files may be referenced (Kafka
  Connect's `allowed.paths` of FileConfigProvider); unset, no file may be. Paths are compared after resolving
  `..` and symbolic links, and a refused path is never looked at: the error says nothing about whether it exists.
- `MIRUS_CONFIG_PROVIDER_ALLOWED_ENV`: a regular expression that a variable name must match in full (Kafka
  Connect's EnvVarConfigProvider `allowlist.pattern`); unset, `MIRUS_SECRET_.*`.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

__all__ = [
    "MAX_FILE_BYTES",
    "SecretReferenceError",
    "has_reference",
    "parse_java_properties",
    "resolve_references",
    "substitute_references",
]

# Kafka's ConfigTransformer pattern: `${provider:[path:]key}`.
_REFERENCE = re.compile(r"\$\{([^}]*?):(?:([^}]*?):)?([^}]*?)\}")

ENV_ALLOWED_PATHS = "MIRUS_CONFIG_PROVIDER_ALLOWED_PATHS"
ENV_ALLOWED_ENV = "MIRUS_CONFIG_PROVIDER_ALLOWED_ENV"
DEFAULT_ALLOWED_ENV = r"MIRUS_SECRET_.*"

# A referenced file is read into memory: refuse anything bigger than any secret or PEM bundle would be.
MAX_FILE_BYTES = 1024 * 1024


class SecretReferenceError(ValueError):
    """A reference could not be resolved; the message names the reference, never a resolved value."""


def has_reference(value: object) -> bool:
    """Whether `value` is a string containing at least one `${provider:...}` reference."""
    return isinstance(value, str) and _REFERENCE.search(value) is not None


def resolve_references(value: str, *, restricted: bool = True) -> str:
    """`value` with every reference replaced by what it refers to; raises `SecretReferenceError`.

    When several references fail, the error lists all of them. `restricted`: only what the allowlist allows.
    """
    return substitute_references(value, restricted=restricted)[0]


def substitute_references(value: str, *, restricted: bool = True) -> tuple[str, list[str]]:
    """`value` resolved, and the values substituted for its references (so that callers can mask them)."""
    substituted: list[str] = []
    problems: list[str] = []
    files: dict[str, str] = {}

    def replace(match: re.Match[str]) -> str:
        try:
            resolved = _resolve_one(match, files, restricted)
        except SecretReferenceError as err:
            problems.append(str(err))
            return match.group(0)
        substituted.append(resolved)
        return resolved

    result = _REFERENCE.sub(replace, value)
    if problems:
        raise SecretReferenceError("; ".join(problems))
    return result, substituted


def _resolve_one(match: re.Match[str], files: dict[str, str], restricted: bool) -> str:
    reference = match.group(0)
    provider, path, key = match.group(1), match.group(2), match.group(3)
    if provider == "env":
        if path is not None:
            raise SecretReferenceError(f"cannot resolve {reference}: env references take one name, as in ${{env:NAME}}")
        if not key:
            raise SecretReferenceError(f"cannot resolve {reference}: the environment variable name is missing")
        if restricted and not _env_allowed(key):
            raise SecretReferenceError(
                f"cannot resolve {reference}: {key} is not an allowed variable ({ENV_ALLOWED_ENV} is "
                f"{os.environ.get(ENV_ALLOWED_ENV) or DEFAULT_ALLOWED_ENV!r})"
            )
        if key not in os.environ:
            raise SecretReferenceError(f"cannot resolve {reference}: environment variable {key} is not set")
        return os.environ[key]
    if provider == "file":
        if path is None:  # `${file:/path}`: the whole file
            if not key:
                raise SecretReferenceError(f"cannot resolve {reference}: the file path is missing")
            content = _read_file(key, reference, files, restricted)
            if content.endswith("\r\n"):
                return content[:-2]
            return content.removesuffix("\n")
        if not path:
            raise SecretReferenceError(f"cannot resolve {reference}: the file path is missing")
        content = _read_file(path, reference, files, restricted)
        try:
            entries = parse_java_properties(content)
        except ValueError as err:
            raise SecretReferenceError(
                f"cannot resolve {reference}: {path} is not a valid properties file: {err}"
            ) from None
        if key not in entries:
            raise SecretReferenceError(f"cannot resolve {reference}: {path} has no key {key!r}")
        return entries[key]
    raise SecretReferenceError(f"cannot resolve {reference}: unknown config provider {provider!r} (use env or file)")


def _env_allowed(name: str) -> bool:
    pattern = os.environ.get(ENV_ALLOWED_ENV) or DEFAULT_ALLOWED_ENV
    try:
        return re.fullmatch(pattern, name) is not None
    except re.error:
        return False  # a broken allowlist allows nothing


def allowed_directories() -> list[Path]:
    """The directories file references may point into (resolved), from `MIRUS_CONFIG_PROVIDER_ALLOWED_PATHS`."""
    configured = os.environ.get(ENV_ALLOWED_PATHS, "")
    return [Path(os.path.realpath(p.strip())) for p in configured.split(",") if p.strip()]


def _file_allowed(path: str) -> bool:
    if not os.path.isabs(path):
        return False  # relative to what? The working directory differs between the platform's processes.
    real = Path(os.path.realpath(path))
    return any(real == d or d in real.parents for d in allowed_directories())


def _read_file(path: str, reference: str, cache: dict[str, str], restricted: bool) -> str:
    if path in cache:
        return cache[path]
    if restricted and not _file_allowed(path):
        # Checked before the file is touched: the answer must not tell whether it exists or is readable.
        raise SecretReferenceError(
            f"cannot resolve {reference}: the path is not inside a directory allowed by {ENV_ALLOWED_PATHS}"
        )
    try:
        # Only regular files: a FIFO or device (`/dev/stdin`, `/dev/zero`) could block or never end.
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise SecretReferenceError(f"cannot resolve {reference}: {path} is not a regular file")
        with open(path, "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise SecretReferenceError(f"cannot resolve {reference}: cannot read {path}: {err.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise SecretReferenceError(f"cannot resolve {reference}: {path} is larger than {MAX_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretReferenceError(f"cannot resolve {reference}: {path} is not UTF-8 text") from None
    cache[path] = text
    return text


# --- Java properties files -----------------------------------------------------------------------------------

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_BLANK = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def parse_java_properties(text: str) -> dict[str, str]:
    """The entries of a properties file as `java.util.Properties.load` reads it; raises `ValueError`.

    Keys end at the first unescaped `=`, `:` or whitespace; whitespace around the separator is ignored (trailing
    whitespace of a value is kept, as in Java); lines starting with `#` or `!` are comments; a line ending in an
    odd number of backslashes continues on the next one; `\\t`, `\\n`, `\\r`, `\\f` and `\\uXXXX` are escapes,
    any other escaped character stands for itself. A later entry for a key replaces an earlier one.
    """
    lines = _LINE_BREAK.split(text)
    entries: dict[str, str] = {}
    index = 0
    while index < len(lines):
        line = lines[index].lstrip(_BLANK)
        index += 1
        if not line or line[0] in "#!":
            continue
        while _continues(line):
            line = line[:-1]
            if index < len(lines):
                line += lines[index].lstrip(_BLANK)
                index += 1
        key, value = _split_entry(line)
        entries[_unescape(key)] = _unescape(value)
    return entries


def _continues(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _split_entry(line: str) -> tuple[str, str]:
    position = 0
    while position < len(line):
        char = line[position]
        if char == "\\":
            position += 2
            continue
        if char in "=:" or char in _BLANK:
            break
        position += 1
    key = line[:position]
    rest = line[position:].lstrip(_BLANK)
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(_BLANK)
    return key, rest


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    position = 0
    while position < len(text):
        char = text[position]
        if char != "\\":
            out.append(char)
            position += 1
            continue
        escaped = text[position + 1 : position + 2]
        if escaped == "u":
            digits = text[position + 2 : position + 6]
            if len(digits) != 4 or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise ValueError("malformed \\uxxxx escape")
            out.append(chr(int(digits, 16)))
            position += 6
            continue
        out.append(_ESCAPES.get(escaped, escaped))
        position += 2
    return "".join(out)
