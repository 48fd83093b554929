"""The metadata watcher and the monitor: cluster metadata in, assignment generations out, and the monitor's duties
(destination topic creation and config sync, heartbeats, group checkpoints).
"""
