"""Connector configuration: the property table, reading and validating properties, secrets, masking, and connector
administration (the one code path behind the API, the CLI and the launchpad).
"""
