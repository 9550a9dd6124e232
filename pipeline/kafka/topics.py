"""Every Kafka topic of the product with its configuration: ``topics ensure|check`` (SPEC §7, §8).

One source of truth: :func:`topic_specs` derives the topics and their
configuration from :class:`pipeline.config.Settings` (names with
``CHANNEL_HEALTH_TOPIC_PREFIX``; partitions, replication factor and
``min.insync.replicas`` from configuration):

==========================  ==================  =========================================
topic                       ``cleanup.policy``  why
==========================  ==================  =========================================
``gateway.requests``        delete              input, keyed by channel
``channel.health``          compact             routers and restarts need each channel's
                                                latest verdict
``channel.control``         compact             manual overrides: the latest per key
``channel-health.state``    compact             the worker's channel snapshots
``gateway.requests.dlq``    delete              long ``retention.ms``
                                                (``CHANNEL_HEALTH_DLQ_RETENTION``)
``channel.quality_scores``  delete              quality scores
==========================  ==================  =========================================

:func:`ensure` creates the missing topics with those configurations, so the
product works with the cluster's automatic topic creation off; it lists the
cluster's topics instead of asking for them by name, because a metadata
request for a named topic makes a broker with auto-create on create it with
its default configuration. Existing topics are left as they are (altering a
live topic is an operator's decision): :func:`check` reports how they differ.

All Kafka calls go through aiokafka's admin client
(:class:`aiokafka.admin.AIOKafkaAdminClient`); ``admin`` arguments accept any
object with its ``start``/``close``/``list_topics``/``create_topics``/
``describe_topics``/``describe_configs`` coroutines (tests pass a fake).

The embedded Tansu broker ignores topic configurations and does not report
them back; :func:`check` then says which settings it could not verify.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from pipeline.config import Settings
from pipeline.kafka.admin import TopicSetupError, _topic_errors, _wait_for_partitions

__all__ = ["TopicSpec", "topic_specs", "new_topics", "ensure", "check", "CheckReport", "TopicSetupError"]

_TOPIC_ALREADY_EXISTS = 36
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicSpec:
    """One topic as the product wants it.

    ``partitions`` >= 1, ``replication_factor`` >= 1; ``configs``: Kafka topic
    configuration entries (string values, as Kafka takes them).
    """

    name: str
    partitions: int
    replication_factor: int
    configs: dict[str, str] = field(default_factory=dict, hash=False)


def topic_specs(settings: Settings) -> list[TopicSpec]:
    """Every topic the worker, the simulator and the demo produce to or consume from (SPEC §8).

    Compacted: ``channel.health``, ``channel.control``, the state topic.
    The DLQ has ``retention.ms = settings.dlq_retention_ms``. Each has
    ``min.insync.replicas = settings.min_insync_replicas`` (with
    ``producer_acks=-1`` a write then needs that many replicas).
    """
    t = settings.topics
    common = {"min.insync.replicas": str(settings.min_insync_replicas)}
    compact = {"cleanup.policy": "compact", **common}
    delete = {"cleanup.policy": "delete", **common}
    configs = {
        t.requests: delete,
        t.health: compact,
        t.control: compact,
        t.state: compact,
        t.dlq: {**delete, "retention.ms": str(settings.dlq_retention_ms)},
        t.quality: delete,
    }
    return [TopicSpec(name, settings.partitions, settings.replication_factor, dict(c)) for name, c in configs.items()]


def new_topics(specs: list[TopicSpec]) -> list[NewTopic]:
    """The CreateTopics entries for ``specs`` (what :func:`ensure` sends)."""
    return [NewTopic(s.name, num_partitions=s.partitions, replication_factor=s.replication_factor,
                     topic_configs=dict(s.configs)) for s in specs]


def _admin_for(settings: Settings, timeout_s: float) -> AIOKafkaAdminClient:
    if not settings.kafka_bootstrap:
        raise TopicSetupError("CHANNEL_HEALTH_KAFKA_BOOTSTRAP is not set")
    return AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap,
                               request_timeout_ms=max(1000, int(timeout_s * 1000)),
                               **settings.kafka_security.aiokafka_kwargs())


async def _started(admin: Any, settings: Settings, timeout_s: float) -> None:
    try:
        await asyncio.wait_for(admin.start(), timeout=timeout_s)
    except Exception as exc:
        await _close(admin)
        raise TopicSetupError(f"cannot reach Kafka at {settings.kafka_bootstrap}: {type(exc).__name__}: {exc}") \
            from exc


async def _close(admin: Any) -> None:
    try:
        await admin.close()
    except Exception:  # closing after a failure: the original error is what matters
        pass


async def ensure(settings: Settings, *, admin: Any = None, timeout_s: float = 15.0) -> dict[str, list[str]]:
    """Create every topic of :func:`topic_specs` that does not exist, with its configuration.

    Returns ``{"created": [...], "existing": [...]}`` (topic names). Existing
    topics are not changed. ``timeout_s``: overall limit in seconds.

    Raises :class:`TopicSetupError` when Kafka cannot be reached, a create
    fails with an error other than "already exists" (e.g. not authorised, or
    a replication factor above the number of brokers), or a created topic
    does not show up in metadata within ``timeout_s``.
    """
    specs = topic_specs(settings)
    deadline = time.monotonic() + timeout_s
    admin = admin if admin is not None else _admin_for(settings, timeout_s)
    await _started(admin, settings, timeout_s)
    try:
        present = set(await admin.list_topics())  # never by name: that would auto-create them
        missing = [s for s in specs if s.name not in present]
        if missing:
            response = await admin.create_topics(new_topics(missing), timeout_ms=int(timeout_s * 1000))
            for topic, code, message in _topic_errors(response):
                if code not in (0, _TOPIC_ALREADY_EXISTS):
                    raise TopicSetupError(f"creating topic {topic!r} failed: Kafka error {code}: {message}")
            await _wait_for_partitions(admin, [s.name for s in missing], deadline)
            log.info("topics created: %s", ", ".join(s.name for s in missing))
    finally:
        await _close(admin)
    return {"created": [s.name for s in missing], "existing": [s.name for s in specs if s.name in present]}


@dataclass
class CheckReport:
    """What :func:`check` found.

    ``mismatches``: one line per difference (a missing topic, a partition
    count, a replication factor or a config value); ``unverified``: one line
    per setting the broker did not report (the embedded broker reports no
    topic configs); ``ok``: topics that match in everything verified.
    """

    mismatches: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)
    ok: list[str] = field(default_factory=list)
    #: Why settings could not be verified (e.g. the broker refused DescribeConfigs).
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The report as text lines (mismatches first)."""
        out = [f"MISMATCH  {m}" for m in self.mismatches]
        out += [f"UNVERIFIED  {u}" for u in self.unverified]
        out += [f"ok  {name}" for name in self.ok]
        out += [f"note: {n}" for n in self.notes]
        if self.unverified:
            out.append(f"{len(self.unverified)} setting(s) not reported by the broker and so not verified "
                       "(the embedded Tansu broker ignores topic configs).")
        return out


