"""The code location: every asset, job, sensor, schedule and resource of the platform, assembled once."""

import dagster as dg

defs = dg.Definitions()
