"""Store a drill run (table ``channel_health.drill_runs``, ``infra/clickhouse/009_drill_runs.sql``) and its
incident (``channel_incidents`` through :func:`pipeline.tools.history.incidents.mark_incident`)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

DRILL_RUNS_TABLE = "channel_health.drill_runs"
_COLUMNS = ("run_id", "channel", "route", "kind", "shadow", "topic_prefix", "started_ts", "fault_from_ts",
            "fault_to_ts", "ended_ts", "expected", "actual", "comparison", "passed", "note", "created_ts")


def _dt(ts_ms: int) -> datetime:
    return datetime.fromtimestamp(ts_ms / 1000, tz=timezone.utc)  # aware UTC: clickhouse-connect keeps it


def run_row(result: Any, created_ms: int) -> list:
    """One ``drill_runs`` row (column order of :data:`_COLUMNS`) for a
    :class:`~pipeline.tools.drill.runner.DrillResult`; times UTC, JSON columns with sorted keys."""
    p = result.plan
    return [p.run_id, p.channel, p.route, p.kind.name, int(result.shadow), result.topic_prefix,
            _dt(p.start_ms), _dt(p.fault_start_ms), _dt(p.fault_end_ms), _dt(p.end_ms),
            json.dumps(result.expected_json(), sort_keys=True), json.dumps(result.actual_json(), sort_keys=True),
            json.dumps(result.rows_json(), sort_keys=True), int(result.passed), result.note, _dt(created_ms)]


def store_run(client: Any, result: Any, created_ms: int) -> str | None:
    """Insert the run into ``drill_runs`` and its fault window as a ``drill`` incident; returns the
    incident id, or None when the incidents module is not installed (the caller says so; the run is
    stored either way). The table is created if missing (the DDL is idempotent). Driver errors propagate.
    """
    from pipeline.storage.schema import DEFAULT_DDL_DIR
    from pipeline.storage.sqltext import split_statements

    for stmt in split_statements((DEFAULT_DDL_DIR / "009_drill_runs.sql").read_text(encoding="utf-8")):
        client.command(stmt)
    client.insert(DRILL_RUNS_TABLE, [run_row(result, created_ms)], column_names=list(_COLUMNS))
    try:
        from pipeline.tools.history.incidents import mark_incident
    except ImportError:
        return None
    p = result.plan
    inc = mark_incident(client, p.channel, p.fault_start_ms, p.fault_end_ms, p.kind.name, source="drill",
                        note=f"drill run {p.run_id}: {p.kind.fault_kind} for {p.duration_s:g} s"
                             f"{' (shadow)' if result.shadow else ''}; passed={result.passed}")
    return getattr(inc, "incident_id", None)
