"""Frozen runtime settings; the only module that reads the environment.

Variables (SPEC §7):

``CHANNEL_HEALTH_KAFKA_BOOTSTRAP``
    ``host:port[,host:port]``. Unset with ``demo``: start the embedded broker.
``CHANNEL_HEALTH_CLICKHOUSE_URL``
    ``http(s)://user@host:8123/db`` or ``chdb:///path/to/dir``.
    Default ``chdb://./data/chdb``.
``CHANNEL_HEALTH_TOPIC_PREFIX``
    Prepended to every topic name (default empty).
``CHANNEL_HEALTH_KAFKA_SECURITY_PROTOCOL``
    ``PLAINTEXT`` (default), ``SSL``, ``SASL_PLAINTEXT`` or ``SASL_SSL``.
``CHANNEL_HEALTH_KAFKA_SASL_MECHANISM`` / ``..._SASL_USERNAME``
    SASL mechanism (``PLAIN``, ``SCRAM-SHA-256``, ``SCRAM-SHA-512``) and user.
``CHANNEL_HEALTH_KAFKA_SASL_PASSWORD`` or ``..._SASL_PASSWORD_FILE``
    The SASL password, or a file holding it (secret files win).
``CHANNEL_HEALTH_CLICKHOUSE_PASSWORD`` or ``..._PASSWORD_FILE``
    ClickHouse password, if not in the URL.
``CHANNEL_HEALTH_CONSUMER_GROUP``
    Kafka consumer group of the workers (default ``channel-health``).
``CHANNEL_HEALTH_SINK_MAX_ROWS`` / ``CHANNEL_HEALTH_SINK_MAX_BYTES``
    Bounds of the worker's ClickHouse buffer, per table (default 100 000 rows
    / 64 MiB). While ClickHouse is down the worker keeps publishing verdicts
    until a buffer is full, then stops taking input until it drains.
``CHANNEL_HEALTH_PRODUCER_MAX_REQUEST_BYTES``
    Largest produce request of the worker's Kafka producer (bytes, default
    1 000 000 as faust's ``producer_max_request_size``; at least 65 536). Dead
    letters are cut to fit well under it
    (:func:`pipeline.ingest.dead_letter.raw_budget`).
``CHANNEL_HEALTH_SINK_PROCESS``
    ``on`` (default): the worker writes ClickHouse from a child process
    (:mod:`pipeline.sinks.process`), so inserts and an embedded chDB stay
    out of the detection process; ``off``: in-process.
``CHANNEL_HEALTH_QUERY_MAX_EXECUTION_TIME_S`` / ``..._QUERY_MAX_MEMORY_BYTES`` / ``..._QUERY_MAX_RESULT_ROWS``
/ ``..._QUERY_MAX_RESULT_BYTES``
    Limits of ``channel-health query`` (:class:`QueryLimits`; default 30 s,
    2 GiB, 100 000 rows, 64 MiB of result), enforced by ClickHouse (the
    result bytes also by the client, :mod:`pipeline.storage.result_limit`).
``CHANNEL_HEALTH_PARTITIONS`` / ``..._REPLICATION_FACTOR`` / ``..._MIN_INSYNC_REPLICAS``
    Partitions (default 4), replication factor (default 1, the embedded
    broker) and ``min.insync.replicas`` (default 1, at most the replication
    factor) of the topics ``channel-health topics ensure`` creates (SPEC §8;
    production: RF 3, min.insync 2).
``CHANNEL_HEALTH_DLQ_RETENTION``
    ``retention.ms`` of ``gateway.requests.dlq``, a duration (default ``30d``).
``CHANNEL_HEALTH_MAX_EVENT_AGE``
    Oldest accepted event, a duration (default ``7d``): older events are
    dead-lettered as ``ts_too_old``. Measured from the wall clock, or with
    ``CHANNEL_HEALTH_CLOCK=event`` from the worker's own event clock.
``CHANNEL_HEALTH_CLOCK``
    ``wall`` (default) or ``event``: replay mode (``worker --replay``), where
    the age bound runs from the newest event time the worker has accepted, so
    data from a year ago is processed on its own clock (SPEC §7).
``CHANNEL_HEALTH_MAX_CLOCK_SKEW``
    How far event time may run ahead of the clock, a duration (default ``5s``,
    at most ``1h``): an event stamped later than the wall clock (replay: the
    replay's own clock) plus this is kept with its own ``ts_ms`` and counted as
    ahead of the clock, but moves no other channel's evaluation clock (SPEC §8).
``CHANNEL_HEALTH_MAX_CHANNELS``
    Channels one worker holds in memory (default 20 000). A new channel over it
    evicts the least-recently-seen channels idle for ``CHANNEL_HEALTH_EVICT_HORIZON_S``
    (default 300) to snapshots; only when none is, or when
    ``CHANNEL_HEALTH_MAX_HELD_CHANNELS`` (default 3 × the first) channels are held
    with the evicted ones, its events are dead-lettered ``too_many_channels``
    (:class:`StateLimits`).
``CHANNEL_HEALTH_EVICT_IDLE_S``
    Event-time seconds without events after which a channel's windows leave
    memory, kept as a compressed snapshot until it returns (default 3600).
``CHANNEL_HEALTH_DEDUP_HORIZON_S`` / ``CHANNEL_HEALTH_DEDUP_MAX_IDS``
    The ``event_id`` dedup horizon: event-time seconds (default 600) and ids
    held (default 500 000); see :class:`StateLimits` and docs/RELIABILITY.md.
``CHANNEL_HEALTH_CONTROL_KEYS``
    Keys that sign and verify ``channel.control`` records (HMAC-SHA256, SPEC §8;
    set in production): ``keyid:secret[,keyid:secret...]``, or the path of a
    file holding such entries (commas or newlines between them). Key ids are
    1-64 of ``A-Z a-z 0-9 . _ -``, one per operator; secrets at least 16
    characters. With keys, unsigned or badly signed records are refused;
    unset: records are accepted unsigned (logged once). :class:`ControlSettings`.
``CHANNEL_HEALTH_OVERRIDE_MAX_TTL`` / ``CHANNEL_HEALTH_MAX_OVERRIDES``
    Longest override, a duration (default ``24h``; a record expiring later is
    refused), and most overrides in force at once (default 1000; 1..100 000).
``CHANNEL_HEALTH_METRICS_HOST``
    Address the Prometheus endpoint of ``CHANNEL_HEALTH_METRICS_PORT`` listens
    on: an IP address or a host name (default ``127.0.0.1``, loopback only;
    SPEC §8); ``0.0.0.0`` serves every interface (:class:`MetricsSettings`).
``CHANNEL_HEALTH_FAULT_SINK_DOWN_FILE``
    Test hook (fault injection), unset in production: while the named file
    exists, every ClickHouse insert of the worker fails as if the server were
    unreachable (:class:`pipeline.sinks.faults.OutageSwitchClient`).

The stream layer's timings (snapshot interval, flush interval and backoff, drain
timeout, idle advance, capture slices) are :class:`StreamTunables` (``Settings.stream``),
set in code with no variables; their defaults are documented there.

Secrets are held as :class:`~pipeline.redaction.Secret`, whose ``repr`` and ``str`` never show
the value, so a logged settings object leaks nothing (``Settings`` shows the
ClickHouse URL with its password redacted). Every secret value read here
(``Secret`` values and a password given inside the ClickHouse URL) is also
registered for log redaction (:func:`~pipeline.redaction.register_secret`): from then on every log
record of the process, of any library, has those values replaced by ``***``
(aiokafka, for one, logs the SASL/PLAIN authentication request, password
included, at DEBUG level), and :func:`~pipeline.redaction.redact_secrets` scrubs text printed
outside logging.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

from pipeline.redaction import Secret, redact_url, register_url_password

ENV_PREFIX = "CHANNEL_HEALTH_"


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names the variable."""