def _policy_tokens(value: str) -> set[str]:
    return {v.strip() for v in value.split(",") if v.strip()}


def _same(key: str, want: str, have: str) -> bool:
    if key == "cleanup.policy":  # "compact,delete" is not "compact": old snapshots would be deleted
        return _policy_tokens(want) == _policy_tokens(have)
    return want.strip() == have.strip()


async def check(settings: Settings, *, admin: Any = None, timeout_s: float = 15.0) -> CheckReport:
    """Compare the cluster's topics with :func:`topic_specs`; changes nothing.

    Checks each topic's existence, partition count, replication factor (the
    replica count of its partitions) and each wanted config value (from
    DescribeConfigs). Raises :class:`TopicSetupError` when Kafka cannot be
    reached; a config the broker does not report goes to ``unverified``.
    """
    specs = topic_specs(settings)
    report = CheckReport()
    admin = admin if admin is not None else _admin_for(settings, timeout_s)
    await _started(admin, settings, timeout_s)
    try:
        present = set(await admin.list_topics())
        here = [s for s in specs if s.name in present]
        for s in specs:
            if s.name not in present:
                report.mismatches.append(f"{s.name}: missing (run `channel-health topics ensure`)")
        described = {d["topic"]: d for d in await admin.describe_topics([s.name for s in here])} if here else {}
        configs = await _described_configs(admin, here, report.notes)
    finally:
        await _close(admin)
    for s in here:
        before = len(report.mismatches)
        parts = described.get(s.name, {}).get("partitions") or []
        if len(parts) != s.partitions:
            report.mismatches.append(f"{s.name}: {len(parts)} partitions, configured {s.partitions}")
        rf = min((len(p.get("replicas") or []) for p in parts), default=0)
        if parts and rf != s.replication_factor:
            report.mismatches.append(f"{s.name}: replication factor {rf}, configured {s.replication_factor}")
        have = configs.get(s.name, {})
        for key, want in s.configs.items():
            if key not in have:
                report.unverified.append(f"{s.name}: {key} (wanted {want})")
            elif not _same(key, want, have[key]):
                report.mismatches.append(f"{s.name}: {key}={have[key]}, configured {want}")
        if len(report.mismatches) == before:
            report.ok.append(s.name)
    return report


async def _described_configs(admin: Any, specs: list[TopicSpec], notes: list[str]) -> dict[str, dict[str, str]]:
    """``{topic: {config: value}}`` as DescribeConfigs reports them; why a topic has none goes to ``notes``."""
    if not specs:
        return {}
    resources = [ConfigResource(ConfigResourceType.TOPIC, s.name) for s in specs]
    try:
        responses = await admin.describe_configs(resources)
    except Exception as exc:  # a broker without DescribeConfigs: every config is then "unverified"
        notes.append(f"DescribeConfigs failed: {type(exc).__name__}: {exc}")
        return {}
    out: dict[str, dict[str, str]] = {}
    for response in responses:
        for resource in response.resources:
            error_code, message, name, entries = resource[0], resource[1], resource[3], resource[4]
            if error_code == 0:
                out[name] = {e[0]: e[1] for e in entries if e[1] is not None}
            else:
                notes.append(f"{name}: DescribeConfigs error {error_code}: {message}")
    return out
