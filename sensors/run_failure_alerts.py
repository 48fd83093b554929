"""The run-failure sensor: a failed replicator or admin run is recorded on the `connectors` asset and posted to a
webhook, if one is configured.

The `connectors` asset lists a connector's failed runs of the last hour among its problems (it reads them itself,
`assets/connectors.py`); this sensor records the asset at once with the failure as its description,
so the failure shows there within a sensor tick, not at the run starter's next refresh. Only failures are reported:
runs that end because their connector was deleted, paused or their run terminated end SUCCESS or CANCELED.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

import dagster as dg

from mirus_dagster.constants import FAILURE_SENSOR, TAG_CONNECTOR, TAG_KIND, TAG_TASK
from mirus_dagster.dagster_resources import FailureWebhook, PlatformDatabase
from replicator.state.store import Store

MAX_ERROR_CHARS = 500  # of the failure's message, in the asset's description and the webhook's body

ConnectorsEvent = Callable[[Store, str, dg.DagsterInstance], dg.AssetMaterialization]


def failure_summary(run: dg.DagsterRun, error: str) -> dict[str, Any]:
    """What a failure alert says: the run, its job, kind, connector and task, and the error's first lines."""
    connector, task = run.tags.get(TAG_CONNECTOR), run.tags.get(TAG_TASK)
    error = error if len(error) <= MAX_ERROR_CHARS else f"{error[:MAX_ERROR_CHARS]}…"
    subject = f"{connector}-{task}" if connector and task else connector or run.job_name
    return {
        "text": f"mirus: {run.job_name} run {run.run_id[:8]} ({subject}) failed: {error}",
        "run_id": run.run_id,
        "job": run.job_name,
        "kind": run.tags.get(TAG_KIND),
        "connector": connector,
        "task": int(task) if task and task.isdigit() else None,
        "error": error,
    }


def post_webhook(webhook: FailureWebhook, body: dict[str, Any]) -> str | None:
    """Post `body` as JSON; None if delivered, else why not (the URL is never part of it: it may hold a token)."""
    if not webhook.url:
        return None
    request = urllib.request.Request(
        webhook.url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=webhook.timeout_s) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        return f"the webhook answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return f"the webhook could not be reached ({type(reason).__name__})"
    return None


def _error_of(context: dg.RunFailureSensorContext) -> str:
    steps = context.get_step_failure_events()
    if steps and steps[0].step_failure_data.error:
        return steps[0].step_failure_data.error.message.strip()
    return (context.failure_event.message or "").strip()


def build_run_failure_alerts(
    jobs: Sequence[dg.JobDefinition], connectors_event: ConnectorsEvent
) -> dg.SensorDefinition:
    """The sensor watching `jobs` (the replicator and the admin jobs) for failed runs."""

    @dg.run_failure_sensor(
        name=FAILURE_SENSOR,
        monitored_jobs=list(jobs),
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Record each failed replicator or admin run on the connectors asset and post it to the "
        "webhook MIRUS_ALERT_WEBHOOK_URL names (if set).",
    )
    def run_failure_alerts(
        context: dg.RunFailureSensorContext, platform: PlatformDatabase, failure_webhook: FailureWebhook
    ) -> None:
        summary = failure_summary(context.dagster_run, _error_of(context))
        context.instance.report_runless_asset_event(
            connectors_event(platform.store(), summary["text"], context.instance)
        )
        if problem := post_webhook(failure_webhook, summary):
            context.log.warning(f"failure of run {context.dagster_run.run_id} not posted: {problem}")

    return run_failure_alerts