@dataclass(frozen=True)
class Topics:
    """Kafka topic names (SPEC §7), with the configured prefix applied."""

    requests: str
    health: str
    dlq: str
    quality: str
    state: str
    #: Manual overrides (SPEC §7 ``override``), compacted (SPEC §8).
    control: str

    @classmethod
    def with_prefix(cls, prefix: str) -> "Topics":
        """Build topic names ``<prefix>gateway.requests`` etc."""
        return cls(
            requests=f"{prefix}gateway.requests",
            health=f"{prefix}channel.health",
            dlq=f"{prefix}gateway.requests.dlq",
            quality=f"{prefix}channel.quality_scores",
            state=f"{prefix}channel-health.state",
            control=f"{prefix}channel.control",
        )


@dataclass(frozen=True)
class KafkaSecurity:
    """Kafka client security settings (SASL/SSL); defaults to plaintext."""

    protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = None
    ssl_cafile: str | None = None

    def aiokafka_kwargs(self) -> dict[str, object]:
        """Keyword arguments for aiokafka producers/consumers."""
        kwargs: dict[str, object] = {"security_protocol": self.protocol}
        if self.protocol.startswith("SASL"):
            kwargs["sasl_mechanism"] = self.sasl_mechanism or "PLAIN"
            kwargs["sasl_plain_username"] = self.sasl_username
            kwargs["sasl_plain_password"] = self.sasl_password.reveal() if self.sasl_password else None
        if self.protocol.endswith("SSL"):
            import ssl

            kwargs["ssl_context"] = ssl.create_default_context(cafile=self.ssl_cafile)
        return kwargs


