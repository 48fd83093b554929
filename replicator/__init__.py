"""The replication engine, in rooms (each may import only the rooms listed before it, and the shared modules):

- `assignment`, `clusters`, `partition_reader` (shared): source partitions and their assignment to tasks, what a
  cluster's metadata shows, reading a partition to its end.
- `topics/`: which topics are selected, their destination names, cycles, provenance headers.
- `state/`: the platform database — schema, migrations, connections and the store.
- `configuration/`: connector properties, reading and validating them, secrets and masking, connector administration.
- `engine/`: a task at work — its source reader, forwarding loop, commits, transactions, ownership and metrics.
- `discovery/`: the metadata watcher and the monitor — assignments, topic creation and sync, heartbeats, checkpoints.
- `tools/`: what operators run by hand — verify, Mirus offset files.

Nothing here imports Dagster, Spark or matplotlib (tests/test_layers.py).
"""
