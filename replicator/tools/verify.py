"""Does the destination hold what the source holds? An operator's check and the test suite's oracle.

Both clusters are read from the beginning with `assign()` (no consumer group is joined and nothing is committed,
so verifying never disturbs anyone's offsets). The check is bounded by a snapshot taken when it starts, so it
ends against live traffic too: each source partition is read up to the end offset the broker reported then
(ListOffsets, as Kafka documents it: the offset the next record will get). A broker whose end offsets contradict
the records it serves (a record at or past the reported end that a fresh query does not account for) has its
end offsets set aside for that partition: reading then stops at the first record created after the check started
(CreateTime), or when the partition stays quiet for `idle_s`, and the report says which bound was used. Each
destination partition is read up to its end offset taken when the check starts, so that every copy written before
then is counted, duplicates after the last source record's copy included, and on until every checked source record
has been seen there; reading stops early only when no copy of one (nor a record below those end offsets) arrived
for `idle_s`. Destination records are attributed to the source record they copy by their provenance headers, or,
for record batches copied as bytes (shallow mirroring), by the copy segments Postgres keeps; other records without
headers (provenance turned off) are matched by content within the destination partition of the same number.

Memory stays small for millions of records: per source record only its offset, a 64-bit hash of key, value and
user headers, its timestamp and a delivery counter are kept (about 25 bytes); destination records are checked
as they stream by and then dropped.

What a check keeps is `verify_ledger.py`, how it reads a cluster `verify_reader.py`, what it found
`verify_report.py`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from replicator.state.records import CopySegment
from replicator.tools.verify_ledger import SourceLog, VerifyRun
from replicator.tools.verify_reader import ClusterReader, VerifyError
from replicator.tools.verify_report import DestinationResult, VerifyReport

__all__ = ["VerifyError", "verify_replication"]


def verify_replication(
    source: Mapping[str, str],
    destination: Mapping[str, str],
    topics: Mapping[str, str],
    *,
    timeout_s: float = 60.0,
    idle_s: float = 3.0,
    segments: Iterable[CopySegment] = (),
) -> VerifyReport:
    """Compare every partition of each source topic in `topics` with its destination topic.

    `source` and `destination` are librdkafka client settings (secrets in them are never put in messages).
    Each source partition is read up to the snapshot described in the module docstring; the destination up to
    its end offsets at the start and until every checked record was seen, or no copy of one arrived for `idle_s`.
    `timeout_s` bounds the whole check, and a check cut short by it reports `complete=False`. `segments`: where
    record batches were copied without provenance headers (`Store.load_segments`), to attribute those copies exactly.
    """
    if not topics:
        raise ValueError("no topics to verify: an empty check would report OK without looking at anything")
    started = time.monotonic()
    started_at_ms = int(time.time() * 1000)
    deadline = started + timeout_s
    run = VerifyRun(topics, segments)

    with ClusterReader("destination", destination) as copies:
        assigned: list[tuple[str, int]] = []
        for topic in sorted(set(topics.values())):
            partitions = copies.partitions(topic, deadline)
            run.destinations[topic] = DestinationResult(
                topic, exists=partitions is not None, partitions=partitions or 0
            )
            assigned += [(topic, p) for p in range(partitions or 0)]
        # Before the source is read: copies written since are counted only while a source record awaits its copy.
        ends = copies.log_ends(assigned)
        run.notes += [
            f"destination {t}[{p}]: no end offset: read until every checked record's copy was seen, so copies after "
            "that may go uncounted"
            for t, p in assigned
            if (t, p) not in ends
        ]

        with ClusterReader("source", source) as reader:
            for topic in sorted(set(topics)):
                partitions = reader.partitions(topic, deadline)
                if partitions is None:
                    run.complete = False
                    run.notes.append(f"source topic {topic} does not exist: it was not verified")
                    continue
                for p in range(partitions):
                    run.sources[(topic, p)] = SourceLog(topic, p, topics[topic])
            if not reader.read_snapshot(run, started_at_ms, deadline, idle_s):
                run.timed_out("source", timeout_s)
        run.read_errors("source", reader.errors)

        for log in run.sources.values():
            log.start_matching()
        if not copies.read_copies(assigned, ends, run, deadline, idle_s):
            run.timed_out("destination", timeout_s)
    run.read_errors("destination", copies.errors)
    return run.report(time.monotonic() - started)
