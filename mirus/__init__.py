"""The platform's surfaces, each a package of its own: `cli/` (the `mirus` command), `api/` (the Kafka-Connect
compatible REST API and the Prometheus exporter), `local/` (the embedded local stack, the demo and `mirus dev`'s
Dagster dev server) and `faults/` (the fault-injection harness). Beside them, `waiting.py` is the one "poll until
a condition holds" helper that every surface (and the tests and benchmarks) uses.

Imports run one way: surfaces → the Dagster wiring (`mirus_dagster/`, whose `definitions.py` alone imports its
`assets/` and `sensors/`) → the reports (`reports/`) → the engine (`replicator/`); `tests/test_layers.py` checks it.
"""
