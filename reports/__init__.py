"""The platform's reports: the lake (its own records as Parquet), the Spark reports over it, their charts, and the
metric totals exporters read. Imports the engine; the engine never imports it.
"""
