"""The Dagster layer of mirus-dagster: code location, CLI and the embedded local stack.

Importing this package does not import Dagster; `mirus_dagster.definitions` does.
"""
