"""A LiteLLM callback that publishes one request event per upstream call (SPEC §3, §7; optional extra ``litellm``).

:class:`ChannelHealthLogger` is a ``litellm.integrations.custom_logger.CustomLogger``.
LiteLLM calls its success and failure hooks once per upstream call -- every
attempt of a ``litellm.Router``, retries and fallbacks included, each with its
own ``litellm_call_id`` -- from the async path (``async_log_success_event`` /
``async_log_failure_event``) or, for the sync SDK, the sync one
(``log_success_event`` / ``log_failure_event``). Each hook maps LiteLLM's
``standard_logging_object`` (``StandardLoggingPayload``, litellm/types/utils.py)
and the exception to one event dict (:func:`event_from_litellm`) and hands it
to a :class:`~pipeline.gateways.publisher.BackgroundPublisher`: an append to a
bounded buffer, so a gateway whose Kafka is down is never slowed and never
fails a request; what cannot be buffered is dropped and counted
(:attr:`ChannelHealthLogger.publisher`, Prometheus
``channel_health_gateway_events_total``).

Sources read (LiteLLM 1.110.2, github.com/BerriAI/litellm):
litellm/integrations/custom_logger.py (the hooks and their keyword names),
litellm/types/utils.py (``StandardLoggingPayload``: ``response_cost``,
``prompt_tokens``, ``completion_tokens``, ``startTime``, ``endTime``,
``completionStartTime``, ``stream``, ``model_group``, ``trace_id``),
litellm/litellm_core_utils/litellm_logging.py (one failure log per attempt:
``dispatch_attempt_failure_handlers``; the stream's success log after the last
chunk), litellm/litellm_core_utils/streaming_handler.py (``completion_start_time``
set at the first chunk; no per-chunk hook in the SDK), litellm/exceptions.py
(``status_code``, ``litellm_response_headers``, ``Timeout`` = 408),
litellm/proxy/types_utils/utils.py (``get_instance_fn``: ``callbacks:
module.instance`` in the proxy's config.yaml imports an installed module).

Field mapping (docs/CONNECTING.md has the table):

- ``channel``: ``channel_of(deployment)`` with the deployment rebuilt as
  ``{"model_name": model_group, "litellm_params": {"model": ...}, "model_info": ...}``;
  the default is the routing hook's (:func:`pipeline.router.litellm_hook.default_channel_of`):
  ``model_info["channel"]``, else ``litellm_params["model"]`` (e.g. ``openai/gpt-4o``),
  so the events and the verdicts the hook reads name the same channel;
- ``route``: ``model_info["route"]``, else the model group (``model_name``);
- ``account``: ``model_info["account"]``, else ``model_info["key_alias"]``, else
  ``litellm_params["litellm_credential_name"]``, else ``key-`` and the first 12 hex digits
  of the SHA-256 of the deployment's API key (never the key);
- ``tier``: ``model_info["tier"]`` when ``free`` or ``paid``;
- ``status``: ``ok`` on success; on failure ``timeout`` (LiteLLM ``Timeout`` / HTTP 408),
  ``rate_limited`` (429), ``filtered`` (``ContentPolicyViolationError``), else ``error``;
- ``http_status`` (200 on success, the exception's ``status_code``), ``error_type`` (the
  exception's class name), ``error_message`` (its message, cut to 512 characters),
  ``retry_after_s`` (the upstream's ``retry-after-ms`` / ``Retry-After`` header, seconds or an
  HTTP date, 0..86,400), ``error_class`` (SPEC §4.1, from ``classifier``; pass
  ``classifier=None`` to leave it to the worker's per-provider table);
- ``input_tokens`` / ``output_tokens`` / ``cost_usd``: ``prompt_tokens`` /
  ``completion_tokens`` / ``response_cost`` of the payload (LiteLLM's own cost, with the
  deployment's ``input_cost_per_token`` etc. when set);
- ``ts_ms`` / ``latency_ms``: ``endTime`` and ``endTime - startTime``; for a stream
  ``ttft_ms`` = ``completionStartTime - startTime`` and ``max_stream_gap_ms``, the longest
  pause between two chunks, where the chunks pass through this logger: on the proxy through
  ``async_post_call_streaming_iterator_hook``, in the SDK through :meth:`ChannelHealthLogger.timed`;
- ``event_id``: ``litellm:<litellm_call_id>`` (one per attempt: a repeated log of the
  same attempt is removed by the worker's dedup).

A call LiteLLM failed before choosing a deployment (no model_info, no deployment) is not an
upstream call and publishes nothing (counted in ``skipped``).
"""

