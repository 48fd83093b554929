"""The reference page of every connector property, docs/CONNECTOR-PROPERTIES.md, generated from the table
(`replicator.configuration.properties`): `python -m replicator.configuration.properties_page >
docs/CONNECTOR-PROPERTIES.md` (tests/configuration/test_properties.py fails while the page is stale).
"""

from __future__ import annotations

from replicator.configuration.masking import is_secret_property
from replicator.configuration.properties import (
    CLIENT_PREFIXES,
    IGNORED_PREFIXES,
    IGNORED_PROPERTIES,
    PROPERTIES,
    Kind,
    PropertySpec,
)


def _default(spec: PropertySpec) -> str:
    if spec.default is None:
        return "required" if spec.required else "unset"
    return f"`{str(spec.default).lower() if isinstance(spec.default, bool) else spec.default}`"


def _values(spec: PropertySpec) -> str:
    if spec.kind is Kind.INT:
        return spec.bounds()
    return spec.expected or ("true or false" if spec.kind is Kind.BOOLEAN else "")


def properties_markdown() -> str:
    """The reference page of every property, generated from the table (docs/CONNECTOR-PROPERTIES.md)."""
    lines = [
        "# Connector properties",
        "",
        "Generated from `replicator/configuration/properties.py` by `python -m "
        "replicator.configuration.properties_page > docs/CONNECTOR-PROPERTIES.md`; do not edit by hand.",
        "",
        "A connector is a flat JSON object of these properties, written as for Mirus or MirrorMaker 2. Values may "
        "be strings, numbers or booleans, and may contain `${env:NAME}` or `${file:/path:key}` references. Any "
        'other name is rejected (with a "did you mean" hint), except the ignored ones listed at the end.',
        "",
        "| property | type | default | values | secret | description |",
        "|---|---|---|---|---|---|",
    ]
    for spec in PROPERTIES:
        name = " / ".join(f"`{n}`" for n in spec.names)
        reader = spec.part or spec.client
        doc = spec.doc + (f" ({reader.value})" if reader else "")
        lines.append(
            f"| {name} | {spec.kind.value} | {_default(spec)} | {_values(spec)} | "
            f"{'yes' if is_secret_property(spec.name) else 'no'} | {doc} |"
        )
    lines += [
        "",
        "## Client settings",
        "",
        "librdkafka settings (https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md) after a "
        "prefix; they are checked by librdkafka when the connector is submitted. Values of settings whose name "
        "contains `password`, `secret`, `jaas.config`, `.pem`, `token` or `credentials`, or ends in `.key`, are "
        "secret: never shown, and refused in clear by the `put_connector` job (give a reference instead).",
        "",
        "`consumer.auto.offset.reset` (also `source.consumer.` / `source.cluster.` spellings) says where a partition "
        "without a stored offset starts, as in MirrorMaker 2: `earliest` (or `smallest`, `beginning`; the default) at "
        "its beginning, `latest` (or `largest`, `end`) at its end as its task starts it — the partitions of a new "
        "connector, and those of a topic matched later (a new topic, or a selection that grew): what they held "
        "before is not copied. Where a partition started is stored at the task's next commit, so a restart before "
        "its first record does not skip what was written meanwhile. A partition added to a topic the connector "
        "already replicates starts at its beginning whatever the policy: everything in it was written while the "
        "topic was being replicated, and at its end it would lose what was written between the partition's "
        "creation and the moment its task started it (MirrorMaker 2 starts it at its end; its users report exactly "
        "that loss). Such a partition is one that joined the connector's assignment after other partitions of its "
        "topic had (by the assignment generations kept); the task's events name it.",
        "",
        "Record sizes follow the topics: a task reads the `max.message.bytes` of the topics it serves (the broker's "
        "`message.max.bytes` where a topic sets none) with DescribeConfigs — one request per cluster, at its start, "
        "when its topics change, before a partition paused for a record's size is retried, and every minute — and "
        "makes its producer's `message.max.bytes` the largest destination limit and its `batch.size` at most the "
        "smallest (1 MiB by default), and its consumers' `max.partition.fetch.bytes`, `fetch.max.bytes` and "
        "`receive.message.max.bytes` large enough for a batch of the largest source limit (never below "
        "librdkafka's own). Records of any size both topics take are copied. A record larger than its destination "
        "topic takes pauses its partition alone, with a reason that names the limit, both sizes and what to change "
        '(`mirus_partitions_paused{cause="record_too_large"}`); raising the limit lets it through at the '
        "partition's next retry (within a minute), without a restart. The connector's own `producer.*` or "
        "`consumer.*` value of any of these settings wins, and its own `producer.message.max.bytes` turns the "
        "task's check of each record off: the destination broker then refuses what its topic does not take. "
        "Without DescribeConfigs on a topic (docs/SECURITY.md) its limit is unknown and librdkafka's defaults apply.",
        "",
        "The source consumer's fetches are answered within 3 ms by default (`fetch.wait.max.ms=3` with "
        "`fetch.min.bytes=1000000`): a record waits at most that long at any rate, and steady traffic costs at most "
        "~330 fetches a second per source broker and task instead of one per append. Partitions without a record "
        "for 5 s move to consumers that fetch as MirrorMaker's does (`fetch.wait.max.ms=500` with "
        "`fetch.min.bytes=1`: answered at the first byte, two fetches a second when idle), after a further minute "
        "to consumers waiting up to 5 s (one fetch every 5 s when idle, still answered at the first byte), so an "
        "idle task costs its source broker less than MirrorMaker 1.0's consumer does. A task starts its partitions "
        "in the quiet consumers; a partition moves to the eager ones once it has a backlog or its records come less "
        "than 5 s apart. Each consumer holds at most 2,000 partitions (librdkafka's cost per consumer grows faster "
        'than its partitions; benchmarks/README.md, "Holding thousands of partitions") and prefetches at most 16 MB '
        "unless `consumer.queued.max.messages.kbytes` says otherwise. `consumer.*` settings apply to all; the quiet "
        "ones keep their two. The producer queues at most 100,000 records by default "
        "(`producer.queue.buffering.max.messages`); the task reads no more while a batch (10,000) would not fit, so "
        "a destination slower than the source leaves the backlog in Kafka.",
        "",
        "| prefix | client | description |",
        "|---|---|---|",
        *(f"| `{p.prefix}*` | {p.client.value} | {p.doc} |" for p in CLIENT_PREFIXES),
        "",
        "## Accepted and ignored",
        "",
        "They change nothing here: " + ", ".join(f"`{n}`" for n in sorted(IGNORED_PROPERTIES)) + ", and every name "
        "starting with " + ", ".join(f"`{p}`" for p in IGNORED_PREFIXES) + ".",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(properties_markdown(), end="")
