"""Kafka Connect config provider references (`${env:...}`, `${file:...}`) in property values."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from replicator.configuration.secrets import (
    ENV_ALLOWED_ENV,
    ENV_ALLOWED_PATHS,
    MAX_FILE_BYTES,
    SecretReferenceError,
    has_reference,
    parse_java_properties,
    resolve_references,
    substitute_references,
)

PEM = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg\n-----END PRIVATE KEY-----"


@pytest.fixture(autouse=True)
def files_allowed_in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator allows the test's directory, as a deployment allows its secrets directory."""
    monkeypatch.setenv(ENV_ALLOWED_PATHS, str(tmp_path))


def resolve_error(value: str) -> str:
    with pytest.raises(SecretReferenceError) as caught:
        resolve_references(value)
    assert isinstance(caught.value, ValueError)
    return str(caught.value)


# --- the allowlist ---------------------------------------------------------------------------------------------


def test_files_outside_the_allowed_paths_are_refused_without_a_hint(tmp_path: Path) -> None:
    inside = tmp_path / "allowed" / "s.properties"
    inside.parent.mkdir()
    inside.write_text("pw=hunter2\n")
    outside = tmp_path / "elsewhere.properties"
    outside.write_text("pw=hunter2\n")
    (inside.parent / "link.properties").symlink_to(outside)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV_ALLOWED_PATHS, f"/nonexistent, {inside.parent}")
        assert resolve_references(f"${{file:{inside}:pw}}") == "hunter2"
        existing, missing = resolve_error(f"${{file:{outside}:pw}}"), resolve_error(f"${{file:{tmp_path}/nope:pw}}")
        escapes = [
            resolve_error(f"${{file:{inside.parent}/../elsewhere.properties:pw}}"),
            resolve_error(f"${{file:{inside.parent}/link.properties:pw}}"),  # a symbolic link pointing out
            resolve_error("${file:relative/s.properties:pw}"),
            resolve_error("${file:/etc/shadow:root}"),
            resolve_error("${file:/etc/shadow:x}"),
        ]
    # Same answer whether the file exists or not: nothing is learnt about the machine's files.
    assert existing.replace(str(outside), "P") == missing.replace(f"{tmp_path}/nope", "P")
    for message in [existing, missing, *escapes]:
        assert f"not inside a directory allowed by {ENV_ALLOWED_PATHS}" in message, message
        assert "hunter2" not in message and "no key" not in message and "cannot read" not in message


def test_no_file_is_allowed_unless_configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = tmp_path / "s.properties"
    secrets.write_text("pw=hunter2\n")
    monkeypatch.delenv(ENV_ALLOWED_PATHS)
    assert "not inside a directory allowed" in resolve_error(f"${{file:{secrets}:pw}}")


def test_env_references_are_limited_to_the_allowed_pattern(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_ALLOWED_ENV, raising=False)  # the default: MIRUS_SECRET_.*
    monkeypatch.setenv("MIRUS_SECRET_PW", "hunter2")
    assert resolve_references("${env:MIRUS_SECRET_PW}") == "hunter2"
    for name in ("HOME", "PATH", "MIRUS_DATABASE_URL", "XMIRUS_SECRET_PW"):
        message = resolve_error(f"${{env:{name}}}")
        assert f"{name} is not an allowed variable" in message and os.environ.get("HOME", "@@") not in message
    monkeypatch.setenv(ENV_ALLOWED_ENV, "KAFKA_[A-Z_]+")
    monkeypatch.setenv("KAFKA_PW", "pw2")
    assert resolve_references("${env:KAFKA_PW}") == "pw2"
    assert "not an allowed variable" in resolve_error("${env:MIRUS_SECRET_PW}")
    monkeypatch.setenv(ENV_ALLOWED_ENV, "(")  # a broken pattern allows nothing
    assert "not an allowed variable" in resolve_error("${env:KAFKA_PW}")
    # The operator's own settings are not submitted by users: they may name any variable or file.
    assert resolve_references("${env:KAFKA_PW}", restricted=False) == "pw2"


# --- env -------------------------------------------------------------------------------------------------------


def test_env_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_PW", "hunter2-env")
    assert resolve_references("${env:KAFKA_PW}") == "hunter2-env"


def test_env_reference_to_an_empty_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMPTY_VAR", "")
    assert resolve_references("${env:EMPTY_VAR}") == ""


def test_several_references_with_surrounding_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_USER", "alice")
    monkeypatch.setenv("KAFKA_PW", "hunter2-env")
    value = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="${env:KAFKA_USER}" password="${env:KAFKA_PW}";'
    )
    assert resolve_references(value) == (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="hunter2-env";'
    )
    assert substitute_references(value)[1] == ["alice", "hunter2-env"]


def test_values_without_references_are_unchanged() -> None:
    for value in ("plain", "", "${t}.x", "$1-${group}", "${env:UNCLOSED", "100$ {env:X}"):
        assert resolve_references(value) == value
        assert not has_reference(value)


def test_resolution_is_a_single_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTER", "${env:INNER}")
    assert resolve_references("${env:OUTER}") == "${env:INNER}"


def test_missing_env_var_names_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MIRUS_TEST_MISSING", raising=False)
    message = resolve_error("x ${env:MIRUS_TEST_MISSING} y")
    assert message == "cannot resolve ${env:MIRUS_TEST_MISSING}: environment variable MIRUS_TEST_MISSING is not set"


def test_env_reference_with_a_path_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("B", "hunter2-env")
    message = resolve_error("${env:a:B}")
    assert "${env:a:B}" in message and "hunter2" not in message


