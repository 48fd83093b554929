"""Dagster keeps every run's config in its run history, readable by anyone with UI access; a rejected literal
secret must not stay there.

Dagster validates launchpad config only against types, so a `put_connector` run holding a password typed in clear
is created before the platform can refuse it. The op then replaces those values in the run's stored config with
the mask. This writes Dagster's SQL run storage directly (as Dagster's own `replace_job_origin` does); later
status updates re-read the run from storage, so the masked config is what stays.

Dagster 1.13 has no public API for this: `DagsterInstance`'s public methods read runs and delete them, and deleting
the run would end the very run that is refusing the secret. So this module is the one place outside
`replicator/state/` that runs SQL, and one of the few that import Dagster's private modules (`dagster._core`):
tests/test_layers.py names it in both rules, with this reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import dagster as dg
from dagster._core.storage.runs.schema import RunsTable
from dagster._core.storage.runs.sql_run_storage import SqlRunStorage

from replicator.configuration.masking import SECRET_MASK


class RunHistoryNotScrubbedError(RuntimeError):
    """The instance's run storage cannot be rewritten; the message tells the operator what to delete."""


def mask_run_config_values(config: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """`config` with the value of every dict entry keyed by one of `names`, at any depth, replaced by the mask."""
    wanted = set(names)

    def walk(node: Any) -> Any:
        if isinstance(node, Mapping):
            return {k: SECRET_MASK if k in wanted else walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(item) for item in node]
        return node

    return walk(config)


def scrub_run_config(instance: dg.DagsterInstance, run_id: str, names: Iterable[str]) -> None:
    """Mask the values of the properties `names` in the stored config of run `run_id`."""
    storage = instance.run_storage
    run = instance.get_run_by_id(run_id)
    if run is None:
        return
    if not isinstance(storage, SqlRunStorage):
        raise RunHistoryNotScrubbedError(
            f"run {run_id} keeps the secret typed in its config ({type(storage).__name__} cannot be rewritten): "
            "delete that run from the run history"
        )
    masked = run._replace(run_config=mask_run_config_values(run.run_config, names))
    with storage.connect() as conn:
        conn.execute(RunsTable.update().where(RunsTable.c.run_id == run_id).values(run_body=dg.serialize_value(masked)))
