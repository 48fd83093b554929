"""Dagster assets: the estate's map (connectors and their replication flows) and, later, reports over it."""