def test_unknown_provider() -> None:
    message = resolve_error("${vault:secret/kafka:password}")
    assert message.startswith("cannot resolve ${vault:secret/kafka:password}: unknown config provider 'vault'")


def test_every_failing_reference_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_PW", "hunter2-env")
    monkeypatch.delenv("MIRUS_TEST_MISSING", raising=False)
    message = resolve_error("${env:MIRUS_TEST_MISSING}/${env:KAFKA_PW}/${nope:x}")
    assert "${env:MIRUS_TEST_MISSING}" in message and "${nope:x}" in message
    assert "hunter2" not in message


# --- file ------------------------------------------------------------------------------------------------------


def test_file_reference_with_key(tmp_path: Path) -> None:
    secrets = tmp_path / "kafka.properties"
    secrets.write_text(
        "# comment\n! another comment\n\nsasl.password = hunter2-file  \nssl.key.password: k3y\nuser\talice\n",
        encoding="utf-8",
    )
    assert resolve_references(f"${{file:{secrets}:ssl.key.password}}") == "k3y"
    assert resolve_references(f"${{file:{secrets}:user}}") == "alice"
    # Java keeps a value's trailing whitespace.
    assert resolve_references(f"${{file:{secrets}:sasl.password}}") == "hunter2-file  "


def test_file_reference_without_key_is_the_whole_file(tmp_path: Path) -> None:
    pem = tmp_path / "client.key"
    pem.write_text(PEM + "\n", encoding="utf-8")
    assert resolve_references(f"${{file:{pem}}}") == PEM
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(b"hunter2-crlf\r\n")
    assert resolve_references(f"${{file:{crlf}}}") == "hunter2-crlf"
    bare = tmp_path / "bare.txt"
    bare.write_text("no-newline", encoding="utf-8")
    assert resolve_references(f"${{file:{bare}}}") == "no-newline"


def test_file_and_env_references_mixed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_USER", "alice")
    secrets = tmp_path / "s.properties"
    secrets.write_text("pw=hunter2-file\n", encoding="utf-8")
    value = f'PlainLoginModule required username="${{env:KAFKA_USER}}" password="${{file:{secrets}:pw}}";'
    assert resolve_references(value) == 'PlainLoginModule required username="alice" password="hunter2-file";'


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.properties"
    message = resolve_error(f"${{file:{missing}:pw}}")
    assert message == f"cannot resolve ${{file:{missing}:pw}}: cannot read {missing}: No such file or directory"


def test_unreadable_file(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x", encoding="utf-8")
    message = resolve_error(f"${{file:{not_a_dir}/s.properties:pw}}")
    assert message == (
        f"cannot resolve ${{file:{not_a_dir}/s.properties:pw}}: cannot read {not_a_dir}/s.properties: Not a directory"
    )


def test_directories_and_devices_are_refused(tmp_path: Path) -> None:
    assert "is not a regular file" in resolve_error(f"${{file:{tmp_path}}}")
    fifo = tmp_path / "fifo"  # would block a reader forever
    os.mkfifo(fifo)
    assert "is not a regular file" in resolve_error(f"${{file:{fifo}}}")


def test_oversized_and_binary_files_are_refused(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * (MAX_FILE_BYTES + 1))
    assert "is larger than" in resolve_error(f"${{file:{big}}}")
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xffhunter2")
    message = resolve_error(f"${{file:{binary}}}")
    assert "is not UTF-8 text" in message and "hunter2" not in message


def test_missing_key_names_the_reference_not_the_content(tmp_path: Path) -> None:
    secrets = tmp_path / "s.properties"
    secrets.write_text("pw=hunter2-file\n", encoding="utf-8")
    message = resolve_error(f"${{file:{secrets}:password}}")
    assert message == f"cannot resolve ${{file:{secrets}:password}}: {secrets} has no key 'password'"


def test_malformed_properties_file(tmp_path: Path) -> None:
    secrets = tmp_path / "bad.properties"
    secrets.write_text("pw=hunter2\\u12\n", encoding="utf-8")
    message = resolve_error(f"${{file:{secrets}:pw}}")
    assert "is not a valid properties file" in message and "hunter2" not in message


# --- properties files ------------------------------------------------------------------------------------------


def test_java_properties_syntax() -> None:
    text = (
        "  # indented comment\n"
        "a=1\n"
        "b = 2\n"
        "c:3\n"
        "d : 4\n"
        "e 5\n"
        "f\n"
        "g = = x\n"
        "h = one \\\n"
        "    two\n"
        "# comment ending in a backslash \\\n"
        "i = tab\\there\\u0021\n"
        "key\\=with\\:seps = v\n"
        "a = last wins\r\n"
        "j = c:\\\\dir\n"
    )
    assert parse_java_properties(text) == {
        "a": "last wins",
        "b": "2",
        "c": "3",
        "d": "4",
        "e": "5",
        "f": "",
        "g": "= x",
        "h": "one two",
        "i": "tab\there!",
        "key=with:seps": "v",
        "j": "c:\\dir",
    }


def test_has_reference() -> None:
    assert has_reference("${env:X}")
    assert has_reference("${file:/a/b.properties:key}")
    assert has_reference("prefix ${file:/a/b} suffix")
    assert has_reference("${vault:anything}")  # syntactically a reference, even if it cannot be resolved
    assert not has_reference("${group}")
    assert not has_reference("hunter2")
    assert not has_reference(None)
    assert not has_reference(5)
    assert not has_reference(["${env:X}"])
