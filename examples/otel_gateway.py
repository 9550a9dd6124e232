"""OpenTelemetry GenAI spans -> Kafka -> `channel-health ingest otlp` -> verdicts, end to end on one machine.

    python examples/otel_gateway.py               # needs: pip install -e '.[embedded,otel]'

What happens:
1. the embedded Kafka broker and one channel-health worker start (both stop with this script);
2. a gateway instrumented with the OpenTelemetry SDK records one GenAI span per upstream call
   (``gen_ai.provider.name``, ``gen_ai.request.model``, ``gen_ai.usage.*``, ``error.type``,
   ``http.response.status_code``) for two providers serving one model;
3. the spans are encoded with the OTLP encoder and written to the topic ``otlp_spans`` as one
   ``ExportTraceServiceRequest`` per message, as an OpenTelemetry Collector's ``kafka`` exporter does
   (docs/CONNECTING.md has the Collector config);
4. the ingest loop (the code behind ``channel-health ingest otlp``) turns them into request events;
5. provider ``beta`` starts failing with HTTP 503; the worker's verdicts say so.

It prints every verdict as it arrives and the ingest counts.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a plain clone: the repository's `pipeline`

from aiokafka import AIOKafkaProducer  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult  # noqa: E402
from opentelemetry.trace import Status, StatusCode  # noqa: E402

from pipeline.gateways.otlp_ingest import run_otlp_ingest  # noqa: E402
from pipeline.router.subscriber import HealthSubscriber  # noqa: E402
from pipeline.tools.example_stack import embedded_stack  # noqa: E402

TOPIC = "otlp_spans"
PROVIDERS = ("alpha", "beta")


class Collect(SpanExporter):
    """Keeps finished spans until the next export to Kafka (the Collector's batching, in miniature)."""

    def __init__(self) -> None:
        self.spans: list = []

    def export(self, spans) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def take(self) -> list:
        out, self.spans = self.spans, []
        return out


def call_upstream(tracer, provider: str, failing: bool, rng: random.Random) -> None:
    """One simulated upstream call recorded as a GenAI client span (OpenTelemetry semantic conventions)."""
    now = time.time_ns()
    latency_ns = int(rng.uniform(0.2, 0.6) * 1e9)
    span = tracer.start_span("chat llama-70b", start_time=now - latency_ns, attributes={
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": provider, "gen_ai.request.model": "llama-70b",
        "channel_health.route": "llama-70b"})
    if failing:
        span.set_attributes({"error.type": "ServiceUnavailableError", "http.response.status_code": 503})
        span.set_status(Status(StatusCode.ERROR, "upstream overloaded"))
    else:
        span.set_attributes({"http.response.status_code": 200, "gen_ai.usage.input_tokens": 120,
                             "gen_ai.usage.output_tokens": rng.randint(20, 80)})
    span.end(end_time=now)


async def run(settings, calls: int, timeout_s: float) -> int:
    failing_channel = "beta/llama-70b"
    opened, seen = asyncio.Event(), set()

    def on_verdict(v) -> None:
        seen.add(v.channel)
        print(f"verdict {v.channel} state={v.state} weight={v.weight:.2f} reasons={','.join(v.reasons) or '-'}",
              flush=True)
        if v.channel == failing_channel and v.state == "open":
            opened.set()

    exporter = Collect()
    provider = TracerProvider(resource=Resource.create({"service.name": "my-gateway",
                                                        "service.instance.id": "gateway-1"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("example.gateway")
    rng = random.Random(7)
    stop = asyncio.Event()
    counts: list = []
    ingest = asyncio.create_task(run_otlp_ingest(settings, TOPIC, stop=stop, on_progress=counts.append))
    kafka = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap,
                             **settings.kafka_security.aiokafka_kwargs())
    await kafka.start()

    async def traffic(n: int, failing: str | None) -> None:
        for i in range(n):
            for p in PROVIDERS:
                call_upstream(tracer, p, p == failing, rng)
            if i % 5 == 4:  # one ExportTraceServiceRequest per message, as the Collector's kafka exporter writes
                await kafka.send_and_wait(TOPIC, encode_spans(exporter.take()).SerializeToString())
            await asyncio.sleep(0.05)

    try:
        async with HealthSubscriber(settings, on_verdict=on_verdict):
            await traffic(calls, None)
            deadline = time.monotonic() + timeout_s
            while not {"alpha/llama-70b", failing_channel} <= seen and time.monotonic() < deadline:
                await traffic(5, None)
            print("provider beta now fails with HTTP 503", flush=True)
            t0 = time.monotonic()
            while not opened.is_set() and time.monotonic() - t0 < timeout_s:
                await traffic(5, "beta")
            if not opened.is_set():
                print(f"no open verdict for {failing_channel} within {timeout_s:.0f} s", flush=True)
                return 1
            print(f"{failing_channel} open {time.monotonic() - t0:.1f} s after the fault began", flush=True)
    finally:
        await kafka.stop()
        stop.set()
        await ingest
    c = counts[-1]
    print(f"ingest: {c.messages} messages, {c.events} events, {c.dead_letters} dead letters, {c.skipped} skipped",
          flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=40, help="calls per provider before the fault")
    parser.add_argument("--timeout-s", type=float, default=90.0, help="longest wait for each verdict")
    parser.add_argument("--data-dir", type=Path, default=None, help="chDB and worker log (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ch-otel-example-") as tmp:
        with embedded_stack(args.data_dir or Path(tmp)) as settings:
            return asyncio.run(run(settings, args.calls, args.timeout_s))


if __name__ == "__main__":
    sys.exit(main())
