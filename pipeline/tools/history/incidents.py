"""The ``channel_incidents`` table: labelled incidents and clean periods (issue #22).

One row per incident (DDL: ``infra/clickhouse/010_channel_incidents.sql``):
a channel, a kind (:data:`INCIDENT_KINDS`, or :data:`CLEAN` for a period that
must produce no non-healthy verdict), a span ``[from_ms, to_ms)`` in UTC epoch
milliseconds, its source (:data:`SOURCES`: marked by hand or stored by a
drill) and a note. Backtests report the first detection of each incident and
the non-healthy time on clean periods; ``channel-health tune`` uses both as
ground truth.

Writes and reads go through the clickhouse-connect client of
:func:`pipeline.storage.client.open_client` (chDB or a server).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Sequence

from pipeline.storage import DATABASE

INCIDENTS_TABLE = f"{DATABASE}.channel_incidents"

#: Fault kinds (the drill kinds of issue #22) plus ``other`` for anything marked by hand.
INCIDENT_KINDS: tuple[str, ...] = (
    "latency", "errors", "hollow", "stream_stall", "quota_drain", "quality_drift", "other",
)  # fmt: skip
#: The kind of a clean period: no non-healthy verdict is expected on it.
CLEAN = "clean"
#: Every value of the ``kind`` column.
ALL_KINDS: tuple[str, ...] = (*INCIDENT_KINDS, CLEAN)
#: Who wrote the row: ``manual`` (``channel-health incident mark``) or ``drill`` (``channel-health drill``).
SOURCES: tuple[str, ...] = ("manual", "drill")

_COLUMNS = ("incident_id", "channel", "route", "kind", "from_ts", "to_ts", "source", "note", "created_ts")

_DDL = f"""CREATE TABLE IF NOT EXISTS {INCIDENTS_TABLE}
(
    incident_id String, channel String, route String, kind LowCardinality(String),
    from_ts DateTime64(3, 'UTC'), to_ts DateTime64(3, 'UTC'), source LowCardinality(String),
    note String, created_ts DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(created_ts)
ORDER BY (channel, from_ts, incident_id)"""


class IncidentError(ValueError):
    """An incident that cannot be stored (bad kind, source, channel or span); the message says which."""


@dataclass(frozen=True)
class Incident:
    """One ``channel_incidents`` row; times are UTC epoch milliseconds, span ``[from_ms, to_ms)``."""

    incident_id: str
    channel: str
    route: str
    kind: str
    from_ms: int
    to_ms: int
    source: str
    note: str
    created_ms: int

    @property
    def is_clean(self) -> bool:
        """True for a clean period (kind :data:`CLEAN`)."""
        return self.kind == CLEAN


def ensure_table(client: Any) -> None:
    """Create ``channel_incidents`` if missing (same DDL as ``infra/clickhouse/010_channel_incidents.sql``)."""
    client.command(_DDL)


def validate(channel: str, from_ms: int, to_ms: int, kind: str, source: str) -> None:
    """Raise :class:`IncidentError` unless the fields make a storable incident.

    Rules: non-empty channel; ``kind`` in :data:`ALL_KINDS`; ``source`` in
    :data:`SOURCES`; integer times with ``0 <= from_ms < to_ms``.
    """
    if not channel or not channel.strip():
        raise IncidentError("incident channel must not be empty")
    if kind not in ALL_KINDS:
        raise IncidentError(f"unknown incident kind {kind!r}; expected one of {', '.join(ALL_KINDS)}")
    if source not in SOURCES:
        raise IncidentError(f"unknown incident source {source!r}; expected one of {', '.join(SOURCES)}")
    if not isinstance(from_ms, int) or not isinstance(to_ms, int) or isinstance(from_ms, bool):
        raise IncidentError("incident times must be integer epoch milliseconds")
    if from_ms < 0 or to_ms <= from_ms:
        raise IncidentError(f"incident span must have 0 <= from < to, got from={from_ms} to={to_ms} (epoch ms)")


def mark_incident(
    client: Any,
    channel: str,
    from_ms: int,
    to_ms: int,
    kind: str,
    source: str = "manual",
    note: str = "",
    *,
    route: str = "",
    incident_id: str | None = None,
    created_ms: int | None = None,
) -> Incident:
    """Store one incident (or clean period, ``kind="clean"``) and return it.

    ``from_ms``/``to_ms``: UTC epoch ms, span ``[from_ms, to_ms)``. ``source``:
    ``"manual"`` or ``"drill"``. ``incident_id``: a new UUID4 when omitted
    (re-marking with the same id replaces the row on merge). ``created_ms``:
    defaults to now. Creates the table if missing.

    Raises :class:`IncidentError` for invalid fields (nothing is written);
    driver errors from the insert propagate.
    """
    validate(channel, from_ms, to_ms, kind, source)
    created = int(datetime.now(timezone.utc).timestamp() * 1000) if created_ms is None else int(created_ms)
    incident = Incident(
        incident_id=incident_id or str(uuid.uuid4()), channel=channel, route=route, kind=kind,
        from_ms=from_ms, to_ms=to_ms, source=source, note=note, created_ms=created,
    )
    ensure_table(client)
    row = [
        incident.incident_id, channel, route, kind, _dt(from_ms), _dt(to_ms), source, note, _dt(created),
    ]
    client.insert(INCIDENTS_TABLE, [row], column_names=list(_COLUMNS))
    return incident


def list_incidents(
    client: Any,
    from_ms: int | None = None,
    to_ms: int | None = None,
    channels: Sequence[str] | None = None,
    kinds: Sequence[str] | None = None,
) -> list[Incident]:
    """Incidents and clean periods overlapping ``[from_ms, to_ms)``, ordered by start, channel.

    ``None`` bounds are open; ``channels`` / ``kinds`` filter when given. Rows
    are read with ``FINAL`` (deduplicated). A missing table reads as empty
    (nothing is created: read-only users can list).
    """
    if not int(client.command(f"EXISTS TABLE {INCIDENTS_TABLE}")):
        return []
    where, params = ["1"], {}
    if from_ms is not None:
        where.append("to_ts > fromUnixTimestamp64Milli({f:Int64}, 'UTC')")
        params["f"] = int(from_ms)
    if to_ms is not None:
        where.append("from_ts < fromUnixTimestamp64Milli({t:Int64}, 'UTC')")
        params["t"] = int(to_ms)
    if channels:
        where.append("channel IN {ch:Array(String)}")
        params["ch"] = list(channels)
    if kinds:
        where.append("kind IN {k:Array(String)}")
        params["k"] = list(kinds)
    sql = (
        "SELECT incident_id, channel, route, kind, toUnixTimestamp64Milli(from_ts), toUnixTimestamp64Milli(to_ts),"
        f" source, note, toUnixTimestamp64Milli(created_ts) FROM {INCIDENTS_TABLE} FINAL"
        f" WHERE {' AND '.join(where)} ORDER BY from_ts, channel, incident_id"
    )
    rows = client.query(sql, parameters=params).result_rows
    return [
        Incident(str(r[0]), str(r[1]), str(r[2]), str(r[3]), int(r[4]), int(r[5]), str(r[6]), str(r[7]), int(r[8]))
        for r in rows
    ]


def _dt(ts_ms: int) -> datetime:
    return datetime.fromtimestamp(ts_ms / 1000, tz=timezone.utc)
