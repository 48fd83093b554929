"""Fault injection: prove that replication loses nothing while its surroundings fail (`mirus faults run`)."""
