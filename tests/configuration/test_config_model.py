"""Each property is declared once: as a field of `PropertyFields` (typed, so that type checkers and editors see it),
or as a row without a field. These tests hold the table to that: its field rows are exactly the declared fields, in
their order, each named after its property mechanically; no property name is declared twice; and `ConnectorConfig`
adds only the fields that several properties build together.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest

from replicator.configuration.connector import ConnectorConfig
from replicator.configuration.properties import PROPERTIES, SPECS, Kind, PropertyFields, PropertySpec

# Fields read from several properties at once (client settings, topic selection, naming) or kept as submitted.
BUILT_FIELDS = {
    "source_client",
    "destination_client",
    "producer_client",
    "selector",
    "namer",
    "auto_offset_reset",
    "raw",
}
FIELD_ROWS = [spec for spec in PROPERTIES if spec.field]
_KIND_TYPES: dict[Kind, type] = {Kind.INT: int, Kind.BOOLEAN: bool, Kind.STRING: str, Kind.LIST: str, Kind.CLASS: str}


def _expected_type(spec: PropertySpec) -> Any:
    python_type = _KIND_TYPES[spec.kind]
    return python_type | None if spec.default is None and not spec.required else python_type


def test_the_model_adds_only_the_built_fields_to_the_declared_ones() -> None:
    # A property declared on `ConnectorConfig` itself would be no row of the table: unknown to the reader and docs.
    assert set(ConnectorConfig.model_fields) - set(PropertyFields.model_fields) == BUILT_FIELDS


def test_the_field_rows_are_the_declared_fields_in_their_order() -> None:
    # The model validates fields in declaration order, and a validator reads earlier ones (the lease timeout reads
    # the heartbeat interval): the table checks and lists its field rows in that order too.
    assert [spec.field for spec in FIELD_ROWS] == list(PropertyFields.model_fields)


@pytest.mark.parametrize("spec", FIELD_ROWS, ids=lambda s: s.name)
def test_a_field_is_named_after_its_property(spec: PropertySpec) -> None:
    assert spec.field == re.sub(r"[.-]", "_", spec.name)
    assert SPECS[spec.name] is spec


def test_no_property_is_declared_twice() -> None:
    names = Counter(name for spec in PROPERTIES for name in spec.names)
    assert [name for name, count in names.items() if count > 1] == []


@pytest.mark.parametrize("spec", FIELD_ROWS, ids=lambda s: s.name)
def test_a_field_rows_kind_is_its_fields_type(spec: PropertySpec) -> None:
    assert spec.field is not None
    field = PropertyFields.model_fields[spec.field]
    assert field.annotation == _expected_type(spec), f"{spec.name}: declared as {field.annotation}, kind {spec.kind}"
    assert field.description == spec.doc and field.is_required() == spec.required
