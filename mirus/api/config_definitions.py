"""Kafka Connect's config definitions (`ConfigKeyInfo`) and validation answers (`ConfigInfos`), from the property
table (`replicator.configuration.properties`): types, defaults, importance, groups, documentation and closed
sets, so that a UI can render a connector form from them as it does for any Connect plug-in.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from replicator.configuration.masking import is_secret_property, mask_properties
from replicator.configuration.properties import (
    CLIENT_PREFIXES,
    GROUPS,
    HIGH_IMPORTANCE,
    IGNORED_PREFIXES,
    IGNORED_PROPERTIES,
    PROPERTIES,
    SPECS,
    Kind,
    PropertySpec,
)

CLIENTS_GROUP, IGNORED_GROUP, UNKNOWN_GROUP = "Clients", "Accepted and ignored", "Unknown"


def _text(value: object) -> str | None:
    """A value as Kafka Connect shows it: strings as they are, booleans lowercase, nothing as null."""
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    return value if isinstance(value, str) else json.dumps(value)


def _key(
    name: str,
    kind: str,
    group: str,
    order: int,
    documentation: str,
    *,
    default: str | None = None,
    required: bool = False,
    importance: str = "MEDIUM",
) -> dict[str, Any]:
    return {
        "name": name,
        "type": "PASSWORD" if is_secret_property(name) else kind,
        "required": required,
        "default_value": default,
        "importance": importance,
        "documentation": documentation,
        "group": group,
        "width": "NONE",
        "display_name": name,
        "dependents": [],
        "order": order,
    }


def _documentation(spec: PropertySpec) -> str:
    if spec.kind is Kind.INT:
        return f"{spec.doc} Values: {spec.bounds()}."
    return f"{spec.doc} Values: {spec.expected}." if spec.expected else spec.doc


def recommended_values(spec: PropertySpec | None) -> list[str]:
    """The closed set of a property's values, if it has one."""
    if spec is None:
        return []
    if spec.kind is Kind.BOOLEAN:
        return ["true", "false"]
    return sorted(spec.choices)


def definitions() -> list[dict[str, Any]]:
    """Every property of the table, in its order; `order` counts within the group, as in Kafka's ConfigDef."""
    counts: dict[str, int] = defaultdict(int)
    out = []
    for spec in PROPERTIES:
        group = GROUPS[spec.name]
        counts[group] += 1
        out.append(
            _key(
                spec.name,
                spec.kind.name,
                group,
                counts[group],
                _documentation(spec),
                default=_text(spec.default),
                required=spec.required,
                importance="HIGH" if spec.name in HIGH_IMPORTANCE else "MEDIUM",
            )
        )
    return out


def regex_router_definitions() -> list[dict[str, Any]]:
    """Kafka's RegexRouter, the one transform accepted (`transforms.<name>.regex` / `.replacement`)."""
    return [
        _key("regex", "STRING", "", 1, "Regular expression to use for matching.", required=True, importance="HIGH"),
        _key("replacement", "STRING", "", 2, "Replacement string.", required=True, importance="HIGH"),
    ]


def _other_definition(name: str) -> dict[str, Any]:
    """A submitted name that is no row of the table: a client setting, an ignored property or an unknown one."""
    prefix = next((p for p in CLIENT_PREFIXES if name.startswith(p.prefix)), None)
    if prefix is not None:
        setting = name.removeprefix(prefix.prefix)
        documentation = f"librdkafka setting `{setting}` of the {prefix.client.value}. {prefix.doc}"
        importance = "HIGH" if setting == "bootstrap.servers" else "MEDIUM"
        return _key(name, "STRING", CLIENTS_GROUP, 0, documentation, importance=importance)
    if name in IGNORED_PROPERTIES or name.startswith(IGNORED_PREFIXES):
        return _key(name, "STRING", IGNORED_GROUP, 0, "Accepted for compatibility; changes nothing.", importance="LOW")
    return _key(name, "STRING", UNKNOWN_GROUP, 0, "Not a property of this connector.", importance="LOW")


def validation(cls: str, submitted: Mapping[str, Any], errors: list[tuple[str, str]]) -> dict[str, Any]:
    """Kafka Connect's `ConfigInfos`: one entry per property of the table and per other name submitted, each with
    its value (submitted, else the default; secrets masked) and its errors; `error_count` counts the errors."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for name, reason in errors:
        by_name[name].append(reason)
    shown = {k: _text(v) for k, v in mask_properties(submitted).items()}
    configs = []
    for definition in definitions():
        name = definition["name"]
        spec = SPECS[name]
        given = next((shown[n] for n in spec.names if n in shown), None)
        reasons = [r for n in spec.names for r in by_name.get(n, [])]
        configs.append(_config(definition, given if given is not None else definition["default_value"], reasons, spec))
    others = [n for n in shown if n not in SPECS] + [n for n in by_name if n not in SPECS and n not in shown]
    counts: dict[str, int] = defaultdict(int)
    for name in others:
        definition = _other_definition(name)
        counts[definition["group"]] += 1
        definition["order"] = counts[definition["group"]]
        configs.append(_config(definition, shown.get(name), by_name.get(name, []), None))
    groups = list(dict.fromkeys(c["definition"]["group"] for c in configs))
    return {"name": cls, "error_count": len(errors), "groups": groups, "configs": configs}


def _config(definition: dict[str, Any], value: str | None, errors: list[str], spec: PropertySpec | None) -> dict:
    return {
        "definition": definition,
        "value": {
            "name": definition["name"],
            "value": value,
            "recommended_values": recommended_values(spec),
            "errors": errors,
            "visible": True,
        },
    }
