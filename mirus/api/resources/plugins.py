"""`/connector-plugins`: the connector classes (and, with `connectorsOnly=false`, the transformation and converter a
config may name), their config definitions, and the validation of a config against them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse, Response

from mirus.api import config_definitions
from mirus.api.resources.calls import ApiError, Call, json_object
from mirus.api.resources.root import version
from mirus.api.resources.shapes import CONNECTOR_TYPE
from replicator.configuration.connector import ConnectorConfigError, validate_submission
from replicator.configuration.properties import MIRUS_CONNECTOR_CLASS, MM2_CONNECTOR_CLASS

PLUGINS = (MIRUS_CONNECTOR_CLASS, MM2_CONNECTOR_CLASS)
REGEX_ROUTER = "org.apache.kafka.connect.transforms.RegexRouter"
BYTE_ARRAY_CONVERTER = "org.apache.kafka.connect.converters.ByteArrayConverter"
# The other plug-ins a connector config may name (`connectorsOnly=false`), with their config definitions.
OTHER_PLUGINS: dict[str, tuple[str, list[dict[str, Any]]]] = {
    REGEX_ROUTER: ("transformation", config_definitions.regex_router_definitions()),
    BYTE_ARRAY_CONVERTER: ("converter", []),
}


@dataclass
class PluginsResource:
    def plugins(self, call: Call) -> Response:
        listed = [{"class": c, "type": CONNECTOR_TYPE, "version": version()} for c in PLUGINS]
        if not call.flag("connectorsOnly", default=True):
            listed += [{"class": c, "type": kind, "version": version()} for c, (kind, _) in OTHER_PLUGINS.items()]
        return JSONResponse(listed)

    def plugin_config(self, call: Call) -> Response:
        plugin = call.path["plugin"]
        if any(plugin_matches(c, plugin) for c in PLUGINS):
            return JSONResponse(config_definitions.definitions())
        other = next((keys for c, (_, keys) in OTHER_PLUGINS.items() if plugin_matches(c, plugin)), None)
        if other is None:
            raise ApiError(404, f"Unknown plugin {plugin}.")
        return JSONResponse(other)

    def validate(self, call: Call) -> Response:
        plugin = call.path["plugin"]
        cls = next((c for c in PLUGINS if plugin_matches(c, plugin)), None)
        if cls is None:
            raise ApiError(404, f"Failed to find any class that implements Connector and which name matches {plugin}")
        config = dict(json_object(call.body, "request body"))
        included = config.get("connector.class")
        if included is not None and not plugin_matches(str(included), plugin):
            raise ApiError(400, f"Included connector type {included} does not match request type {plugin}")
        submitted = {"connector.class": cls, **config}
        checked = submitted if submitted.get("name") else {**submitted, "name": "validation"}
        try:
            validate_submission(checked)
            errors: list[tuple[str, str]] = []
        except ConnectorConfigError as exc:
            errors = exc.errors
        return JSONResponse(config_definitions.validation(cls, submitted, errors))


def plugin_matches(cls: str, requested: str) -> bool:
    simple = cls.rsplit(".", 1)[-1]
    return requested in (cls, simple, simple.removesuffix("Connector"))
