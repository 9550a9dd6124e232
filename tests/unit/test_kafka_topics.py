"""The topics the product asks Kafka for, and `topics check` against a fake admin client (SPEC §8)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from pipeline.kafka import topics as kt
from pipeline.config import ConfigError, Settings, load_settings, parse_duration_ms

DAY_MS = 86_400_000


def _prod() -> Settings:
    return load_settings({"CHANNEL_HEALTH_KAFKA_BOOTSTRAP": "k1:9092", "CHANNEL_HEALTH_TOPIC_PREFIX": "prod.",
                          "CHANNEL_HEALTH_PARTITIONS": "12", "CHANNEL_HEALTH_REPLICATION_FACTOR": "3",
                          "CHANNEL_HEALTH_MIN_INSYNC_REPLICAS": "2", "CHANNEL_HEALTH_DLQ_RETENTION": "90d"})


def test_every_topic_requested_with_its_configuration():
    got = {t.name: (t.num_partitions, t.replication_factor, t.topic_configs) for t in kt.new_topics(kt.topic_specs(_prod()))}
    delete = {"cleanup.policy": "delete", "min.insync.replicas": "2"}
    compact = {"cleanup.policy": "compact", "min.insync.replicas": "2"}
    assert got == {
        "prod.gateway.requests": (12, 3, delete),
        "prod.channel.health": (12, 3, compact),
        "prod.channel.control": (12, 3, compact),
        "prod.channel-health.state": (12, 3, compact),
        "prod.gateway.requests.dlq": (12, 3, {**delete, "retention.ms": str(90 * DAY_MS)}),
        "prod.channel.quality_scores": (12, 3, delete),
    }


def test_specs_cover_every_topic_name_of_the_settings():
    """One source of truth: whatever topic the worker or the demo uses is in the ensure list."""
    s = _prod()
    assert {t.name for t in kt.topic_specs(s)} == set(vars(s.topics).values())


def test_defaults_suit_the_embedded_broker():
    s = load_settings({})
    specs = {t.name: t for t in kt.topic_specs(s)}
    assert {(t.partitions, t.replication_factor, t.configs["min.insync.replicas"]) for t in specs.values()} == {(4, 1, "1")}
    assert specs["gateway.requests.dlq"].configs["retention.ms"] == str(30 * DAY_MS)


@pytest.mark.parametrize("env, message", [
    ({"CHANNEL_HEALTH_REPLICATION_FACTOR": "0"}, "REPLICATION_FACTOR must be a positive integer"),
    ({"CHANNEL_HEALTH_MIN_INSYNC_REPLICAS": "2"}, "must not exceed CHANNEL_HEALTH_REPLICATION_FACTOR (1)"),
    ({"CHANNEL_HEALTH_DLQ_RETENTION": "forever"}, "CHANNEL_HEALTH_DLQ_RETENTION must be a positive duration"),
    ({"CHANNEL_HEALTH_MAX_EVENT_AGE": "-3d"}, "CHANNEL_HEALTH_MAX_EVENT_AGE must be a positive duration"),
    ({"CHANNEL_HEALTH_CLOCK": "events"}, "CHANNEL_HEALTH_CLOCK must be 'wall' or 'event'"),
])
def test_bad_topic_and_time_settings_are_refused(env, message):
    with pytest.raises(ConfigError) as err:
        load_settings(env)
    assert message in str(err.value)


def test_max_event_age_and_clock_settings():
    assert (load_settings({}).max_event_age_ms, load_settings({}).clock) == (7 * DAY_MS, "wall")
    s = load_settings({"CHANNEL_HEALTH_MAX_EVENT_AGE": "400d", "CHANNEL_HEALTH_CLOCK": "Event"})
    assert (s.max_event_age_ms, s.clock) == (400 * DAY_MS, "event")


@pytest.mark.parametrize("text, ms", [("7d", 7 * DAY_MS), ("36h", 36 * 3_600_000), ("90m", 5_400_000),
                                      ("3600", 3_600_000), ("250ms", 250), ("2w", 14 * DAY_MS), ("0.5s", 500)])
def test_parse_duration(text, ms):
    assert parse_duration_ms(text, "X") == ms


@pytest.mark.parametrize("text", ["0", "0s", "", "7 days", "d", "1e3", "-5m"])
def test_parse_duration_refuses(text):
    with pytest.raises(ConfigError, match=r"^X must be a positive duration"):
        parse_duration_ms(text, "X")


class FakeAdmin:
    """Records what is asked; answers from ``topics`` = {name: (partitions, rf, configs or None)}."""

    def __init__(self, topics: dict[str, tuple[int, int, dict[str, str] | None]], create_error: int = 0):
        self.topics = dict(topics)
        self.create_error = create_error
        self.created: list = []
        self.described_by_name: list[list[str]] = []
        self.closed = False

    async def start(self):
        pass

    async def close(self):
        self.closed = True

    async def list_topics(self):
        return list(self.topics)

    async def create_topics(self, new, timeout_ms=None):
        self.created.extend(new)
        for t in new:
            if not self.create_error:
                self.topics[t.name] = (t.num_partitions, t.replication_factor, dict(t.topic_configs))
        return SimpleNamespace(topic_errors=[(t.name, self.create_error, "denied" if self.create_error else None)
                                             for t in new])

    async def describe_topics(self, names):
        self.described_by_name.append(list(names))
        return [{"topic": n, "error_code": 0,
                 "partitions": [{"partition": i, "replicas": list(range(self.topics[n][1]))}
                                for i in range(self.topics[n][0])]} for n in names]

    async def describe_configs(self, resources):
        rows = []
        for r in resources:
            cfg = self.topics[r.name][2]
            rows.append((0, None, 2, r.name, [(k, v, False, 5, False, []) for k, v in (cfg or {}).items()]))
        return [SimpleNamespace(resources=rows)]


def test_ensure_creates_only_missing_topics_and_never_names_a_missing_one_in_metadata():
    s = _prod()
    admin = FakeAdmin({"prod.gateway.requests": (12, 3, {})})
    result = asyncio.run(kt.ensure(s, admin=admin))
    assert result["existing"] == ["prod.gateway.requests"]
    assert [t.name for t in admin.created] == result["created"] == [
        "prod.channel.health", "prod.channel.control", "prod.channel-health.state", "prod.gateway.requests.dlq",
        "prod.channel.quality_scores"]
    # metadata by name only after creation (a named metadata request auto-creates with default configs)
    assert admin.described_by_name == [result["created"]]
    assert admin.closed
    admin.created.clear()
    assert asyncio.run(kt.ensure(s, admin=admin))["created"] == [] and admin.created == []


def test_ensure_reports_a_refused_create():
    admin = FakeAdmin({}, create_error=29)
    with pytest.raises(kt.TopicSetupError, match=r"creating topic 'prod.gateway.requests' failed: Kafka error 29"):
        asyncio.run(kt.ensure(_prod(), admin=admin))
    assert admin.closed


def _as_wanted(s: Settings) -> dict:
    return {t.name: (t.partitions, t.replication_factor, dict(t.configs)) for t in kt.topic_specs(s)}


def test_check_all_ok():
    report = asyncio.run(kt.check(_prod(), admin=FakeAdmin(_as_wanted(_prod()))))
    assert (report.mismatches, report.unverified, len(report.ok)) == ([], [], 6)


def test_check_reports_each_mismatch():
    topics = _as_wanted(_prod())
    topics["prod.channel.health"] = (12, 3, {"cleanup.policy": "delete", "min.insync.replicas": "2"})
    topics["prod.channel-health.state"] = (12, 3, {"cleanup.policy": "compact,delete", "min.insync.replicas": "2"})
    topics["prod.gateway.requests"] = (6, 1, topics["prod.gateway.requests"][2])
    del topics["prod.channel.control"]
    report = asyncio.run(kt.check(_prod(), admin=FakeAdmin(topics)))
    assert report.mismatches == [
        "prod.channel.control: missing (run `channel-health topics ensure`)",
        "prod.gateway.requests: 6 partitions, configured 12",
        "prod.gateway.requests: replication factor 1, configured 3",
        "prod.channel.health: cleanup.policy=delete, configured compact",
        "prod.channel-health.state: cleanup.policy=compact,delete, configured compact",
    ]
    assert report.ok == ["prod.gateway.requests.dlq", "prod.channel.quality_scores"]
    assert report.lines()[0] == "MISMATCH  prod.channel.control: missing (run `channel-health topics ensure`)"


def test_check_says_what_a_broker_did_not_report():
    topics = {name: (p, rf, None) for name, (p, rf, _) in _as_wanted(_prod()).items()}
    report = asyncio.run(kt.check(_prod(), admin=FakeAdmin(topics)))
    assert report.mismatches == []
    assert len(report.unverified) == 13  # 6 topics x (cleanup.policy, min.insync.replicas) + the DLQ's retention.ms
    assert "prod.channel.health: cleanup.policy (wanted compact)" in report.unverified
    assert report.lines()[-1].startswith("13 setting(s) not reported by the broker")
