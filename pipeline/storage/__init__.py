"""ClickHouse storage: connections, schema (DDL) and read-only analyst queries.

- :mod:`.client` opens a clickhouse-connect client for ``chdb:///path`` or
  ``http(s)://user@host:port/db`` (one cached client per chDB directory).
- :mod:`.schema` applies ``infra/clickhouse/NNN_*.sql`` in order.
- :mod:`.query` runs a single read-only statement with bound parameters and
  formats the result as a table.
- :mod:`.sqltext` is the small SQL lexer both use.

Database name: :data:`DATABASE` (SPEC §7).
"""

from __future__ import annotations

DATABASE = "channel_health"
