"""OpenTelemetry GenAI spans -> request events (``channel-health ingest otlp``; optional extra ``otel``).

An OpenTelemetry Collector's ``kafka`` exporter writes one
``ExportTraceServiceRequest`` per Kafka message (topic default ``otlp_spans``;
``encoding: otlp_proto``, its default, or ``otlp_json``). This module decodes
it with the OTLP protobuf classes (``opentelemetry-proto``; JSON through
protobuf's own JSON mapping, ``google.protobuf.json_format``, accepting the
OTLP/JSON spelling of ids as hex) and maps every GenAI span -- one with
``gen_ai.operation.name`` or ``gen_ai.request.model`` (OpenTelemetry semantic
conventions for generative AI, "gen-ai-spans") -- to one request event:

=========================  ==================================================================
event field                span
=========================  ==================================================================
``event_id``               ``otel:<trace id hex>:<span id hex>``
``ts_ms`` / ``latency_ms`` ``end_time_unix_nano`` / end - start
``channel``                ``channel_health.channel``, else ``<provider>/<model>`` with provider
                           ``gen_ai.provider.name`` (or the older ``gen_ai.system``) and model
                           ``gen_ai.request.model`` (or ``gen_ai.response.model``)
``route``                  ``channel_health.route``, else the model
``status``                 ``ok`` unless the span status is ERROR or ``error.type`` is set; then
                           ``rate_limited`` (HTTP 429), ``timeout`` (``error.type`` naming a
                           timeout, HTTP 408/504), else ``error``
``http_status``            ``http.response.status_code``
``error_type``             ``error.type``
``error_message``          the span status message, else the ``exception.message`` of its
                           ``exception`` event (cut to 512 characters)
``input_tokens``           ``gen_ai.usage.input_tokens``
``output_tokens``          ``gen_ai.usage.output_tokens``
``trace_id``               the trace id (hex)
``gateway_id``             the resource's ``service.instance.id``, else ``service.name``
``account`` ``tier``       ``channel_health.account`` / ``.tier`` (span, else resource)
``cost_usd`` ``ttft_ms``   ``channel_health.cost_usd`` / ``.ttft_ms`` / ``.max_stream_gap_ms`` /
``max_stream_gap_ms``      ``.retry_after_s`` (the conventions have no attribute for these yet)
``retry_after_s``
=========================  ==================================================================

Spans without ``gen_ai.*`` (HTTP server spans, database spans) are not
requests to a model: skipped and counted. A GenAI span that cannot become a
valid event (no model, end before start, a value out of range) is a dead
letter like a bad event (:class:`~pipeline.ingest.dead_letter.DeadLetter`,
the span's own protobuf bytes as ``raw``, reason ``invalid_event`` or the
contract's code), and a message that is not OTLP at all one with reason
``invalid_otlp``. Nothing raises.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

try:
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
except ImportError as exc:  # an optional extra: say which
    raise ImportError("channel-health ingest otlp needs the OTLP protobuf classes, an optional extra: "
                      "pip install 'channel-health[otel]'") from exc

from pipeline.contracts import RequestEvent
from pipeline.ingest import reasons as R
from pipeline.ingest.dead_letter import DeadLetter
from pipeline.ingest.error_class import MAX_MESSAGE_CHARS

__all__ = ["INVALID_OTLP", "DEFAULT_TOPIC", "Encoding", "SpanBatch", "decode_request", "spans_to_events"]

#: Dead-letter reason of a message that is not an OTLP trace export in the expected encoding.
INVALID_OTLP = "invalid_otlp"
#: The Collector kafka exporter's default traces topic.
DEFAULT_TOPIC = "otlp_spans"
Encoding = Literal["auto", "otlp_proto", "otlp_json"]

_HEX_ID = re.compile(r"^[0-9a-fA-F]{16}$|^[0-9a-fA-F]{32}$")
_TIMEOUT = re.compile(r"timeout|timed.?out|deadline", re.IGNORECASE)


@dataclass
class SpanBatch:
    """What one Kafka message became: ``events`` (dicts, SPEC §3), ``dead_letters``, and ``skipped``
    (spans without ``gen_ai.*`` attributes)."""

    events: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    skipped: int = 0


def _ids_hex_to_base64(obj: Any) -> Any:
    """OTLP/JSON writes trace and span ids as hex; protobuf's JSON mapping reads bytes as base64."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str) and _HEX_ID.match(v):
                v = base64.b64encode(bytes.fromhex(v)).decode("ascii")
            out[k] = _ids_hex_to_base64(v)
        return out
    if isinstance(obj, list):
        return [_ids_hex_to_base64(v) for v in obj]
    return obj


