"""The property table drives everything: the known names, checks, messages, hints and the docs page.

Adding a property is one declaration in `replicator.configuration.properties` (a field of `PropertyFields` or a row);
these tests walk the table, `PROPERTIES`, so that a property that is not reflected everywhere (or a docs page left
stale) fails.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from replicator.configuration.connector import ConnectorConfig, ConnectorConfigError, load, validate_submission
from replicator.configuration.masking import is_secret_property
from replicator.configuration.properties import (
    CLIENT_PREFIXES,
    KNOWN_PROPERTIES,
    PROPERTIES,
    Kind,
    PropertySpec,
)
from replicator.configuration.properties_page import properties_markdown

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "CONNECTOR-PROPERTIES.md"
BASE: dict[str, object] = {
    "name": "c",
    "consumer.bootstrap.servers": "src:9092",
    "destination.consumer.bootstrap.servers": "dst:9092",
    "topics.whitelist": "t",
}
FIELDS = [spec for spec in PROPERTIES if spec.field]


def test_docs_page_is_generated_from_the_table_and_current() -> None:
    regenerated = subprocess.run(
        [sys.executable, "-m", "replicator.configuration.properties_page"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    assert regenerated == properties_markdown()
    assert DOCS.read_text() == regenerated, (
        "stale: python -m replicator.configuration.properties_page > docs/CONNECTOR-PROPERTIES.md"
    )


@pytest.mark.parametrize("spec", PROPERTIES, ids=lambda s: s.name)
def test_every_row_is_documented_known_and_masked_by_the_one_rule(spec: PropertySpec) -> None:
    line = next(line for line in DOCS.read_text().splitlines() if line.startswith(f"| `{spec.name}`"))
    assert spec.doc in line and spec.kind.value in line
    assert set(spec.names) <= KNOWN_PROPERTIES
    assert line.split(" | ")[-2] == ("yes" if is_secret_property(spec.name) else "no")
    assert spec.field or spec.part or spec.client or spec.choices, "a row nothing reads"


@pytest.mark.parametrize("spec", FIELDS, ids=lambda s: s.name)
def test_every_field_row_is_a_model_field_with_its_default_and_bounds(spec: PropertySpec) -> None:
    name = spec.field
    assert name is not None  # FIELDS holds the rows with a field
    field = ConnectorConfig.model_fields[name]
    assert field.description == spec.doc
    if not spec.required:
        assert field.default == spec.default
        config = validate_submission({**BASE, "name": "c"} if spec.name != "name" else BASE)
        assert getattr(config, name) == (spec.default if spec.name != "name" else "c")
    if spec.kind is Kind.INT:
        low = spec.minimum if spec.minimum is not None else 0
        assert isinstance(spec.default, int)
        valid = spec.default + 1
        assert getattr(validate_submission({**BASE, spec.name: str(valid)}), name) == valid
        with pytest.raises(ConnectorConfigError) as caught:
            validate_submission({**BASE, spec.name: low - 1})
        assert caught.value.errors == [(spec.name, f"must be an integer {spec.bounds()}, got {low - 1}")]
    if spec.kind is Kind.BOOLEAN:
        assert getattr(validate_submission({**BASE, spec.name: "false"}), name) is False


def _typo(name: str) -> str:
    return name[:-1] + ("x" if name[-1] != "x" else "y")


# A typo after a client prefix is a client setting, judged by librdkafka (see test_config).
TYPOS = [s for s in PROPERTIES if not _typo(s.name).startswith(tuple(p.prefix for p in CLIENT_PREFIXES))]


@pytest.mark.parametrize("spec", TYPOS, ids=lambda s: s.name)
def test_a_typo_of_every_property_suggests_it(spec: PropertySpec) -> None:
    typo = _typo(spec.name)
    with pytest.raises(ConnectorConfigError) as caught:
        validate_submission({**BASE, typo: "1"})
    assert (typo, f"unknown property; did you mean {spec.name!r}?") in caught.value.errors


def test_submission_refuses_literal_secrets_with_every_other_problem() -> None:
    with pytest.raises(ConnectorConfigError) as caught:
        validate_submission({**BASE, "consumer.sasl.password": "hunter2", "tasks.max": 0})
    names = [name for name, _ in caught.value.errors]
    assert names == ["consumer.sasl.password", "tasks.max"]
    assert "reference" in caught.value.errors[0][1] and "hunter2" not in str(caught.value)


def test_load_builds_the_model_without_judging_client_settings_again() -> None:
    # A stored config was judged when submitted; loading it creates no throw-away client (librdkafka would reject
    # this setting) and gives the same model.
    stored = {**BASE, "consumer.fetch.bogus": "1"}
    with pytest.raises(ConnectorConfigError):
        validate_submission(stored)
    assert load(stored).source_client == {"bootstrap.servers": "src:9092", "fetch.bogus": "1"}
    assert load(BASE) == validate_submission(BASE)