@dataclass(frozen=True)
class QueryLimits:
    """Limits ClickHouse enforces on an analyst's query (``channel-health query``, SPEC §8).

    ``max_execution_time_s``: wall time, seconds, > 0 (ClickHouse setting
    ``max_execution_time``). ``max_memory_bytes``: memory of one query,
    bytes, >= 1 MiB (``max_memory_usage``). ``max_result_rows``: rows of the
    result, >= 1 (``max_result_rows`` with ``result_overflow_mode='throw'``:
    a larger result is an error, never silently cut). ``max_result_bytes``:
    bytes of the result, >= 1 (``max_result_bytes``, same mode; also counted
    by the client as rows arrive, since ClickHouse counts a constant column
    once). Defaults: 30 s, 2 GiB, 100 000 rows, 64 MiB (issue #16: an
    interactive question must end, and must not take the machine's memory;
    100 000 rows is more than a terminal table is read for; issue #30: a
    500 MB result took the CLI to 2.8 GB). Raises :class:`ConfigError`
    outside the ranges.
    """

    max_execution_time_s: float = 30.0
    max_memory_bytes: int = 2 * 1024**3
    max_result_rows: int = 100_000
    max_result_bytes: int = 64 * 1024**2

    def __post_init__(self) -> None:
        if not 0 < self.max_execution_time_s < float("inf"):
            raise ConfigError(f"query max_execution_time_s must be finite and > 0, got {self.max_execution_time_s!r}")
        if self.max_memory_bytes < 1024**2:
            raise ConfigError(f"query max_memory_bytes must be >= 1 MiB, got {self.max_memory_bytes!r}")
        if self.max_result_rows < 1:
            raise ConfigError(f"query max_result_rows must be >= 1, got {self.max_result_rows!r}")
        if self.max_result_bytes < 1:
            raise ConfigError(f"query max_result_bytes must be >= 1, got {self.max_result_bytes!r}")


@dataclass(frozen=True)
class StateLimits:
    """Bounds of one worker's per-channel state and of its ``event_id`` dedup (SPEC §8).

    ``max_channels`` >= 1: channels with their windows in memory (resident). A new
    channel beyond it first makes room: the least-recently-seen resident channels
    without events for ``evict_horizon_ms`` (event time) are evicted; only when every
    resident channel had events within it is the new one refused (its events
    dead-lettered ``too_many_channels``). ``evict_horizon_ms`` >= 0, default 5 min
    = SPEC §4's ``no_data`` delay: a channel quiet that long is already reported
    ``no_data``, so parking it changes only its heartbeats, while one with events
    within it is being judged and would come straight back (issue #34 part 2).
    ``max_held_channels`` >= ``max_channels`` (None: 3 × ``max_channels``): channels
    held in all, resident or evicted; a new channel beyond it is refused too. It
    bounds the evicted snapshots a flood of names leaves (≈ 7 KB each with one
    event, docs/RELIABILITY.md: 40,000 evicted ≈ 290 MB at the default).
    ``evict_idle_ms`` >= 0: a channel without events for this long (event
    time) is evicted: its windows leave memory, its state is kept as a
    compressed snapshot and restored on its next event (0: never evict).
    ``dedup_horizon_ms`` > 0 and ``dedup_max_ids`` >= 2: an ``event_id`` seen
    again is dropped while its first copy is within the last
    ``dedup_horizon_ms / 2`` of event time and the last ``dedup_max_ids / 2``
    distinct ids (two generations, :class:`pipeline.ingest.dedup.EventIdDedup`);
    memory ≈ 95 bytes per id held (≈ 48 MB at the default).

    Defaults: 20 000 channels, 1 h idle, 10 min / 500 000 ids. Window memory
    per channel (in-process RSS, docs/RELIABILITY.md): ≈ 16 KB with one
    event, ≈ 54 KB busy with a 24 h baseline, ≈ 7-12 KB once evicted; size
    ``max_channels`` to the worker's memory (20 000 busy channels ≈ 1.1 GB).
    Raises ``ValueError`` for values outside these ranges.
    """

    max_channels: int = 20_000
    evict_idle_ms: int = 3_600_000
    dedup_horizon_ms: int = 600_000
    dedup_max_ids: int = 500_000
    evict_horizon_ms: int = 300_000
    max_held_channels: int | None = None

    def __post_init__(self) -> None:
        if self.max_channels < 1 or self.evict_idle_ms < 0 or self.dedup_horizon_ms <= 0 or self.dedup_max_ids < 2:
            raise ValueError(f"invalid state limits: {self!r}")
        if self.evict_horizon_ms < 0 or (self.max_held_channels is not None
                                         and self.max_held_channels < self.max_channels):
            raise ValueError(f"invalid state limits (evict_horizon_ms >= 0, max_held_channels >= max_channels): "
                             f"{self!r}")

    @property
    def held_limit(self) -> int:
        """Channels held in all, resident or evicted: ``max_held_channels``, or 3 × ``max_channels``."""
        return self.max_held_channels if self.max_held_channels is not None else 3 * self.max_channels


