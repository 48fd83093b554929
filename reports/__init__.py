"""The platform's reports: the lake (its own records as Parquet), the Spark reports over it and their charts. Imports
the engine; the engine never imports it.
"""
