"""channel_incidents table access and the history time parser (issue #22)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from pipeline.config import Settings
from pipeline.tools.history.incidents import IncidentError, list_incidents, mark_incident
from pipeline.tools.history.timeparse import TimeParseError, format_time_ms, parse_time_ms

T0 = 1_772_323_200_000  # 2026-03-01T00:00:00Z


@pytest.fixture
def ch(tmp_path: Path) -> Iterator[object]:
    """A chDB client on a fresh directory with the schema applied."""
    from pipeline.storage.client import close_clients, open_client
    from pipeline.storage.schema import apply_ddl

    close_clients()
    client = open_client(Settings(kafka_bootstrap=None, clickhouse_url=f"chdb://{tmp_path / 'chdb'}"))
    apply_ddl(client)
    yield client
    close_clients()


def test_parse_time_forms() -> None:
    assert parse_time_ms("2026-03-01T00:00:00Z", 0) == T0
    assert parse_time_ms("2026-03-01T01:00:00+01:00", 0) == T0
    assert parse_time_ms("2026-03-01", 0) == T0
    assert parse_time_ms(str(T0), 0) == T0
    assert parse_time_ms("-24h", T0) == T0 - 86_400_000
    assert parse_time_ms("now", T0) == T0
    assert format_time_ms(T0) == "2026-03-01T00:00:00.000Z"


@pytest.mark.parametrize("bad", ["", "2026-03-01T00:00:00", "12345", "yesterday", "-3x"])
def test_parse_time_refuses_ambiguous_or_bad_values(bad: str) -> None:
    with pytest.raises(TimeParseError):
        parse_time_ms(bad, T0)


def test_mark_and_list_round_trip(ch) -> None:
    a = mark_incident(ch, "c1", T0, T0 + 600_000, "latency", source="drill", note="drill 1")
    mark_incident(ch, "c2", T0 + 3_600_000, T0 + 7_200_000, "clean")
    got = list_incidents(ch)
    assert [(i.channel, i.kind, i.from_ms, i.to_ms, i.source) for i in got] == [
        ("c1", "latency", T0, T0 + 600_000, "drill"),
        ("c2", "clean", T0 + 3_600_000, T0 + 7_200_000, "manual"),
    ]
    assert got[0].incident_id == a.incident_id and got[0].note == "drill 1"
    # overlap filter: only the clean period overlaps [T0+1h, T0+3h)
    assert [i.channel for i in list_incidents(ch, T0 + 3_600_000, T0 + 10_800_000)] == ["c2"]
    assert [i.kind for i in list_incidents(ch, channels=["c1"])] == ["latency"]
    assert [i.kind for i in list_incidents(ch, kinds=["clean"])] == ["clean"]


@pytest.mark.parametrize(
    ("channel", "frm", "to", "kind", "source", "words"),
    [
        ("c", T0, T0 + 1, "meteor", "manual", "unknown incident kind"),
        ("c", T0, T0 + 1, "latency", "robot", "unknown incident source"),
        ("", T0, T0 + 1, "latency", "manual", "channel must not be empty"),
        ("c", T0, T0, "latency", "manual", "0 <= from < to"),
    ],
)
def test_mark_refuses_bad_fields_before_writing(channel, frm, to, kind, source, words) -> None:
    with pytest.raises(IncidentError, match=words):
        mark_incident(None, channel, frm, to, kind, source=source)
