"""The platform database: schema, Alembic migrations, connections and the store. Imports `topics/` and the shared
modules.
"""
