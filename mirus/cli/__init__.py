"""The `mirus` command: `mirus dev`, `mirus stack`, `mirus task run`, `mirus connectors`, `mirus offsets`, `mirus
verify`, `mirus faults`, `mirus api`.
"""
