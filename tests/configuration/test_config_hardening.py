"""Configs that used to be accepted although invalid are refused, with the property named and nothing stored.

Each case from the issue has its own test through the `put_connector` job (the launchpad); then hundreds of
generated invalid configs (`tests/fixtures/invalid_configs.py`) go through the entry points: `validate_submission`
and the `put_connector` job, the REST API (create and update) and `mirus connectors put`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import pytest
import requests
from click.testing import CliRunner
from sqlalchemy import Engine

from mirus.api.auth import ApiSettings
from mirus.cli.main import main
from mirus_dagster.constants import PUT_CONNECTOR_JOB, STORE_CONNECTOR_OP
from mirus_dagster.definitions import admin_jobs
from mirus_dagster.jobs import PutConnectorConfig
from mirus_dagster.settings import StackEndpoints
from replicator.configuration.connector import ConnectorConfigError, validate_submission
from replicator.configuration.masking import mask_properties
from replicator.state.store import Store
from tests.fixtures.api_helpers import serve_api
from tests.fixtures.engine_helpers import connector_properties, step_failure_message
from tests.fixtures.invalid_configs import SECRET_IN_URL, InvalidCase, invalid_cases

JOBS = {job.name: job for job in admin_jobs}


def base(stack: StackEndpoints, name: str) -> dict[str, object]:
    return connector_properties(stack, name, **{"topics.whitelist": "orders", "destination.topic.name.suffix": ".c"})


def refused_by_the_launchpad(
    instance: dg.DagsterInstance, resources: dict, db_engine: Engine, properties: dict, stored: dict | None
) -> str:
    """Submit through `put_connector`; assert it failed and the store still holds `stored`; return the message."""
    name = str(properties.get("name"))
    result = JOBS["put_connector"].execute_in_process(
        run_config={"ops": {"store_connector": {"config": {"properties": properties}}}},
        instance=instance,
        resources=resources,
        raise_on_error=False,
    )
    assert not result.success
    failure = step_failure_message(result)
    store = Store(db_engine)
    if stored is None:
        assert name not in [c.name for c in store.list_connectors()]
    else:
        assert store.get_connector(name).properties == stored
    return failure


@pytest.fixture
def existing(
    instance: dg.DagsterInstance, resources: dict, stack: StackEndpoints, db_engine: Engine, unique: str
) -> dict:
    """A stored connector: every refused update below must leave it exactly as it is."""
    good = base(stack, unique)
    assert (
        JOBS["put_connector"]
        .execute_in_process(
            run_config={"ops": {"store_connector": {"config": {"properties": good}}}},
            instance=instance,
            resources=resources,
        )
        .success
    )
    return good


Refuse = Callable[..., str]


@pytest.fixture
def refuse(instance: dg.DagsterInstance, resources: dict, db_engine: Engine, existing: dict) -> Refuse:
    """`refuse(**changes)`: submit the stored connector with `changes` (`__` stands for `.`); it must be refused
    and the store left as it was (with `stored=None`: the connector must not exist). Returns the message."""

    def submit(stored: dict | None = existing, drop: tuple[str, ...] = (), **changes: object) -> str:
        props = {**existing, **{k.replace("__", "."): v for k, v in changes.items()}}
        for name in drop:
            props.pop(name)
        return refused_by_the_launchpad(instance, resources, db_engine, props, stored)

    return submit


def test_an_unparseable_bootstrap_server_is_refused(refuse: Refuse) -> None:
    message = refuse(consumer__bootstrap__servers="not a host::")
    assert "consumer.bootstrap.servers" in message and "host:port" in message


def test_credentials_in_a_bootstrap_server_are_refused_and_never_shown(refuse: Refuse) -> None:
    value = f"u:{SECRET_IN_URL}@127.0.0.1:9092"
    message = refuse(consumer__bootstrap__servers=value)
    assert "consumer.bootstrap.servers" in message and SECRET_IN_URL not in message
    # Wherever such a value is shown (a config stored before this check existed, an API answer), it is masked.
    shown = mask_properties({"consumer.bootstrap.servers": value, "x.url": f"https://u:{SECRET_IN_URL}@h/p"})
    assert SECRET_IN_URL not in json.dumps(shown) and "127.0.0.1:9092" in shown["consumer.bootstrap.servers"]


def test_an_unknown_offset_reset_is_refused(refuse: Refuse) -> None:
    message = refuse(consumer__auto__offset__reset="sideways")
    assert "consumer.auto.offset.reset" in message and "earliest" in message


def test_a_name_that_is_not_a_string_is_refused(refuse: Refuse) -> None:
    message = refuse(name=123, stored=None)
    assert "name" in message and "string" in message


def test_a_huge_regex_is_refused(refuse: Refuse) -> None:
    message = refuse(topics__regex="x" * 100_000, drop=("topics.whitelist",))
    assert "topics.regex" in message and len(message) < 2_000


def test_a_suffix_that_makes_names_longer_than_kafka_allows_is_refused(refuse: Refuse) -> None:
    message = refuse(destination__topic__name__suffix="x" * 100_000)
    assert "destination.topic.name.suffix" in message and "at most 10,000 characters" in message
    assert len(message) < 2_000
    message = refuse(destination__topic__name__suffix="x" * 300)
    assert "destination.topic.name.suffix" in message and "249" in message
    # Checked against the policy's output: a whitelisted name that the suffix pushes past the limit.
    message = refuse(topics__whitelist="t" * 240, destination__topic__name__suffix=".mirror-copy")
    assert "destination.topic.name.suffix" in message and "249" in message


def test_references_in_visible_properties_are_refused(refuse: Refuse) -> None:
    for prop, reference in (
        ("consumer.client.id", "${file:/etc/shadow:root}"),
        ("destination.topic.name.suffix", "${env:HOME}"),
        ("destination.topic.name.suffix", "${env:MIRUS_SECRET_X}"),
    ):
        message = refuse(**{prop: reference})
        refusals = ("only accepted in secret properties", "not inside a directory allowed", "not an allowed variable")
        assert prop in message and any(r in message for r in refusals), message
        assert "no key" not in message and "cannot read" not in message


def test_a_file_outside_the_allowed_paths_is_refused_without_a_hint(refuse: Refuse) -> None:
    answers = [refuse(consumer__sasl__password=f"${{file:{path}:x}}") for path in ("/etc/shadow", "/etc/no-such-file")]
    assert all("consumer.sasl.password" in a and "no key" not in a and "cannot read" not in a for a in answers)
    assert answers[0].replace("/etc/shadow", "P") == answers[1].replace("/etc/no-such-file", "P")


def test_an_empty_tasks_max_is_refused_by_the_platform_not_by_a_framework_error(refuse: Refuse) -> None:
    message = refuse(tasks__max=None)
    assert "tasks.max" in message and "CheckError" not in message


# -- hundreds of invalid configs through every entry point ---------------------------------------------------


def cases(stack: StackEndpoints, name: str) -> list[InvalidCase]:
    found = list(invalid_cases(base(stack, name)))
    assert len(found) >= 200
    return found


def check_refusal(case: InvalidCase, message: str) -> None:
    assert case.names in message, f"{case.label}: the refusal does not name {case.names}: {message[:500]}"
    for secret in (SECRET_IN_URL, "typed-in-clear", "root:"):
        assert secret not in message, f"{case.label}: the refusal shows {secret!r}"


def test_every_generated_invalid_config_is_refused_by_the_engine(stack: StackEndpoints, unique: str) -> None:
    for case in cases(stack, unique):
        with pytest.raises(ConnectorConfigError) as refused:
            validate_submission(case.properties)
        check_refusal(case, str(refused.value))


def test_every_generated_invalid_config_is_refused_by_the_launchpad_and_stores_nothing(
    instance: dg.DagsterInstance, resources: dict, stack: StackEndpoints, db_engine: Engine, unique: str
) -> None:
    # The launchpad's two steps without a run per case (the cases above run whole jobs): Dagster's own config
    # check must let the config through (no framework error), then the op must refuse it and store nothing.
    job = JOBS[PUT_CONNECTOR_JOB]
    store_connector = job.get_node_named(STORE_CONNECTOR_OP).definition
    store = Store(db_engine)
    with dg.build_op_context(resources=resources, instance=instance) as context:
        for case in cases(stack, unique):
            run_config = {"ops": {STORE_CONNECTOR_OP: {"config": {"properties": case.properties}}}}
            assert dg.validate_run_config(job, run_config), case.label
            with pytest.raises(dg.Failure) as refused:
                store_connector(context, config=PutConnectorConfig(properties=case.properties))
            check_refusal(case, str(refused.value.description))
            assert unique not in [c.name for c in store.list_connectors()], case.label


def test_every_generated_invalid_config_is_refused_by_the_rest_api_and_stores_nothing(
    stack: StackEndpoints, db_engine: Engine, existing: dict, unique: str
) -> None:
    store = Store(db_engine)
    before = store.get_connector(unique)
    created = f"{unique}-new"
    with serve_api(store, ApiSettings()) as api, requests.Session() as http:
        for case in cases(stack, unique):
            # An update of the stored connector (PUT) and the creation of a new one (POST): both are refused.
            answer = http.put(f"{api}/connectors/{unique}/config", json=case.properties, timeout=30)
            assert answer.status_code == 400, f"{case.label}: {answer.status_code} {answer.text[:300]}"
            check_refusal(case, answer.json()["message"])
            config = {**case.properties, "name": created} if case.names != "name" else case.properties
            answer = http.post(f"{api}/connectors", json={"name": created, "config": config}, timeout=30)
            assert answer.status_code == 400, f"{case.label}: {answer.status_code} {answer.text[:300]}"
            check_refusal(case, answer.json()["message"])
    after = store.get_connector(unique)
    assert (after.version, after.properties) == (before.version, before.properties)
    assert store.connector_head(created) is None


def test_every_generated_invalid_config_is_refused_by_the_cli_and_stores_nothing(
    stack: StackEndpoints, db_engine: Engine, existing: dict, unique: str, tmp_path: Path
) -> None:
    store = Store(db_engine)
    before = store.get_connector(unique)
    runner = CliRunner()
    env = {**stack.as_env(), "MIRUS_STATE_DIR": str(tmp_path / "state")}
    for case in cases(stack, unique):
        result = runner.invoke(main, ["connectors", "put"], input=json.dumps(case.properties), env=env)
        assert result.exit_code == 1, f"{case.label}: exit {result.exit_code}: {result.output[-300:]}"
        assert "nothing was stored" in result.output, f"{case.label}: {result.output[-300:]}"
        check_refusal(case, result.output)
    after = store.get_connector(unique)
    assert (after.version, after.properties) == (before.version, before.properties)
