"""`ConnectorConfig` is declared field by field (so that type checkers and editors see its fields); these tests hold
the declarations to the property table, so that the two cannot drift.

Every table row with a `field` is a declared field of the type its kind gives, with the row's default (or required),
bounds and description, in the table's order; every declared field is either such a row's or one of the fields that
several properties build together.
"""

from __future__ import annotations

from typing import Any

import annotated_types
import pytest
from pydantic.fields import FieldInfo

from replicator.configuration.connector import ConnectorConfig
from replicator.configuration.properties import FIELD_PROPERTIES, PROPERTIES, Kind, PropertySpec

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


def _bound(field: FieldInfo, kind: type[annotated_types.Ge] | type[annotated_types.Le]) -> object:
    bounds = [m for m in field.metadata if isinstance(m, kind)]
    assert len(bounds) <= 1
    if not bounds:
        return None
    return bounds[0].ge if isinstance(bounds[0], annotated_types.Ge) else bounds[0].le


def test_the_built_fields_are_declared() -> None:
    assert set(ConnectorConfig.model_fields) >= BUILT_FIELDS


def test_every_declared_field_is_a_table_row_or_a_built_field() -> None:
    declared = set(ConnectorConfig.model_fields) - BUILT_FIELDS
    assert declared == set(FIELD_PROPERTIES), (
        f"declared without a table row: {sorted(declared - set(FIELD_PROPERTIES))}; "
        f"table rows without a declared field: {sorted(set(FIELD_PROPERTIES) - declared)}"
    )


def test_the_fields_are_declared_in_the_tables_order() -> None:
    # The model validates fields in declaration order, and a validator reads earlier ones (the lease timeout reads
    # the heartbeat interval): the table's order is the one its rows are checked and listed in.
    declared = [name for name in ConnectorConfig.model_fields if name not in BUILT_FIELDS]
    assert declared == [spec.field for spec in FIELD_ROWS]


@pytest.mark.parametrize("spec", FIELD_ROWS, ids=lambda s: s.name)
def test_every_field_row_is_declared_with_its_type_default_bounds_and_description(spec: PropertySpec) -> None:
    assert spec.field is not None
    field = ConnectorConfig.model_fields.get(spec.field)
    assert field is not None, f"{spec.name}: no declared field {spec.field!r}"
    assert field.annotation == _expected_type(spec), f"{spec.name}: declared as {field.annotation}"
    if spec.required:
        assert field.is_required(), f"{spec.name}: required in the table, has a default in the model"
    else:
        assert not field.is_required(), f"{spec.name}: has a default in the table, required in the model"
        assert field.default == spec.default and type(field.default) is type(spec.default), spec.name
    assert _bound(field, annotated_types.Ge) == spec.minimum, spec.name
    assert _bound(field, annotated_types.Le) == spec.maximum, spec.name
    assert field.description == spec.doc, spec.name
