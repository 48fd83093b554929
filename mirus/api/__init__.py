"""The Kafka-Connect-compatible HTTP API (`mirus api`, started by `mirus dev`) and its Prometheus `/metrics`."""