@dataclass(frozen=True)
class StreamTunables:
    """Timings of the worker's stream layer (:mod:`pipeline.stream`): the checkpoint cadence, the sink's
    background writes and the idle clock. No environment variables: these are set in code (tests, the
    bench); the defaults are the measured ones cited below.

    ``flush_interval_s`` > 0: buffered rows are written to ClickHouse about this often (s; sooner once a
    buffer is a quarter full, or when a backlog is consumed to its end; a live trickle waits for the interval). ``flush_backoff_min_s`` / ``flush_backoff_max_s`` (0 < min <= max): retry
    delay of a failing write (s), doubling from min to max. ``snapshot_interval_s`` > 0: how often channel
    state is captured, published and the input acked (s; also the status log's period).
    ``capture_slice_channels`` >= 1: channels copied per turn of the processor's lock (at ~0.1-0.5 ms
    per channel on the bench workload a slice holds the event loop ~10-50 ms, below one evaluation
    round; issue #15). ``refresh_every_captures`` >= 1: every channel's record is re-published at least
    every this many captures, changed or not (60 × 5 s = 5 min: a restore never depends on older
    records, and a state topic without compaction keeps recent records of every channel; cost 1/60 of
    the channels per capture). ``drain_timeout_s`` > 0: longest graceful drain on shutdown (s), within
    the worker's stop limit (``runtime.STOP_LIMIT_S``, 8 s). ``idle_advance_after_s`` > 0: wall-clock
    time without input after which event time advances on its own (s); ``idle_step_ms`` >= 1: event
    time added per idle round (ms, also the idle timer's interval). ``max_unacked_messages`` >= 1:
    processed but unacked input messages above which the agent waits for acks.
    Raises ``ValueError`` for values outside these ranges.
    """

    flush_interval_s: float = 1.0
    flush_backoff_min_s: float = 0.5
    flush_backoff_max_s: float = 2.0
    snapshot_interval_s: float = 5.0
    capture_slice_channels: int = 100
    refresh_every_captures: int = 60
    drain_timeout_s: float = 5.0
    idle_advance_after_s: float = 10.0
    idle_step_ms: int = 5_000
    max_unacked_messages: int = 100_000

    def __post_init__(self) -> None:
        if (self.flush_interval_s <= 0 or not 0 < self.flush_backoff_min_s <= self.flush_backoff_max_s
                or self.snapshot_interval_s <= 0 or self.capture_slice_channels < 1
                or self.refresh_every_captures < 1 or self.drain_timeout_s <= 0 or self.idle_advance_after_s <= 0
                or self.idle_step_ms < 1 or self.max_unacked_messages < 1):
            raise ValueError(f"invalid stream tunables: {self!r}")


@dataclass(frozen=True)
class MetricsSettings:
    """Prometheus ``/metrics`` of the long-running processes (worker, alert, watch; issue #21).

    ``port``: TCP port of the HTTP endpoint, 1..65535, None = no endpoint
    (``CHANNEL_HEALTH_METRICS_PORT`` unset). ``max_channels``: most channels
    with their own per-channel series (state, weight), >= 1 (default 500:
    two gauges x 6 states per channel keep a scrape under ~4,000 series);
    channels beyond it are not exported and counted in
    ``channel_health_metrics_dropped_channels_total``
    (``CHANNEL_HEALTH_METRICS_MAX_CHANNELS``). ``host``: the address it
    listens on, an IP address or a host name (``CHANNEL_HEALTH_METRICS_HOST``,
    default ``127.0.0.1``: loopback, SPEC §8). Raises :class:`ConfigError`
    outside the ranges or for a host that is neither.
    """

    port: int | None = None
    max_channels: int = 500
    host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if self.port is not None and not 1 <= self.port <= 65535:
            raise ConfigError(f"metrics port must be 1..65535, got {self.port!r}")
        if self.max_channels < 1:
            raise ConfigError(f"metrics max_channels must be >= 1, got {self.max_channels!r}")
        if not _is_host(self.host):
            raise ConfigError(f"{ENV_PREFIX}METRICS_HOST must be an IP address or a host name, got {self.host!r}")


#: One label of a host name (RFC 1123): letters, digits, inner hyphens, 1..63 characters.
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def _is_host(text: str) -> bool:
    """True for an IP address (v4 or v6, no brackets) or an RFC 1123 host name of at most 253 characters
    whose last label is not all digits (``300.1.1.1`` is a bad address, not a name)."""
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        pass
    labels = text[:-1].split(".") if text.endswith(".") else text.split(".")
    return (0 < len(text) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)
            and not labels[-1].isdigit())


