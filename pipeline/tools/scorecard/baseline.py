"""What the baseline breakers share: a call, its outcome, and a per-channel wrapper.

Status mapping (SPEC §3 ``status`` -> what each breaker sees), the same for all:

* ``ok`` -> success.
* ``error`` -> failure with the event's ``http_status`` (the simulator reports 502/503).
* ``timeout`` -> failure, HTTP 504 when the event has no ``http_status``: a gateway
  timeout is what Envoy maps a local-origin timeout to (5xx, ``split_external_local_origin_errors``
  false by default), what LiteLLM raises as a ``Timeout`` (408, cooled down) and an exception for
  resilience4j and pybreaker.
* ``rate_limited`` -> failure, HTTP 429: an exception for resilience4j/pybreaker, LiteLLM's
  immediate-cooldown status, and not a 5xx for Envoy (it resets Envoy's consecutive-5xx count).
* ``cancelled``, ``filtered`` -> not recorded (a client cancel or a content filter is not an
  upstream failure, as in SPEC §4.1; none of the breakers sees a call that the client dropped).

How a breaker "detects": its open / cooldown / ejection decision is taken as a non-healthy
verdict for the channel at that event time. While open, the channel's calls are not sent to it
(a router sends them elsewhere), so they are skipped; when the breaker lets calls through again
(half-open, cooldown over, ejection over) they count again. Peers that probe with a synthetic
request (new-api's channel test, Higress's health check, Linkerd's probation request) take the
channel's next call at or after the probe time as the probe's outcome (:func:`probe_ms` for its
duration): the stream is open loop, so that call is what the upstream answered then.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

#: Statuses that are upstream failures (same set as :data:`pipeline.contracts.FAILURE_STATUSES`).
FAILURES = frozenset({"error", "timeout", "rate_limited"})
#: HTTP status assumed where an event has none.
DEFAULT_HTTP = {"error": 500, "timeout": 504, "rate_limited": 429, "ok": 200}


@dataclass(frozen=True, slots=True)
class Call:
    """One finished request as a breaker sees it.

    ts_ms: event time, UTC epoch ms. failed: an upstream failure (see the module's mapping).
    http_status: 100..599. latency_ms: >= 0. ttft_ms: time to first token, >= 0, None when the event
    has none. retry_after_s: the 429's ``Retry-After`` in seconds (>= 0), None when absent.
    error_message: the upstream error text, None when absent (new-api's keyword rule reads it).
    """

    ts_ms: int
    failed: bool
    http_status: int
    latency_ms: float
    ttft_ms: float | None = None
    retry_after_s: float | None = None
    error_message: str | None = None


def to_call(event: dict) -> Call | None:
    """A SPEC §3 event dict as a :class:`Call`; ``None`` for ``cancelled``/``filtered`` (not recorded)."""
    status = event["status"]
    if status not in FAILURES and status != "ok":
        return None
    http = event.get("http_status") or DEFAULT_HTTP[status]
    if status == "rate_limited":
        http = 429
    ttft, retry = event.get("ttft_ms"), event.get("retry_after_s")
    return Call(int(event["ts_ms"]), status in FAILURES, int(http), float(event["latency_ms"]),
                None if ttft is None else float(ttft), None if retry is None else float(retry),
                event.get("error_message"))


def probe_ms(call: Call) -> float:
    """How long a synthetic health check / channel test would take, ms, estimated from a real call.

    The peers' probes are short requests ("hi", at most a few tokens), so their duration is close to
    the call's time to first token; ``latency_ms`` where the event has no ``ttft_ms``.
    """
    return call.ttft_ms if call.ttft_ms is not None else call.latency_ms


class Breaker(Protocol):
    """One channel's breaker: ``allows(ts_ms)`` whether a call goes to the channel now;
    ``record(call)`` files the call's outcome and returns True when this call opened it."""

    def allows(self, ts_ms: int) -> bool: ...

    def record(self, call: Call) -> bool: ...


class Pool(Protocol):
    """A route's channels under one policy: ``offer(channel, call)`` returns True when the call
    opened (ejected, cooled down) ``channel``. Calls arrive in event-time order."""

    def offer(self, channel: str, call: Call) -> bool: ...

    def in_service(self, channel: str, ts_ms: int) -> bool: ...


class PerChannel:
    """A :class:`Pool` of independent per-channel breakers made by ``factory()``.

    ``in_service``: the breaker's ``serving(ts_ms)`` where it has one (a channel that only lets a probe
    through is not in service), else ``allows(ts_ms)`` (a half-open breaker serves its calls)."""

    def __init__(self, factory, channels: list[str]):
        self.breakers = {c: factory() for c in channels}

    def offer(self, channel: str, call: Call) -> bool:
        """Skip the call while the channel's breaker holds it off; else record it (True: it opened)."""
        b = self.breakers[channel]
        if not b.allows(call.ts_ms):
            return False
        return b.record(call)

    def in_service(self, channel: str, ts_ms: int) -> bool:
        """Whether a router following this pool sends ``channel`` traffic at ``ts_ms`` (goodput model)."""
        b = self.breakers[channel]
        serving = getattr(b, "serving", None)
        return bool(serving(ts_ms)) if serving is not None else bool(b.allows(ts_ms))
