-- channel-health ClickHouse schema, step 1: the database (SPEC §7).
-- Files in this folder are applied in name order by
-- pipeline.storage.schema.apply_ddl (or by hand: clickhouse-client --multiquery < FILE).
-- Every statement is idempotent (IF NOT EXISTS), so re-applying is safe.
CREATE DATABASE IF NOT EXISTS channel_health;
