-- The Dagster instance keeps its run and event storage beside the platform's own tables.
CREATE DATABASE dagster OWNER mirus;