def decode_request(raw: bytes, encoding: Encoding = "auto") -> ExportTraceServiceRequest:
    """One Kafka message value as an ``ExportTraceServiceRequest``.

    ``encoding``: ``otlp_proto``, ``otlp_json`` or ``auto`` (JSON when the first non-blank byte is
    ``{``). Raises ``ValueError`` naming the problem when the bytes are not that encoding.
    """
    data = bytes(raw or b"")
    if encoding == "auto":
        encoding = "otlp_json" if data.lstrip()[:1] == b"{" else "otlp_proto"
    msg = ExportTraceServiceRequest()
    if encoding == "otlp_json":
        try:
            json_format.ParseDict(_ids_hex_to_base64(json.loads(data)), msg, ignore_unknown_fields=True)
        except (ValueError, json_format.ParseError, UnicodeDecodeError, RecursionError) as exc:
            raise ValueError(f"not OTLP/JSON: {str(exc)[:200]}") from None
        return msg
    try:
        msg.ParseFromString(data)
    except (DecodeError, RuntimeWarning, ValueError) as exc:
        raise ValueError(f"not OTLP protobuf: {str(exc)[:200]}") from None
    return msg


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind in ("string_value", "bool_value", "int_value", "double_value"):
        return getattr(v, kind)
    return None  # arrays, maps and bytes carry nothing this mapping reads


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def span_to_event(span: Span, resource: dict[str, Any]) -> dict[str, Any] | None:
    """The event of one GenAI span (module docstring), None for a span without ``gen_ai.*``.

    Raises ``ValueError`` naming the field when a GenAI span cannot be an event.
    """
    a = _attrs(span.attributes)
    if "gen_ai.operation.name" not in a and "gen_ai.request.model" not in a:
        return None

    def ch(name: str) -> Any:
        return a.get(f"channel_health.{name}", resource.get(f"channel_health.{name}"))

    provider = _str(a.get("gen_ai.provider.name")) or _str(a.get("gen_ai.system"))
    model = _str(a.get("gen_ai.request.model")) or _str(a.get("gen_ai.response.model"))
    channel = _str(ch("channel")) or (f"{provider}/{model}" if provider and model else None)
    if channel is None:
        raise ValueError("gen_ai.request.model / gen_ai.provider.name: a GenAI span needs both (or a "
                         "channel_health.channel attribute) to name its channel")
    if span.end_time_unix_nano < span.start_time_unix_nano or span.end_time_unix_nano == 0:
        raise ValueError("end_time_unix_nano: the span ends before it starts (or never ends)")
    event: dict[str, Any] = {
        "event_id": f"otel:{span.trace_id.hex()}:{span.span_id.hex()}",
        "ts_ms": span.end_time_unix_nano // 1_000_000,
        "channel": channel,
        "route": _str(ch("route")) or model or channel,
        "latency_ms": (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6,
    }
    if span.trace_id:
        event["trace_id"] = span.trace_id.hex()
    gateway = _str(resource.get("service.instance.id")) or _str(resource.get("service.name"))
    if gateway:
        event["gateway_id"] = gateway
    http = a.get("http.response.status_code")
    if isinstance(http, str) and http.isdigit():
        http = int(http)
    if http is not None:
        event["http_status"] = http
    error_type = _str(a.get("error.type"))
    failed = span.status.code == Status.STATUS_CODE_ERROR or error_type is not None
    if failed:
        if http == 429:
            event["status"] = "rate_limited"
        elif http in (408, 504) or (error_type is not None and _TIMEOUT.search(error_type)):
            event["status"] = "timeout"
        else:
            event["status"] = "error"
        if error_type:
            event["error_type"] = error_type
        message = span.status.message or next(
            (str(_attrs(e.attributes).get("exception.message") or "") for e in span.events if e.name == "exception"),
            "")
        if message:
            event["error_message"] = message[:MAX_MESSAGE_CHARS]
    else:
        event["status"] = "ok"
    for out, key in (("input_tokens", "gen_ai.usage.input_tokens"), ("output_tokens", "gen_ai.usage.output_tokens")):
        if key in a:
            event[out] = a[key]
    for name in ("account", "tier", "cost_usd", "ttft_ms", "max_stream_gap_ms", "retry_after_s"):
        value = ch(name)
        if value is not None:
            event[name] = value
    return event


def spans_to_events(raw: bytes, encoding: Encoding = "auto") -> SpanBatch:
    """Every GenAI span of one Kafka message as a validated event dict, or a dead letter (never raises)."""
    out = SpanBatch()
    try:
        request = decode_request(raw, encoding)
    except ValueError as exc:
        out.dead_letters.append(DeadLetter(reason=INVALID_OTLP, detail=str(exc), raw=bytes(raw or b"")))
        return out
    for resource_spans in request.resource_spans:
        resource = _attrs(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                span_id = f"otel:{span.trace_id.hex()}:{span.span_id.hex()}"
                try:
                    event = span_to_event(span, resource)
                    if event is None:
                        out.skipped += 1
                        continue
                    msgspec.convert(event, RequestEvent)  # the contract (SPEC §3), as the worker will check it
                except msgspec.ValidationError as exc:
                    reason, detail = R.classify_validation_error(str(exc))
                    out.dead_letters.append(DeadLetter(reason=reason, detail=detail, raw=span.SerializeToString(),
                                                       event_id=span_id))
                    continue
                except (ValueError, TypeError) as exc:
                    out.dead_letters.append(DeadLetter(reason=R.INVALID_EVENT, detail=str(exc)[:300],
                                                       raw=span.SerializeToString(), event_id=span_id))
                    continue
                out.events.append(event)
    return out