#: A ``channel.control`` key id (names the operator in the audit).
CONTROL_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
#: Shortest accepted HMAC secret of ``CHANNEL_HEALTH_CONTROL_KEYS`` (characters).
MIN_CONTROL_SECRET_CHARS = 16


@dataclass(frozen=True)
class ControlSettings:
    """Authentication and bounds of ``channel.control`` records (SPEC §8; issue #30 items 2 and 4).

    ``keys``: ``(key id, secret)`` pairs that sign and verify records (HMAC-SHA256,
    :mod:`pipeline.stream.control`); empty: records are unsigned (accepted, logged
    once). ``max_ttl_ms``: longest override, ms, 1..365 d (default 24 h): a record
    whose ``expires_ts_ms`` lies further from its ``set_ts_ms`` or from the wall
    clock is refused. ``max_overrides``: most overrides in force at once,
    1..100 000 (default 1000): a record for a new key beyond it is refused.
    Raises :class:`ConfigError` outside these ranges.
    """

    keys: tuple[tuple[str, Secret], ...] = ()
    max_ttl_ms: int = 86_400_000
    max_overrides: int = 1000

    def __post_init__(self) -> None:
        if not 1 <= self.max_ttl_ms <= 365 * 86_400_000:
            raise ConfigError(f"{ENV_PREFIX}OVERRIDE_MAX_TTL must be at most 365d, got {self.max_ttl_ms} ms")
        if not 1 <= self.max_overrides <= 100_000:
            raise ConfigError(f"{ENV_PREFIX}MAX_OVERRIDES must be 1..100000, got {self.max_overrides!r}")

    def secret(self, key_id: str) -> bytes | None:
        """The secret of ``key_id`` as UTF-8 bytes; None for an unknown key id."""
        for kid, secret in self.keys:
            if kid == key_id:
                return secret.reveal().encode()
        return None


@dataclass(frozen=True)
class Settings:
    """All runtime settings, read once by :func:`load_settings`."""

    kafka_bootstrap: str | None
    clickhouse_url: str
    topic_prefix: str = ""
    consumer_group: str = "channel-health"
    kafka_security: KafkaSecurity = KafkaSecurity()
    clickhouse_password: Secret | None = None
    partitions: int = 4
    sink_max_rows: int = 100_000
    sink_max_bytes: int = 64 * 1024 * 1024
    #: Largest produce request of the worker's producer (bytes; faust/aiokafka ``max_request_size``).
    producer_max_request_bytes: int = 1_000_000
    #: Test hook: while this file exists, ClickHouse inserts fail (see module doc).
    fault_sink_down_file: str | None = None
    #: Write ClickHouse from a child process (:mod:`pipeline.sinks.process`); False: in the worker's process.
    sink_process: bool = True
    #: Limits of analysts' queries (``channel-health query``).
    query_limits: QueryLimits = QueryLimits()
    #: Replication factor and ``min.insync.replicas`` of the topics (SPEC §8); 1 for the embedded broker.
    replication_factor: int = 1
    min_insync_replicas: int = 1
    #: ``retention.ms`` of the dead-letter topic.
    dlq_retention_ms: int = 30 * 86_400_000
    #: Oldest accepted event (ms behind the clock below); older: ``ts_too_old``.
    max_event_age_ms: int = 7 * 86_400_000
    #: ``"wall"``: the age bound runs from the wall clock; ``"event"`` (replay): from the newest accepted event.
    clock: str = "wall"
    #: How far event time may run ahead of the clock above (ms, 1 .. 3 600 000; ``CHANNEL_HEALTH_MAX_CLOCK_SKEW``).
    max_clock_skew_ms: int = 5_000
    #: Channel-state and dedup bounds (``CHANNEL_HEALTH_MAX_CHANNELS`` etc.).
    state_limits: StateLimits = StateLimits()
    #: Prometheus endpoint (``CHANNEL_HEALTH_METRICS_PORT``, ``_MAX_CHANNELS``, ``_HOST``); off by default.
    metrics: MetricsSettings = MetricsSettings()
    #: ``channel.control`` keys and bounds (``CHANNEL_HEALTH_CONTROL_KEYS`` etc.).
    control: ControlSettings = ControlSettings()
    #: Timings of the stream layer (checkpoint cadence, sink writes, idle clock); set in code, no variables.
    stream: StreamTunables = StreamTunables()

    @property
    def topics(self) -> Topics:
        """Topic names with the prefix applied."""
        return Topics.with_prefix(self.topic_prefix)

    def __repr__(self) -> str:
        # The generated repr would print ``clickhouse_url`` as given, password
        # included (``https://bob:hunter2@...``); show it redacted instead.
        from dataclasses import fields

        shown = ", ".join(
            f"{f.name}={(redact_url(self.clickhouse_url) if f.name == 'clickhouse_url' else getattr(self, f.name))!r}"
            for f in fields(self) if f.repr
        )
        return f"{type(self).__name__}({shown})"

    @property
    def clickhouse_url_redacted(self) -> str:
        """The ClickHouse URL with any password replaced by ``***`` (for logs)."""
        return redact_url(self.clickhouse_url)

    def with_overrides(self, **changes: Any) -> "Settings":
        """A copy with some fields replaced (e.g. the embedded broker address)."""
        from dataclasses import replace

        return replace(self, **changes)


