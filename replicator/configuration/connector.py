"""One validated connector model that accepts Mirus and MirrorMaker 2 properties as users write them.

Users paste the flat JSON they would `PUT` to Kafka Connect for Mirus (`consumer.*`, `topics.whitelist`, …) or
configure MM2 with (`source.cluster.alias`, `topics`, `replication.policy.class`, …). Every property is declared
once in `replicator.configuration.properties`; it is either understood, deliberately ignored, or rejected, and every
problem is reported at once, each as `<property>: <reason>`, so that a config can be fixed in one round trip.

Two ways in:

- `validate_submission(props)` where a config enters the platform (the `put_connector` job, the CLI, the API):
  unknown names with "did you mean" hints, literal secrets refused, and client settings judged by librdkafka
  itself (throw-away clients that never connect), so a bad setting fails when submitted, not when a task starts.
- `load(props)` for a stored config (monitor, supervisor, tasks): references resolved, model built; no client
  is created and nothing is re-judged.

Values may contain Kafka Connect config provider references (`${env:NAME}`, `${file:/path.properties:key}`,
see `replicator.configuration.secrets`), resolved in every process that builds the model. The typed fields and client
dicts hold resolved values; `raw` holds the properties exactly as submitted and is what gets stored. Secrets (see
`replicator.configuration.masking`) and values that came from references never appear in `repr()` or in error messages.

The model is `replicator.configuration.model`, the parser that fills it `replicator.configuration.parser`; both are
used through this module.
"""

from __future__ import annotations

from collections.abc import Mapping

from replicator.configuration.masking import literal_secrets
from replicator.configuration.model import (
    CONNECTION_SETTINGS,
    ConnectorConfig,
    ConnectorConfigError,
    connection_settings,
    transactional_id,
)
from replicator.configuration.parser import ConnectorParser
from replicator.configuration.properties import split_list

# The model and its helpers are imported from here by the engine, discovery and the surfaces: this is the way in.
__all__ = [
    "CONNECTION_SETTINGS",
    "LITERAL_SECRET_REASON",
    "ConnectorConfig",
    "ConnectorConfigError",
    "connection_settings",
    "load",
    "split_list",
    "transactional_id",
    "validate_submission",
]

LITERAL_SECRET_REASON = (
    "give secrets as a reference (${env:NAME} or ${file:/path/file.properties:key}) so that they never enter "
    "Dagster's run history; then rotate the value typed here"
)


def validate_submission(props: Mapping[str, object], *, allow_literal_secrets: bool = False) -> ConnectorConfig:
    """The checks of a config entering the platform; raises `ConnectorConfigError` listing every problem.

    Literal secrets are refused unless `allow_literal_secrets` (callers that never store or show the config).
    """
    literal = [] if allow_literal_secrets or not isinstance(props, Mapping) else literal_secrets(props)
    refused = [(name, LITERAL_SECRET_REASON) for name in literal]
    try:
        config = ConnectorParser(props, submission=True).parse()
    except ConnectorConfigError as exc:
        raise ConnectorConfigError(refused + exc.errors) from None
    if refused:
        raise ConnectorConfigError(refused)
    return config


def load(props: Mapping[str, object], *, resolve_references: bool = True) -> ConnectorConfig:
    """The model of a stored (already submitted) config: references resolved, no client created.

    `resolve_references=False` leaves references as written, for views that never build a client (the REST API's
    status, metrics): such a process needs no secret and may not have access to them.
    """
    return ConnectorParser(props, submission=False, resolve_references=resolve_references).parse()
