"""OTLP GenAI spans -> request events (pipeline.gateways.otlp).

The spans are made by the real OpenTelemetry SDK and encoded by the real OTLP encoder
(opentelemetry-exporter-otlp-proto-common ``encode_spans``), then written as the Collector's kafka exporter
does: OTLP protobuf bytes, or JSON through protobuf's JSON mapping (and the OTLP/JSON spelling of ids as hex).
Fails on the old code: pipeline.gateways.otlp did not exist.
"""

from __future__ import annotations

import json

import msgspec
import pytest

pytest.importorskip("opentelemetry.sdk", reason="the [otel] extra is not installed")
pytest.importorskip("opentelemetry.exporter.otlp.proto.common", reason="the [otel] extra is not installed")

from google.protobuf import json_format  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import Status, StatusCode  # noqa: E402

from pipeline.contracts import RequestEvent  # noqa: E402
from pipeline.gateways.otlp import INVALID_OTLP, decode_request, spans_to_events  # noqa: E402

T0 = 1_796_000_000_000_000_000  # ns


def make_spans(specs: list[dict], t0_ns: int = T0) -> list:
    """Finished SDK spans: each spec has ``attrs``, ``start_ms`` / ``end_ms`` offsets from ``t0_ns``, optional
    ``error`` (status description) and ``exception`` (recorded as the span's exception event)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "gateway", "service.instance.id": "gw-7"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    for s in specs:
        span = tracer.start_span(s.get("name", "chat gpt-4o"), start_time=t0_ns + s.get("start_ms", 0) * 1_000_000,
                                 attributes=s["attrs"])
        if "exception" in s:
            span.record_exception(s["exception"])
        if "error" in s:
            span.set_status(Status(StatusCode.ERROR, s["error"]))
        span.end(end_time=t0_ns + s["end_ms"] * 1_000_000)
    return list(exporter.get_finished_spans())


def proto_bytes(spans: list) -> bytes:
    return encode_spans(spans).SerializeToString()


def json_bytes(spans: list, hex_ids: bool = False) -> bytes:
    doc = json.loads(json_format.MessageToJson(encode_spans(spans)))
    if hex_ids:  # the OTLP/JSON spelling (what the Collector's otlp_json writes): ids as hex
        import base64

        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    for k in ("traceId", "spanId"):
                        sp[k] = base64.b64decode(sp[k]).hex()
    return json.dumps(doc).encode()


GENAI_OK = {"attrs": {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
                      "gen_ai.request.model": "gpt-4o", "gen_ai.usage.input_tokens": 120,
                      "gen_ai.usage.output_tokens": 40, "http.response.status_code": 200},
            "end_ms": 850}
GENAI_429 = {"attrs": {"gen_ai.operation.name": "chat", "gen_ai.system": "deepseek",
                       "gen_ai.request.model": "deepseek-chat", "error.type": "RateLimitError",
                       "http.response.status_code": 429, "channel_health.retry_after_s": 12.0,
                       "channel_health.account": "team-a"},
             "error": "Rate limit reached", "end_ms": 40}
GENAI_TIMEOUT = {"attrs": {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "anthropic",
                           "gen_ai.request.model": "claude", "error.type": "TimeoutError",
                           "channel_health.channel": "anthropic/claude@paid", "channel_health.route": "smart",
                           "channel_health.tier": "paid", "channel_health.ttft_ms": 0.0},
                 "exception": TimeoutError("upstream timed out after 30 s"), "end_ms": 30_000}
PLAIN_HTTP = {"attrs": {"http.request.method": "POST", "http.response.status_code": 200}, "end_ms": 5}


@pytest.mark.parametrize("encode", [proto_bytes, json_bytes, lambda s: json_bytes(s, hex_ids=True)],
                         ids=["otlp_proto", "otlp_json_protobuf_mapping", "otlp_json_hex_ids"])
def test_genai_spans_become_events_field_by_field(encode):
    spans = make_spans([GENAI_OK, GENAI_429, GENAI_TIMEOUT, PLAIN_HTTP])
    out = spans_to_events(encode(spans))
    assert out.dead_letters == [] and out.skipped == 1  # the plain HTTP span is not a model request
    ok, limited, timed_out = out.events
    sdk = spans[0].context
    assert ok == {
        "event_id": f"otel:{sdk.trace_id:032x}:{sdk.span_id:016x}", "ts_ms": T0 // 1_000_000 + 850,
        "channel": "openai/gpt-4o", "route": "gpt-4o", "latency_ms": 850.0, "trace_id": f"{sdk.trace_id:032x}",
        "gateway_id": "gw-7", "http_status": 200, "status": "ok", "input_tokens": 120, "output_tokens": 40,
    }
    assert limited["channel"] == "deepseek/deepseek-chat" and limited["status"] == "rate_limited"
    assert (limited["http_status"], limited["error_type"], limited["error_message"]) == (
        429, "RateLimitError", "Rate limit reached")
    assert (limited["retry_after_s"], limited["account"], limited["latency_ms"]) == (12.0, "team-a", 40.0)
    assert timed_out["status"] == "timeout" and timed_out["error_type"] == "TimeoutError"
    assert timed_out["error_message"] == "upstream timed out after 30 s"  # from the exception event
    assert (timed_out["channel"], timed_out["route"], timed_out["tier"]) == ("anthropic/claude@paid", "smart", "paid")
    assert "http_status" not in timed_out
    for e in out.events:
        msgspec.convert(e, RequestEvent)


def test_bad_spans_are_dead_letters_and_the_good_ones_pass():
    no_model = {"attrs": {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai"}, "end_ms": 10}
    backwards = dict(GENAI_OK, start_ms=500, end_ms=100)
    bad_tokens = {"attrs": {**GENAI_OK["attrs"], "gen_ai.usage.output_tokens": -5}, "end_ms": 10}
    spans = make_spans([no_model, GENAI_OK, backwards, bad_tokens])
    out = spans_to_events(proto_bytes(spans))
    assert len(out.events) == 1 and out.events[0]["channel"] == "openai/gpt-4o"
    reasons = [(d.reason, d.detail.split(":")[0], d.event_id) for d in out.dead_letters]
    ctx = [s.context for s in spans]
    assert reasons == [
        ("invalid_event", "gen_ai.request.model / gen_ai.provider.name", f"otel:{ctx[0].trace_id:032x}:{ctx[0].span_id:016x}"),
        ("invalid_event", "end_time_unix_nano", f"otel:{ctx[2].trace_id:032x}:{ctx[2].span_id:016x}"),
        ("out_of_range", "output_tokens", f"otel:{ctx[3].trace_id:032x}:{ctx[3].span_id:016x}"),
    ]
    # the dead letter keeps the span itself (protobuf bytes), readable with the OTLP classes
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    span = Span()
    span.ParseFromString(out.dead_letters[0].raw)
    assert span.name == "chat gpt-4o" and span.span_id == ctx[0].span_id.to_bytes(8, "big")
    value = json.loads(out.dead_letters[0].to_kafka_value())
    assert value["reason"] == "invalid_event" and value["raw_encoding"] == "base64"


@pytest.mark.parametrize("raw", [b"\xff\xfe not protobuf", b'{"resourceSpans": 5}', b"{not json"])
def test_a_message_that_is_not_otlp_is_one_dead_letter(raw):
    out = spans_to_events(raw)
    assert out.events == [] and len(out.dead_letters) == 1
    (d,) = out.dead_letters
    assert d.reason == INVALID_OTLP and d.raw == raw and d.detail.startswith("not OTLP")


def test_encodings_can_be_forced():
    raw = proto_bytes(make_spans([GENAI_OK]))
    assert len(decode_request(raw, "otlp_proto").resource_spans) == 1
    with pytest.raises(ValueError, match="not OTLP/JSON"):
        decode_request(raw, "otlp_json")


def test_cli_refuses_a_bad_encoding_and_a_missing_bootstrap():
    from typer.testing import CliRunner

    from pipeline.cli.main import app

    bad = CliRunner().invoke(app, ["ingest", "otlp", "--encoding", "xml"],
                             env={"CHANNEL_HEALTH_KAFKA_BOOTSTRAP": "127.0.0.1:9"})
    assert bad.exit_code == 2 and "--encoding: one of auto, otlp_proto, otlp_json" in bad.output
    unset = CliRunner().invoke(app, ["ingest", "otlp"], env={"CHANNEL_HEALTH_KAFKA_BOOTSTRAP": ""})
    assert unset.exit_code == 2 and "CHANNEL_HEALTH_KAFKA_BOOTSTRAP is not set" in unset.output