def _read_secret(env: Mapping[str, str], name: str) -> Secret | None:
    file_var = f"{ENV_PREFIX}{name}_FILE"
    if env.get(file_var):
        path = Path(env[file_var])
        try:
            return Secret(path.read_text().strip())
        except OSError as exc:
            raise ConfigError(f"{file_var}: cannot read secret file {path}: {exc.strerror}") from None
    value = env.get(f"{ENV_PREFIX}{name}")
    return Secret(value) if value else None


_DURATION_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def parse_duration_ms(text: str, name: str = "duration") -> int:
    """Milliseconds of a duration: ``<number>[unit]``, unit ``ms``, ``s``, ``m``, ``h``, ``d`` or ``w``; a bare number is seconds.

    ``name`` is used in the error message (the variable or flag). Raises
    :class:`ConfigError` for anything else, or a value that is not > 0.

    >>> parse_duration_ms("7d"), parse_duration_ms("36h"), parse_duration_ms("90m"), parse_duration_ms("1.5")
    (604800000, 129600000, 5400000, 1500)
    """
    import re

    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*(ms|s|m|h|d|w)?\s*", text or "", re.IGNORECASE)
    value = int(float(m.group(1)) * _DURATION_UNITS_MS[(m.group(2) or "s").lower()]) if m else 0
    if value <= 0:
        raise ConfigError(f"{name} must be a positive duration such as 7d, 36h, 90m, 30s or 3600 (seconds), "
                          f"got {text!r}")
    return value


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(f"{ENV_PREFIX}{name}")
    if raw is None:
        return default
    try:
        value = int(raw)
        if value < 1:
            raise ValueError
    except ValueError:
        raise ConfigError(f"{ENV_PREFIX}{name} must be a positive integer, got {raw!r}") from None
    return value


def _topic_and_time_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """The topic (SPEC §8) and event-time (SPEC §7) settings of :class:`Settings`, validated."""
    rf = _positive_int(env, "REPLICATION_FACTOR", 1)
    insync = _positive_int(env, "MIN_INSYNC_REPLICAS", 1)
    if insync > rf:
        raise ConfigError(f"{ENV_PREFIX}MIN_INSYNC_REPLICAS ({insync}) must not exceed "
                          f"{ENV_PREFIX}REPLICATION_FACTOR ({rf}): no write could ever be acknowledged")
    clock = env.get(f"{ENV_PREFIX}CLOCK", "wall").strip().lower()
    if clock not in {"wall", "event"}:
        raise ConfigError(f"{ENV_PREFIX}CLOCK must be 'wall' or 'event', got {clock!r}")
    return dict(
        replication_factor=rf,
        min_insync_replicas=insync,
        dlq_retention_ms=parse_duration_ms(env.get(f"{ENV_PREFIX}DLQ_RETENTION", "30d"), f"{ENV_PREFIX}DLQ_RETENTION"),
        max_event_age_ms=parse_duration_ms(env.get(f"{ENV_PREFIX}MAX_EVENT_AGE", "7d"), f"{ENV_PREFIX}MAX_EVENT_AGE"),
        clock=clock,
        max_clock_skew_ms=_clock_skew_ms(env),
    )


def _clock_skew_ms(env: Mapping[str, str]) -> int:
    """``CHANNEL_HEALTH_MAX_CLOCK_SKEW`` in ms (default 5 s); ConfigError unless a duration in (0, 1 h]."""
    name = f"{ENV_PREFIX}MAX_CLOCK_SKEW"
    skew = parse_duration_ms(env.get(name, "5s"), name)
    if skew > 3_600_000:
        raise ConfigError(f"{name} must be at most 1h (the decoder's future bound), got {env.get(name)!r}")
    return skew

#: Smallest producer request limit accepted: a dead letter without its copy of the input needs ~18 KB at worst.
MIN_PRODUCER_REQUEST_BYTES = 65_536