from __future__ import annotations

import collections
import email.utils
import hashlib
import logging
import math
import threading
import time
import uuid
from typing import Any, AsyncIterator, Callable, Iterator, Mapping

try:
    from litellm.integrations.custom_logger import CustomLogger
except ImportError as exc:  # an optional extra: say which, instead of a bare "No module named litellm"
    raise ImportError("pipeline.gateways.litellm needs LiteLLM, an optional extra: "
                      "pip install 'channel-health[litellm]'") from exc

from pipeline.gateways.publisher import DEFAULT_MAX_BUFFER_EVENTS, BackgroundPublisher
from pipeline.ingest.error_class import MAX_MESSAGE_CHARS, Classifier, default_classifier, provider_of
from pipeline.router.litellm_hook import default_channel_of

__all__ = ["ChannelHealthLogger", "event_from_litellm", "retry_after_s_from_headers", "proxy_handler_instance"]

log = logging.getLogger("channel_health.gateway")

#: Most streams timed at once (entries of calls whose success log has not arrived yet).
MAX_TIMED_STREAMS = 10_000
_MAX_RETRY_AFTER_S = 86_400.0
_USE_DEFAULT: Any = object()


def retry_after_s_from_headers(headers: Any, now_s: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` (ms) or ``Retry-After`` (seconds or an HTTP date; RFC 9110 §10.2.3).

    ``headers``: any mapping with ``get`` (``httpx.Headers`` is case-insensitive; a plain dict is
    tried in lower and title case). Clamped to 0..86,400; None when absent or unreadable.

    >>> retry_after_s_from_headers({"retry-after": "7"}), retry_after_s_from_headers({"retry-after-ms": "1500"})
    (7.0, 1.5)
    >>> retry_after_s_from_headers({"Retry-After": "Thu, 01 Jan 1970 00:01:00 GMT"}, now_s=30.0)
    30.0
    """
    if headers is None or not hasattr(headers, "get"):
        return None

    def get(name: str) -> Any:
        return headers.get(name) or headers.get(name.title()) or headers.get(name.upper())

    value: float | None = None
    ms = get("retry-after-ms")
    if ms is not None:
        try:
            value = float(ms) / 1000
        except (TypeError, ValueError):
            value = None
    if value is None:
        raw = get("retry-after")
        if raw is None:
            return None
        try:
            value = float(raw)
        except (TypeError, ValueError):
            try:
                when = email.utils.parsedate_to_datetime(str(raw))
            except (TypeError, ValueError):
                return None
            value = when.timestamp() - (time.time() if now_s is None else now_s)
    if not math.isfinite(value):
        return None
    return min(max(value, 0.0), _MAX_RETRY_AFTER_S)


def _status_of(exc: BaseException | None, http_status: int | None) -> str:
    name = type(exc).__name__ if exc is not None else ""
    if name in ("Timeout", "APITimeoutError") or http_status == 408 or isinstance(exc, TimeoutError):
        return "timeout"
    if http_status == 429 or name == "RateLimitError":
        return "rate_limited"
    if name == "ContentPolicyViolationError":
        return "filtered"
    return "error"


def _num(value: Any) -> float | None:
    """``value`` as a finite float >= 0, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return v if math.isfinite(v) and v >= 0 else None


def _account(model_info: Mapping[str, Any], litellm_params: Mapping[str, Any]) -> str | None:
    for value in (model_info.get("account"), model_info.get("key_alias"),
                  litellm_params.get("litellm_credential_name")):
        if isinstance(value, str) and value.strip():
            return value.strip()[:512]
    key = litellm_params.get("api_key")
    if isinstance(key, str) and key:
        return "key-" + hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()[:12]
    return None


def event_from_litellm(kwargs: Mapping[str, Any], *, success: bool, gateway_id: str | None = None,
                       classifier: Classifier | None = None,
                       channel_of: Callable[[dict[str, Any]], str] = default_channel_of,
                       max_stream_gap_ms: float | None = None) -> dict[str, Any] | None:
    """One request event (SPEC §3 field names) from the ``kwargs`` LiteLLM passes to a logging hook.

    Mapping in the module docstring. Returns None when the call never reached a deployment
    (nothing to attribute). Never raises for a missing or odd field: it is left out.
    """
    slo = kwargs.get("standard_logging_object") or {}
    lp = kwargs.get("litellm_params") or {}
    metadata = lp.get("metadata") or kwargs.get("metadata") or {}
    model_info = metadata.get("model_info") or lp.get("model_info") or {}
    deployment_model = metadata.get("deployment")
    if not deployment_model:
        provider, model = kwargs.get("custom_llm_provider") or slo.get("custom_llm_provider"), kwargs.get("model")
        deployment_model = f"{provider}/{model}" if provider and model else model
    if not deployment_model and not model_info:
        return None
    group = slo.get("model_group") or metadata.get("model_group") or deployment_model
    channel = str(channel_of({"model_name": group, "litellm_params": {"model": deployment_model},
                              "model_info": model_info}))[:512]
    start_s, end_s = _num(slo.get("startTime")), _num(slo.get("endTime"))
    if end_s is None:
        end_s = time.time()
    if start_s is None or start_s > end_s:
        start_s = end_s
    event: dict[str, Any] = {
        "event_id": f"litellm:{kwargs.get('litellm_call_id') or slo.get('id') or uuid.uuid4()}"[:512],
        "ts_ms": int(end_s * 1000),
        "channel": channel or "unknown",
        "route": str(model_info.get("route") or group or channel)[:512],
        "latency_ms": round((end_s - start_s) * 1000, 3),
    }
    if gateway_id:
        event["gateway_id"] = gateway_id
    if isinstance(slo.get("trace_id"), str) and slo["trace_id"]:
        event["trace_id"] = slo["trace_id"]
    if model_info.get("tier") in ("free", "paid"):
        event["tier"] = model_info["tier"]
    account = _account(model_info, lp)
    if account:
        event["account"] = account
    if success:
        event["status"] = "ok"
        event["http_status"] = 200
        for field, key in (("input_tokens", "prompt_tokens"), ("output_tokens", "completion_tokens")):
            n = slo.get(key)
            if isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= 4_294_967_295:
                event[field] = n
        cost = _num(slo.get("response_cost"))
        if cost is not None:
            event["cost_usd"] = cost
        first = _num(slo.get("completionStartTime"))
        if slo.get("stream") and first is not None and start_s <= first <= end_s:
            event["ttft_ms"] = round((first - start_s) * 1000, 3)
            if max_stream_gap_ms is not None:
                event["max_stream_gap_ms"] = round(max_stream_gap_ms, 3)
        return event
    exc = kwargs.get("exception")
    code = getattr(exc, "status_code", None)
    http_status = code if isinstance(code, int) and not isinstance(code, bool) and 100 <= code <= 599 else None
    status = _status_of(exc, http_status)
    event["status"] = status
    if http_status is not None:
        event["http_status"] = http_status
    if exc is not None:
        event["error_type"] = type(exc).__name__
        message = getattr(exc, "message", None) or str(exc)
        event["error_message"] = str(message)[:MAX_MESSAGE_CHARS]
        headers = getattr(exc, "litellm_response_headers", None)
        if headers is None:
            headers = getattr(getattr(exc, "response", None), "headers", None)
        retry = retry_after_s_from_headers(headers)
        if retry is not None:
            event["retry_after_s"] = retry
    if classifier is not None:
        cls = classifier.classify(status, http_status, event.get("error_type"), event.get("error_message"),
                                  provider_of(channel))
        if cls is not None:
            event["error_class"] = cls
    return event



class _GapClock:
    """Longest pause between consecutive chunks of one stream (``gap_s``, seconds; None before the
    second chunk), on the monotonic clock: the sync and async stream wrappers share it."""

    __slots__ = ("last", "gap_s")

    def __init__(self) -> None:
        self.last: float | None = None
        self.gap_s: float | None = None

    def tick(self) -> None:
        now = time.monotonic()
        if self.last is not None:
            self.gap_s = max(self.gap_s or 0.0, now - self.last)
        self.last = now

class _StreamTimes:
    """Longest gap between chunks per ``litellm_call_id``, and success events waiting for it (bounded)."""

    def __init__(self, limit: int = MAX_TIMED_STREAMS) -> None:
        self._lock = threading.Lock()
        self._open: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self.limit = limit

    def begin(self, call_id: str) -> list[dict[str, Any]]:
        """Start timing ``call_id``; returns the events of the oldest entries evicted to stay bounded."""
        evicted = []
        with self._lock:
            self._open[call_id] = {"gap_ms": None, "event": None}
            while len(self._open) > self.limit:
                _, entry = self._open.popitem(last=False)
                if entry["event"] is not None:
                    evicted.append(entry["event"])
        return evicted

    def end(self, call_id: str, gap_ms: float | None) -> dict[str, Any] | None:
        """Record the stream's gap; returns its success event if that arrived first (now complete)."""
        with self._lock:
            entry = self._open.get(call_id)
            if entry is None:
                return None
            if entry["event"] is not None:
                del self._open[call_id]
                if gap_ms is not None and "ttft_ms" in entry["event"]:
                    entry["event"]["max_stream_gap_ms"] = round(gap_ms, 3)
                return entry["event"]
            entry["gap_ms"] = gap_ms if gap_ms is not None else -1.0
            return None

    def claim(self, call_id: str | None) -> tuple[bool, float | None]:
        """For a success log: ``(wait, gap_ms)``; ``wait`` when the stream is still being read."""
        if not call_id:
            return False, None
        with self._lock:
            entry = self._open.get(call_id)
            if entry is None:
                return False, None
            if entry["gap_ms"] is None:
                return True, None
            del self._open[call_id]
            return False, (entry["gap_ms"] if entry["gap_ms"] >= 0 else None)

    def park(self, call_id: str, event: dict[str, Any]) -> bool:
        """Keep ``event`` until the stream ends; False if the stream ended meanwhile (publish it now)."""
        with self._lock:
            entry = self._open.get(call_id)
            if entry is None or entry["gap_ms"] is not None:
                return False
            entry["event"] = event
            return True


def _call_id_of(obj: Any) -> str | None:
    logging_obj = getattr(obj, "logging_obj", None)
    call_id = getattr(logging_obj, "litellm_call_id", None)
    return call_id if isinstance(call_id, str) and call_id else None


class ChannelHealthLogger(CustomLogger):  # type: ignore[misc]  # LiteLLM is untyped here (follow_imports=skip)
    """LiteLLM callback publishing one request event per upstream call (module docstring).

    ``bootstrap`` / ``topic`` / ``security``: where to publish; default (None) from the
    environment on first use (:func:`pipeline.config.load_settings`:
    ``CHANNEL_HEALTH_KAFKA_BOOTSTRAP``, the requests topic with ``CHANNEL_HEALTH_TOPIC_PREFIX``,
    SASL/TLS settings). ``gateway_id``: sent as ``gateway_id``. ``classifier``: SPEC §4.1 error
    classes (default :func:`~pipeline.ingest.error_class.default_classifier`; None: send none,
    the worker classifies). ``channel_of``: deployment dict -> channel (as the routing hook's).
    ``max_buffer_events``: bound of the publisher's buffer. ``publisher``: an object with
    ``offer(event) -> bool`` instead (tests). Construction reads nothing and starts nothing,
    so ``proxy_handler_instance`` below costs nothing until LiteLLM logs a call.

    Counters: ``published_events`` (handed to the publisher), ``skipped`` (calls that reached no
    deployment), ``errors`` (a payload that could not be mapped: logged once, never raised);
    the publisher's ``dropped`` / ``dropped_buffer_full`` / ``dropped_kafka``.
    """

    def __init__(self, bootstrap: str | None = None, topic: str | None = None, *,
                 security: Mapping[str, Any] | None = None, gateway_id: str | None = None,
                 classifier: Classifier | None = _USE_DEFAULT,
                 channel_of: Callable[[dict[str, Any]], str] = default_channel_of,
                 max_buffer_events: int = DEFAULT_MAX_BUFFER_EVENTS, publisher: Any = None) -> None:
        super().__init__()
        self._bootstrap, self._topic, self._security = bootstrap, topic, security
        self.gateway_id = gateway_id
        self.classifier = default_classifier() if classifier is _USE_DEFAULT else classifier
        self.channel_of = channel_of
        self.max_buffer_events = max_buffer_events
        self._publisher = publisher
        self._publisher_lock = threading.Lock()
        self._streams = _StreamTimes()
        self.published_events = 0
        self.skipped = 0
        self.errors = 0

    @property
    def publisher(self) -> Any:
        """The publisher (built from the arguments or the environment on first use)."""
        if self._publisher is None:
            with self._publisher_lock:
                if self._publisher is None:
                    bootstrap, topic, security = self._bootstrap, self._topic, self._security
                    if bootstrap is None or topic is None or security is None:
                        from pipeline.config import load_settings

                        settings = load_settings()
                        bootstrap = bootstrap or settings.kafka_bootstrap
                        topic = topic or settings.topics.requests
                        security = security if security is not None else settings.kafka_security.aiokafka_kwargs()
                    if not bootstrap:
                        raise RuntimeError("channel-health: no Kafka bootstrap (set CHANNEL_HEALTH_KAFKA_BOOTSTRAP "
                                           "or pass bootstrap=)")
                    self._publisher = BackgroundPublisher(bootstrap, topic, security=security,
                                                          max_buffer_events=self.max_buffer_events)
        return self._publisher

    # -- LiteLLM hooks (keyword names as LiteLLM passes them) -----------------------------------------
    def log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        """Sync SDK calls: publish the call's event."""
        self._record(kwargs, success=True)

    def log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        """Sync SDK calls: publish the failed call's event."""
        self._record(kwargs, success=False)

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        """Async calls (the proxy, ``Router.acompletion``): publish the call's event (no I/O here)."""
        self._record(kwargs, success=True)

    async def async_log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        """Async calls: publish the failed call's event (no I/O here)."""
        self._record(kwargs, success=False)

    async def async_post_call_streaming_iterator_hook(self, user_api_key_dict: Any, response: Any,
                                                      request_data: dict[str, Any]) -> AsyncIterator[Any]:
        """The LiteLLM proxy passes every streamed response through here: time its chunks."""
        call_id = _call_id_of(response) or request_data.get("litellm_call_id")
        async for chunk in self._timed_async(response, call_id):
            yield chunk

    # -- stream timing --------------------------------------------------------------------------------
    def timed(self, stream: Any) -> Any:
        """Wrap a LiteLLM stream (SDK: the result of ``acompletion(..., stream=True)`` or of the sync
        ``completion``) so its event carries ``max_stream_gap_ms``; iterate the wrapper instead."""
        call_id = _call_id_of(stream)
        if hasattr(stream, "__aiter__"):
            return self._timed_async(stream, call_id)
        return self._timed_sync(stream, call_id)

    async def _timed_async(self, stream: Any, call_id: str | None) -> AsyncIterator[Any]:
        self._begin(call_id)
        clock = _GapClock()
        try:
            async for chunk in stream:
                clock.tick()
                yield chunk
        finally:
            self._end(call_id, clock.gap_s)

    def _timed_sync(self, stream: Any, call_id: str | None) -> Iterator[Any]:
        self._begin(call_id)
        clock = _GapClock()
        try:
            for chunk in stream:
                clock.tick()
                yield chunk
        finally:
            self._end(call_id, clock.gap_s)

    def _begin(self, call_id: str | None) -> None:
        if call_id:
            for event in self._streams.begin(call_id):
                self._offer(event)

    def _end(self, call_id: str | None, gap_s: float | None) -> None:
        if call_id:
            event = self._streams.end(call_id, None if gap_s is None else gap_s * 1000)
            if event is not None:
                self._offer(event)

    # -- publishing -----------------------------------------------------------------------------------
    def _record(self, kwargs: Any, success: bool) -> None:
        try:
            call_id = kwargs.get("litellm_call_id")
            wait, gap_ms = self._streams.claim(call_id) if success else (False, None)
            event = event_from_litellm(kwargs, success=success, gateway_id=self.gateway_id,
                                       classifier=self.classifier, channel_of=self.channel_of,
                                       max_stream_gap_ms=gap_ms)
            if event is None:
                self.skipped += 1
                return
            if wait and self._streams.park(call_id, event):
                return
            self._offer(event)
        except Exception:  # a logging hook must never fail the gateway's request
            self.errors += 1
            if self.errors == 1:
                log.exception("channel-health: could not map a LiteLLM log payload (logged once)")

    def _offer(self, event: dict[str, Any]) -> None:
        try:
            if self.publisher.offer(event):
                self.published_events += 1
        except Exception:
            self.errors += 1
            if self.errors == 1:
                log.exception("channel-health: could not publish (logged once; events are dropped)")


#: For the LiteLLM proxy's config.yaml: ``litellm_settings: {callbacks: pipeline.gateways.litellm.proxy_handler_instance}``
#: (settings from the environment, read on the first logged call).
proxy_handler_instance = ChannelHealthLogger()
