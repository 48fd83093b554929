"""The Dagster wiring: the code location (`definitions.py`, the one assembly point), jobs, resources, schedules,
the platform's settings and the names the Dagster side shares (`constants.py`).

Importing this package does not import Dagster; `mirus_dagster.definitions` does.
"""