#: Accepted spellings of an on/off setting.
_SWITCH = {"on": True, "1": True, "true": True, "yes": True, "off": False, "0": False, "false": False, "no": False}


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Read :class:`Settings` from ``env`` (default ``os.environ``).

    Raises :class:`ConfigError` for a malformed value (never falls back to a
    default silently).
    """
    env = os.environ if env is None else env
    url = env.get(f"{ENV_PREFIX}CLICKHOUSE_URL", "chdb://./data/chdb")
    register_url_password(url)
    scheme = urlsplit(url).scheme
    if scheme not in {"chdb", "http", "https"}:
        raise ConfigError(
            f"{ENV_PREFIX}CLICKHOUSE_URL must start with chdb://, http:// or https://, got scheme {scheme!r}"
        )
    protocol = env.get(f"{ENV_PREFIX}KAFKA_SECURITY_PROTOCOL", "PLAINTEXT").upper()
    if protocol not in {"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"}:
        raise ConfigError(f"{ENV_PREFIX}KAFKA_SECURITY_PROTOCOL: unknown protocol {protocol!r}")
    partitions_raw = env.get(f"{ENV_PREFIX}PARTITIONS", "4")
    try:
        partitions = int(partitions_raw)
        if partitions < 1:
            raise ValueError
    except ValueError:
        raise ConfigError(f"{ENV_PREFIX}PARTITIONS must be a positive integer, got {partitions_raw!r}") from None
    bounds = {}
    for name in ("SINK_MAX_ROWS", "SINK_MAX_BYTES", "PRODUCER_MAX_REQUEST_BYTES"):
        raw = env.get(f"{ENV_PREFIX}{name}")
        if raw is None:
            continue
        try:
            bounds[name.lower()] = int(raw)
            if bounds[name.lower()] < 1:
                raise ValueError
        except ValueError:
            raise ConfigError(f"{ENV_PREFIX}{name} must be a positive integer, got {raw!r}") from None
    if bounds.get("producer_max_request_bytes", MIN_PRODUCER_REQUEST_BYTES) < MIN_PRODUCER_REQUEST_BYTES:
        raise ConfigError(f"{ENV_PREFIX}PRODUCER_MAX_REQUEST_BYTES must be at least {MIN_PRODUCER_REQUEST_BYTES} "
                          f"(room for a dead letter), got {bounds['producer_max_request_bytes']}")
    sink_process_raw = env.get(f"{ENV_PREFIX}SINK_PROCESS", "on").strip().lower()
    if sink_process_raw not in _SWITCH:
        raise ConfigError(f"{ENV_PREFIX}SINK_PROCESS must be one of {sorted(_SWITCH)}, got {sink_process_raw!r}")
    query_limits = _read_query_limits(env)
    limits = {}
    for name, field_name, scale, low in (("MAX_CHANNELS", "max_channels", 1, 1),
                                         ("EVICT_IDLE_S", "evict_idle_ms", 1000, 0),
                                         ("DEDUP_HORIZON_S", "dedup_horizon_ms", 1000, 1),
                                         ("DEDUP_MAX_IDS", "dedup_max_ids", 1, 2),
                                         ("EVICT_HORIZON_S", "evict_horizon_ms", 1000, 0),
                                         ("MAX_HELD_CHANNELS", "max_held_channels", 1, 1)):
        raw = env.get(f"{ENV_PREFIX}{name}")
        if raw is None:
            continue
        try:
            value = int(raw)
            if value < low:
                raise ValueError
        except ValueError:
            raise ConfigError(f"{ENV_PREFIX}{name} must be an integer >= {low}, got {raw!r}") from None
        limits[field_name] = value * scale
    held, resident = limits.get("max_held_channels"), limits.get("max_channels", StateLimits.max_channels)
    if held is not None and held < resident:
        raise ConfigError(f"{ENV_PREFIX}MAX_HELD_CHANNELS must be >= {ENV_PREFIX}MAX_CHANNELS ({resident}), "
                          f"got {held}")
    security = KafkaSecurity(
        protocol=protocol,
        sasl_mechanism=env.get(f"{ENV_PREFIX}KAFKA_SASL_MECHANISM"),
        sasl_username=env.get(f"{ENV_PREFIX}KAFKA_SASL_USERNAME"),
        sasl_password=_read_secret(env, "KAFKA_SASL_PASSWORD"),
        ssl_cafile=env.get(f"{ENV_PREFIX}KAFKA_SSL_CAFILE"),
    )
    return Settings(
        kafka_bootstrap=env.get(f"{ENV_PREFIX}KAFKA_BOOTSTRAP") or None,
        clickhouse_url=url,
        topic_prefix=env.get(f"{ENV_PREFIX}TOPIC_PREFIX", ""),
        consumer_group=env.get(f"{ENV_PREFIX}CONSUMER_GROUP", "channel-health"),
        kafka_security=security,
        clickhouse_password=_read_secret(env, "CLICKHOUSE_PASSWORD"),
        partitions=partitions,
        fault_sink_down_file=env.get(f"{ENV_PREFIX}FAULT_SINK_DOWN_FILE") or None,
        sink_process=_SWITCH[sink_process_raw],
        query_limits=query_limits,
        **_topic_and_time_settings(env),
        state_limits=StateLimits(**limits),
        metrics=_read_metrics_settings(env),
        control=_read_control_settings(env),
        **bounds,  # type: ignore[arg-type]
    )


def _read_metrics_settings(env: Mapping[str, str]) -> MetricsSettings:
    """:class:`MetricsSettings` from ``CHANNEL_HEALTH_METRICS_PORT`` / ``_METRICS_MAX_CHANNELS`` /
    ``_METRICS_HOST`` (unset or empty: the defaults); :class:`ConfigError` if malformed."""
    values: dict[str, Any] = {}
    host = env.get(f"{ENV_PREFIX}METRICS_HOST")
    if host is not None and host.strip() != "":
        values["host"] = host
    for name, field_name, low, high in (("METRICS_PORT", "port", 1, 65535),
                                        ("METRICS_MAX_CHANNELS", "max_channels", 1, 10**7)):
        raw = env.get(f"{ENV_PREFIX}{name}")
        if raw is None or raw.strip() == "":
            continue
        try:
            values[field_name] = int(raw)
            if not low <= values[field_name] <= high:
                raise ValueError
        except ValueError:
            raise ConfigError(f"{ENV_PREFIX}{name} must be an integer {low}..{high}, got {raw!r}") from None
    return MetricsSettings(**values)


def _read_query_limits(env: Mapping[str, str]) -> QueryLimits:
    """:class:`QueryLimits` from ``CHANNEL_HEALTH_QUERY_*`` (defaults for unset ones); ConfigError if malformed."""
    values: dict[str, Any] = {}
    for name, field_name, kind, least in (("QUERY_MAX_EXECUTION_TIME_S", "max_execution_time_s", float, 0.001),
                                          ("QUERY_MAX_MEMORY_BYTES", "max_memory_bytes", int, 1024**2),
                                          ("QUERY_MAX_RESULT_ROWS", "max_result_rows", int, 1),
                                          ("QUERY_MAX_RESULT_BYTES", "max_result_bytes", int, 1)):
        raw = env.get(f"{ENV_PREFIX}{name}")
        if raw is None:
            continue
        try:
            values[field_name] = kind(raw)
            if not least <= values[field_name] < float("inf"):
                raise ValueError
        except ValueError:
            what = "a number of seconds" if kind is float else "an integer"
            raise ConfigError(f"{ENV_PREFIX}{name} must be {what} >= {least}, got {raw!r}") from None
    return QueryLimits(**values)


def _read_control_settings(env: Mapping[str, str]) -> ControlSettings:
    """:class:`ControlSettings` from ``CHANNEL_HEALTH_CONTROL_KEYS``, ``_OVERRIDE_MAX_TTL``, ``_MAX_OVERRIDES``;
    :class:`ConfigError` naming the variable if malformed (never showing a secret)."""
    var = f"{ENV_PREFIX}CONTROL_KEYS"
    raw = (env.get(var) or "").strip()
    keys: list[tuple[str, Secret]] = []
    if raw:
        text = raw
        if Path(raw).is_file():
            try:
                text = Path(raw).read_text()
            except OSError as exc:
                raise ConfigError(f"{var}: cannot read key file {raw}: {exc.strerror}") from None
        for n, entry in enumerate((e.strip() for e in re.split(r"[,\n]", text) if e.strip()), start=1):
            kid, sep, secret = entry.partition(":")
            kid, secret = kid.strip(), secret.strip()
            if not sep or not CONTROL_KEY_ID.fullmatch(kid):
                raise ConfigError(f"{var}: entry {n} is not keyid:secret with a key id of 1-64 of "
                                  f"A-Z a-z 0-9 . _ - (nor is the value a readable file)")
            if len(secret) < MIN_CONTROL_SECRET_CHARS:
                raise ConfigError(f"{var}: the secret of key id {kid!r} is shorter than "
                                  f"{MIN_CONTROL_SECRET_CHARS} characters")
            if any(k == kid for k, _ in keys):
                raise ConfigError(f"{var}: key id {kid!r} is given twice")
            keys.append((kid, Secret(secret)))
        if not keys:
            raise ConfigError(f"{var} holds no keyid:secret entry")
    ttl_raw = env.get(f"{ENV_PREFIX}OVERRIDE_MAX_TTL")
    ttl_ms = 86_400_000 if ttl_raw is None else parse_duration_ms(ttl_raw, f"{ENV_PREFIX}OVERRIDE_MAX_TTL")
    return ControlSettings(keys=tuple(keys), max_ttl_ms=ttl_ms,
                           max_overrides=_positive_int(env, "MAX_OVERRIDES", 1000))
