"""Batches: partitions copied as record batches, bytes fetched and produced with only the batch header rewritten
(shallow mirroring). Speaks Kafka through kafka-python's protocol layer; no confluent-kafka, imports no other room."""
