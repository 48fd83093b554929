"""A replicator task at work: source reader, forwarding loop, commits, exactly-once transactions, ownership (owner and
warm standbys) and metrics.
"""
