"""The local platform: the embedded stack (two clusters and Postgres on loopback), the demo, and `mirus dev`'s Dagster
dev server.
"""
