"""Prometheus metrics of the long-running processes: worker, alert, watch (issue #21).

One :class:`PipelineMetrics` per process holds every metric object on its
own registry; :func:`start_metrics_server` serves it on
``CHANNEL_HEALTH_METRICS_PORT`` (``settings.metrics.port``; unset: no
endpoint, the objects still count) of ``CHANNEL_HEALTH_METRICS_HOST``
(default ``127.0.0.1``: loopback only). Names follow Prometheus conventions:
``channel_health_`` prefix, base units in the name (``_seconds``,
``_bytes``, ``_rows``, ``_messages``), counters end in ``_total``.

Counts the worker already keeps (events in, dead letters by reason, sink
backlog, quality queue) are read at scrape time through callbacks
(:meth:`PipelineMetrics.track`), so the counting code is not touched; what
exists only per batch (latencies, verdicts by state and reason, per-channel
gauges, sink writes) is observed where it happens.

Label cardinality is bounded: per-channel series exist for at most
``settings.metrics.max_channels`` channels (first seen first served); the
verdicts of further channels count in
``channel_health_metrics_dropped_channels_total`` instead. Verdict reasons
and states are small fixed vocabularies (SPEC §4); partitions are bounded by
the topic.

Usage from another process (e.g. ``watch``)::

    metrics = start_metrics_server(settings)      # PipelineMetrics; serves if the port is set
    metrics.observe_verdicts(verdicts, wall_now_s)
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger(__name__)

#: States a channel can be in (SPEC §4); the state gauge has one series per state, 1 for the current one.
STATES = ("healthy", "degraded", "open", "half_open", "recovering", "no_data")
#: Histogram buckets for batch processing and verdict latency, seconds (5 ms .. 60 s: a batch of the
#: worker takes milliseconds, a stalled publish tens of seconds).
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _Callbacks:
    """A collector that reads values at scrape time from registered callables (see :meth:`PipelineMetrics.track`)."""

    def __init__(self) -> None:
        self.counters: dict[str, tuple[str, tuple[str, ...], Callable[[], Any]]] = {}
        self.gauges: dict[str, tuple[str, tuple[str, ...], Callable[[], Any]]] = {}

    def describe(self):  # empty: metric names are known only once tracked (no duplicate check at register)
        return []

    def collect(self):
        for table, family in ((self.counters, CounterMetricFamily), (self.gauges, GaugeMetricFamily)):
            for name, (doc, labels, fn) in list(table.items()):
                metric = family(name, doc, labels=list(labels))  # declared even without samples
                try:
                    value = fn()
                except Exception as exc:  # a scrape must not fail on one source; say which one
                    log.warning("metric %s: reading it failed: %s", name, exc)
                    value = None
                items = [] if value is None else value.items() if isinstance(value, Mapping) else [((), value)]
                for key, v in items:
                    key = key if isinstance(key, tuple) else (key,)
                    metric.add_metric([str(k) for k in key], float(v))
                yield metric


class PipelineMetrics:
    """Every metric object of a process, on ``registry`` (default: a new private registry).

    ``max_channels``: most channels with per-channel series, >= 1 (see the
    module docstring). Worker metrics: ``channel_health_events_in_total``,
    ``_dead_letters_total{reason}``, ``_consumer_lag_messages{topic,partition}``,
    ``_batch_processing_seconds``, ``_verdict_latency_seconds``,
    ``_verdicts_total{state,reason}``, ``_channel_state{channel,state}``,
    ``_channel_weight{channel}``, ``_metrics_dropped_channels_total``, per route (issue #35)
    ``_route_channels{route,state}``, ``_route_weight_sum{route}``, ``_channel_route{channel,route}``,
    ``_channel_override{channel,route,kind}``,
    ``_sink_backlog_rows``, ``_sink_write_seconds``, ``_sink_rows_written_total``,
    ``_sink_write_failures_total``, ``_quality_scored_total``, ``_quality_queue_samples``;
    alert process: ``_alert_verdicts_total``, ``_alert_bad_messages_total`` (tracked by
    :func:`pipeline.alert.runner.run_alerts`), ``_alerts_sent_total{route,outcome}``.
    """

    def __init__(self, registry: CollectorRegistry | None = None, max_channels: int = 500) -> None:
        if max_channels < 1:
            raise ValueError(f"max_channels must be >= 1, got {max_channels!r}")
        self.registry = registry if registry is not None else CollectorRegistry()
        self.max_channels = max_channels
        r = self.registry
        self._callbacks = _Callbacks()
        r.register(self._callbacks)
        self.batch_processing_seconds = Histogram(
            "channel_health_batch_processing_seconds", "Wall time to decode a batch, run the engine and build "
            "its outputs.", buckets=LATENCY_BUCKETS_S, registry=r)
        self.verdict_latency_seconds = Histogram(
            "channel_health_verdict_latency_seconds", "Wall time from the start of a batch's processing to "
            "Kafka's acknowledgement of its verdicts.", buckets=LATENCY_BUCKETS_S, registry=r)
        self.verdicts_total = Counter("channel_health_verdicts", "Verdicts published, by state and reason "
                                      "(reason 'none' for a verdict without reasons).", ["state", "reason"],
                                      registry=r)
        self.channel_state = Gauge("channel_health_channel_state", "1 for the channel's current state, 0 for "
                                   "the others (bounded to max_channels channels).", ["channel", "state"], registry=r)
        self.channel_weight = Gauge("channel_health_channel_weight", "The channel's published weight 0..1 "
                                    "(bounded to max_channels channels).", ["channel"], registry=r)
        self.dropped_channels_total = Counter(
            "channel_health_metrics_dropped_channels", "Verdicts of channels beyond max_channels, not exported "
            "per channel.", registry=r)
        self.sink_write_seconds = Histogram("channel_health_sink_write_seconds", "Wall time of one ClickHouse "
                                            "flush that succeeded.", buckets=LATENCY_BUCKETS_S, registry=r)
        self.sink_rows_written_total = Counter("channel_health_sink_rows_written", "Rows written to ClickHouse.",
                                               registry=r)
        self.sink_write_failures_total = Counter("channel_health_sink_write_failures", "ClickHouse flushes that "
                                                 "failed (rows kept and retried).", registry=r)
        self.alerts_sent_total = Counter("channel_health_alerts_sent", "Alert messages by route and outcome "
                                         "(sent, failed).", ["route", "outcome"], registry=r)
        self._channels: set[str] = set()
        self._verdict_children: dict[tuple[str, str], Any] = {}  # (state, reason) -> verdicts_total child
        self._channel_children: dict[str, tuple] = {}  # channel -> ((state, state gauge child)..., weight child)
        #: channel -> (route, state, weight, override kind or "") of the newest verdict (bounded channels):
        #: the per-route and override series are read from it at scrape time (issue #35).
        self._latest: dict[str, tuple[str, str, float, str]] = {}
        self._track_routes()
        #: The HTTP server of :func:`start_metrics_server` (None: not served); :meth:`close` stops it.
        self.server: Any = None

    def _track_routes(self) -> None:
        """The per-route series and the override gauge (issue #35), computed from :attr:`_latest` per scrape."""
        latest = self._latest

        def route_channels() -> dict[tuple[str, str], int]:
            out = {(r, s): 0 for r, _, _, _ in latest.values() for s in STATES}
            for r, state, _, _ in latest.values():
                out[(r, state)] = out.get((r, state), 0) + 1
            return out

        def route_weight() -> dict[str, float]:
            out: dict[str, float] = {}
            for r, _, w, _ in latest.values():
                out[r] = out.get(r, 0.0) + w
            return out

        self.track("channel_health_route_channels", "Channels of each route by state (the newest verdict of "
                   "each; bounded to max_channels channels).", route_channels, labels=("route", "state"))
        self.track("channel_health_route_weight_sum", "Sum of the published weights of a route's channels: the "
                   "route's capacity in channel units (bounded to max_channels channels).", route_weight,
                   labels=("route",))
        self.track("channel_health_channel_route", "1 per channel with its route (join on channel for per-route "
                   "views of the channel series).", lambda: {(c, r): 1 for c, (r, _, _, _) in latest.items()},
                   labels=("channel", "route"))
        self.track("channel_health_channel_override", "1 while an operator's override is in force on the "
                   "channel (kind open, healthy, weight or freeze); no series otherwise.",
                   lambda: {(c, r, k): 1 for c, (r, _, _, k) in latest.items() if k},
                   labels=("channel", "route", "kind"))

    def close(self) -> None:
        """Stop the HTTP endpoint, if this object has one (the metrics keep counting)."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def track(self, name: str, doc: str, fn: Callable[[], Any], *, kind: str = "gauge",
              labels: Iterable[str] = ()) -> None:
        """Export ``fn()`` at every scrape as metric ``name`` (``kind`` ``"gauge"`` or ``"counter"``; a counter
        name must end in ``_total``).

        ``fn`` returns a number, None (no sample this scrape), or with
        ``labels`` a mapping ``{label value or tuple of values: number}``. A
        failing ``fn`` is logged and skipped for that scrape. Raises
        ``ValueError`` for an unknown kind or a counter name without ``_total``.
        """
        if kind == "counter":
            if not name.endswith("_total"):
                raise ValueError(f"counter {name!r} must end in _total")
            self._callbacks.counters[name[:-len("_total")]] = (doc, tuple(labels), fn)
        elif kind == "gauge":
            self._callbacks.gauges[name] = (doc, tuple(labels), fn)
        else:
            raise ValueError(f"kind must be 'gauge' or 'counter', got {kind!r}")

    def track_processor(self, get_processor: Callable[[], Any]) -> None:
        """Events in, refused snapshots and dead letters by reason from a
        :class:`~pipeline.engine.batch.BatchProcessor` (its ``events_in``, ``duplicates``,
        ``refused_snapshots``, ``ahead_of_clock``, ``refused_by_prefix`` and ``counters.by_reason``), read at
        scrape time."""
        self.track("channel_health_events_in_total", "Request events decoded (duplicates included).",
                   lambda: None if (p := get_processor()) is None else p.events_in, kind="counter")
        self.track("channel_health_duplicates_dropped_total", "Re-sent events dropped: their event_id was seen "
                   "within the dedup horizon (stored and counted once).",
                   lambda: None if (p := get_processor()) is None else p.duplicates, kind="counter")
        self.track("channel_health_snapshots_refused_total", "State-topic snapshots refused as breaking the "
                   "snapshot contract (the channel started fresh).",
                   lambda: None if (p := get_processor()) is None else p.refused_snapshots, kind="counter")
        self.track("channel_health_events_ahead_of_clock_total", "Events stamped further ahead of the evaluation "
                   "clock than CHANNEL_HEALTH_MAX_CLOCK_SKEW (stored; moved no other channel's rounds).",
                   lambda: None if (p := get_processor()) is None else p.ahead_of_clock, kind="counter")
        self.track("channel_health_channels_refused_events_total", "Events dead-lettered too_many_channels, by "
                   "channel-name prefix (at most 50 prefixes, then '(other)'): where a flood of names comes from.",
                   lambda: None if (p := get_processor()) is None else dict(p.refused_by_prefix.counts),
                   kind="counter", labels=("prefix",))
        self.track("channel_health_dead_letters_total", "Inputs sent to the dead-letter topic, by reason.",
                   lambda: None if (p := get_processor()) is None else dict(p.counters.by_reason),
                   kind="counter", labels=("reason",))

    def track_worker(self, get_processor: Callable[[], Any], get_lags: Callable[[], Mapping[tuple, int] | None],
                     get_sink: Callable[[], Any], get_quality: Callable[[], Any]) -> None:
        """The worker's scrape-time metrics: :meth:`track_processor`, consumer lag per ``(topic, partition)``
        (``get_lags``), the sink's ``pending_rows`` and the quality agent's ``counters["scored"]`` and
        ``queue`` (``get_sink()`` / ``get_quality()`` may return None: no sample)."""
        self.track_processor(get_processor)
        self.track("channel_health_consumer_lag_messages", "Messages between the last one processed and the "
                   "end of the partition (as of the last fetch).", get_lags, labels=("topic", "partition"))

        def backlog() -> int | None:
            sink = get_sink()
            return None if sink is None else sink.pending_rows

        def scored() -> int | None:
            q = get_quality()
            return None if q is None else q.counters["scored"]

        def queued() -> int | None:
            q = get_quality()
            return None if q is None else q.queue.qsize()

        self.track("channel_health_sink_backlog_rows", "Rows buffered for ClickHouse, not yet written.", backlog)
        self.track("channel_health_quality_scored_total", "Responses scored by the quality model.", scored,
                   kind="counter")
        self.track("channel_health_quality_queue_samples", "Sampled responses waiting to be scored.", queued)

    def track_control(self, get_refused: Callable[[], Mapping[str, int]]) -> None:
        """Control records refused by reason (``get_refused()``: the worker's
        :class:`~pipeline.stream.control_agent.ControlHook` ``refused``), read at scrape time."""
        self.track("channel_health_control_refused_total", "channel.control records refused (unsigned, bad "
                   "signature, over a bound, over the live-override cap), by reason.",
                   lambda: dict(get_refused()), kind="counter", labels=("reason",))

    def observe_batch(self, processing_s: float, verdict_latency_s: float | None, verdicts: Iterable[Any]) -> None:
        """One processed batch: its processing time, the latency of its verdicts (None: it had none), and
        the verdicts (each with ``channel``, ``state``, ``reasons``, ``weight``)."""
        self.batch_processing_seconds.observe(processing_s)
        verdicts = list(verdicts)
        if verdicts and verdict_latency_s is not None:
            self.verdict_latency_seconds.observe(verdict_latency_s)
        self.observe_verdicts(verdicts)

    def observe_verdicts(self, verdicts: Iterable[Any]) -> None:
        """Count verdicts by state and reason and set the per-channel state and weight gauges (bounded).

        The labelled children are looked up once per (state, reason) and per
        channel and kept (``labels()`` takes a lock and builds a key on every
        call; a round publishes a verdict for every channel).
        """
        counted = self._verdict_children
        gauges = self._channel_children
        for v in verdicts:
            state = v.state
            for reason in v.reasons or ("none",):
                child = counted.get((state, reason))
                if child is None:
                    child = counted[(state, reason)] = self.verdicts_total.labels(state, reason)
                child.inc()
            children = gauges.get(v.channel)
            if children is None:
                if v.channel not in self._channels:
                    if len(self._channels) >= self.max_channels:
                        self.dropped_channels_total.inc()
                        continue
                    self._channels.add(v.channel)
                children = gauges[v.channel] = (
                    tuple((s, self.channel_state.labels(v.channel, s)) for s in STATES),
                    self.channel_weight.labels(v.channel))
            for s, child in children[0]:
                child.set(1.0 if s == state else 0.0)
            children[1].set(v.weight)
            forced = getattr(v, "override", None)
            kind = forced.get("kind", "") if isinstance(forced, dict) else ""
            self._latest[v.channel] = (str(getattr(v, "route", "")), state, float(v.weight), str(kind))

    def observe_flush(self, seconds: float, rows: int | None) -> None:
        """One ClickHouse flush that succeeded: ``seconds`` of wall time, ``rows`` written (None: unknown)."""
        self.sink_write_seconds.observe(seconds)
        if rows:
            self.sink_rows_written_total.inc(rows)


def start_metrics_server(settings: Any, registry: CollectorRegistry | None = None) -> PipelineMetrics:
    """A :class:`PipelineMetrics` for this process, served over HTTP when ``settings.metrics.port`` is set.

    The endpoint listens on ``settings.metrics.host`` (default ``127.0.0.1``:
    loopback only, SPEC §8; ``CHANNEL_HEALTH_METRICS_HOST``) at that port
    (``/metrics``, the Prometheus text format) in a daemon thread, and logs
    the address it is bound to. Raises ``OSError`` when the address cannot
    be bound (port in use, no permission, a host name that does not resolve
    to a local address): a configured endpoint that cannot start is an error,
    not silently skipped.
    """
    from prometheus_client import start_http_server

    cfg = settings.metrics
    metrics = PipelineMetrics(registry, max_channels=cfg.max_channels)
    if cfg.port is not None:
        metrics.server, _thread = start_http_server(cfg.port, addr=cfg.host, registry=metrics.registry)
        host, port = metrics.server.socket.getsockname()[:2]
        log.info("metrics: http://%s:%d/metrics", f"[{host}]" if ":" in host else host, port)
    return metrics
