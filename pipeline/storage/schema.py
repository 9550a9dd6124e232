"""Apply the ClickHouse DDL in ``infra/clickhouse/NNN_*.sql`` (SPEC §7 names).

Files are applied in name order (``001_database.sql``, ``002_...``), each split
into statements on top-level ``;``. Every statement is ``CREATE ... IF NOT
EXISTS`` or ``ALTER TABLE ... ADD COLUMN IF NOT EXISTS``, so :func:`apply_ddl`
is idempotent: run it at every start.

Tables (database ``channel_health``): ``request_events``,
``channel_minute_stats`` (view), ``channel_verdicts``, ``quality_scores``,
``quality_labels``. The SQL files document columns and units.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pipeline.storage.errors import SchemaError
from pipeline.storage.sqltext import SqlLexError, split_statements

#: ``infra/clickhouse`` of the source tree this package lives in.
DEFAULT_DDL_DIR = Path(__file__).resolve().parents[2] / "infra" / "clickhouse"

_DDL_NAME = re.compile(r"^\d{3}_[A-Za-z0-9_]+\.sql$")


def ddl_files(ddl_dir: Path | None = None) -> list[Path]:
    """Return the ``NNN_name.sql`` files of ``ddl_dir`` sorted by name.

    Raises :class:`SchemaError` when the folder is missing or holds no DDL
    file (e.g. the package was installed without its source tree: pass
    ``ddl_dir`` explicitly then).
    """
    folder = DEFAULT_DDL_DIR if ddl_dir is None else Path(ddl_dir)
    if not folder.is_dir():
        raise SchemaError(f"DDL folder {folder} does not exist (pass ddl_dir= pointing at infra/clickhouse)")
    files = sorted(p for p in folder.iterdir() if p.is_file() and _DDL_NAME.match(p.name))
    if not files:
        raise SchemaError(f"DDL folder {folder} holds no NNN_name.sql files")
    return files


def apply_ddl(client: Any, ddl_dir: Path | None = None) -> list[str]:
    """Run every DDL statement of ``ddl_dir`` (default :data:`DEFAULT_DDL_DIR`) on ``client``.

    ``client`` is a clickhouse-connect client (HTTP or chDB). Returns the
    applied file names in order. Idempotent.

    Raises :class:`SchemaError` naming the file and statement number when a
    file cannot be read or lexed, or the server rejects a statement
    (statements before it stay applied; fix and re-run).
    """
    applied: list[str] = []
    for path in ddl_files(ddl_dir):
        try:
            statements = split_statements(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, SqlLexError) as exc:
            raise SchemaError(f"cannot read DDL file {path.name}: {exc}") from exc
        for number, statement in enumerate(statements, start=1):
            try:
                client.command(statement)
            except Exception as exc:  # driver errors have no common base across backends
                raise SchemaError(
                    f"DDL file {path.name}, statement {number} failed: {type(exc).__name__}: {exc}"
                ) from exc
        applied.append(path.name)
    return applied
