"""The replication engine: connector configs, selection, naming, assignment, the task loop and the store.

Nothing here imports Dagster.
"""
