"""A plain Python producer: publish request events, print the verdicts they cause.

Run from the repository root after ``make demo``'s install (nothing else started)::

    .venv/bin/python examples/producer.py        # or `python examples/producer.py` in the activated .venv

What it does, on the embedded default (as ``channel-health demo``):

1. starts the embedded Kafka broker (Tansu) unless ``CHANNEL_HEALTH_KAFKA_BOOTSTRAP`` is set, creates the
   topics (``channel-health topics ensure``), and starts one ``channel-health worker`` writing to chDB in a
   temporary folder (``--data-dir DIR`` keeps it; ``CHANNEL_HEALTH_CLICKHOUSE_URL`` is used when set);
2. publishes two minutes of request events (SPEC §3, ``schemas/request_event.v1.json``) of two channels of one
   route through :class:`pipeline.kafka.producer.BatchingProducer` (batch envelopes keyed by channel): both
   answer ``ok`` for 100 s, then ``example-a`` fails every call for 20 s (HTTP 500, ``error_class``
   ``transient``);
3. reads ``channel.health`` (:class:`pipeline.router.subscriber.HealthSubscriber`) and prints each state
   change, one line each::

       verdict +104.0s example-a/gpt-4o-mini@paid open weight=0.00 reasons=consecutive_failures

   until ``example-a`` is ``open`` and ``example-b`` has a verdict from after the fault (``--timeout-s``,
   default 180 s; exit 1 when that does not happen);
4. stops the worker (SIGTERM: it drains, flushes ClickHouse and commits), its sink process, then the broker.
   Ctrl-C or SIGTERM at any point does the same stop and exits 130; the worker and the broker also end when
   this process is killed (``prctl`` parent-death signal, :mod:`pipeline.parent_death`).

With a broker of your own, give ``CHANNEL_HEALTH_KAFKA_BOOTSTRAP`` (and the SASL/TLS settings of
``pipeline/config.py``); ``--no-worker`` when workers already consume it. The event producer is the part to copy:
:func:`request_event` builds one event, :func:`publish` sends them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from pipeline.config import Settings, load_settings
from pipeline.contracts import Verdict

ROUTE = "example/chat"
#: The channel that starts failing, and its healthy sibling on the same route.
FAILING = "example-a/gpt-4o-mini@paid"
HEALTHY = "example-b/gpt-4o-mini@paid"
#: Event time published (s), one request per channel and second; the failing channel fails from FAULT_AT_S on.
DURATION_S = 120
FAULT_AT_S = 100


def request_event(channel: str, ts_ms: int, ok: bool) -> dict[str, Any]:
    """One request event (SPEC §3): a finished upstream call of ``channel`` at ``ts_ms`` (UTC epoch ms).

    ``ok`` False: an HTTP 500 the gateway classed ``transient`` (SPEC §4.1). Units: ``*_ms`` milliseconds,
    ``cost_usd`` US dollars, ``quota_remaining`` a share 0..1.
    """
    event: dict[str, Any] = {
        "event_id": str(uuid.uuid4()),  # unique: the worker drops a redelivered copy, ClickHouse collapses it
        "ts_ms": ts_ms,
        "channel": channel,
        "route": ROUTE,
        "tier": "paid",
        "gateway_id": "example-gateway-1",
        "account": channel.split("/")[0] + "-key-1",
        "status": "ok" if ok else "error",
        "http_status": 200 if ok else 500,
        "latency_ms": 840.0 if ok else 95.0,
    }
    if ok:
        event.update(ttft_ms=210.0, max_stream_gap_ms=35.0, input_tokens=420, output_tokens=180,
                     cost_usd=0.000171, quota_remaining=0.82)
    else:
        event.update(error_class="transient", error_type="server_error",
                     error_message="The server had an error while processing your request.")
    return event


def build_events(end_ms: int) -> list[dict[str, Any]]:
    """``DURATION_S`` seconds of events ending at ``end_ms``: both channels ``ok``, then :data:`FAILING`
    failing from ``FAULT_AT_S`` on. Ordered by time; 2 events per second."""
    start_ms = end_ms - DURATION_S * 1000
    return [request_event(channel, start_ms + s * 1000, ok=not (channel == FAILING and s >= FAULT_AT_S))
            for s in range(DURATION_S) for channel in (FAILING, HEALTHY)]


async def publish(settings: Settings, events: list[dict[str, Any]]) -> int:
    """Send ``events`` to ``gateway.requests`` in batch envelopes (:class:`BatchingProducer`); returns the
    number sent once the broker acknowledged all of them (``acks=all``)."""
    from pipeline.kafka.producer import BatchingProducer

    async with BatchingProducer(settings.kafka_bootstrap or "", settings.topics.requests,
                                security=settings.kafka_security.aiokafka_kwargs()) as producer:
        await producer.send_many(events)
        await producer.flush()
        return producer.events_sent


def verdict_line(verdict: Verdict, start_ms: int) -> str:
    """``verdict +SECONDS CHANNEL STATE weight=W reasons=R`` (seconds of event time since the first event)."""
    return (f"verdict +{(verdict.ts_ms - start_ms) / 1000:.1f}s {verdict.channel} {verdict.state} "
            f"weight={verdict.weight:.2f} reasons={','.join(verdict.reasons) or '-'}")


async def run(settings: Settings, timeout_s: float, check: Callable[[], None]) -> int:
    """Publish :func:`build_events` and print each channel's state changes until :data:`FAILING` is open and
    :data:`HEALTHY` was evaluated after the fault. Returns 0, or 1 on timeout. ``check`` raises when the
    worker died."""
    from pipeline.router.subscriber import HealthSubscriber

    events = build_events(int(time.time() * 1000))
    start_ms, fault_ms = events[0]["ts_ms"], events[0]["ts_ms"] + FAULT_AT_S * 1000
    shown: dict[str, tuple[str, tuple[str, ...]]] = {}

    def on_verdict(v: Verdict) -> None:
        if v.channel in (FAILING, HEALTHY) and shown.get(v.channel) != (v.state, tuple(v.reasons)):
            shown[v.channel] = (v.state, tuple(v.reasons))
            print(verdict_line(v, start_ms), flush=True)

    def done(table: Any) -> bool:
        check()
        failing, healthy = table.verdict(FAILING), table.verdict(HEALTHY)
        return (failing is not None and failing.state == "open"
                and healthy is not None and healthy.ts_ms >= fault_ms)

    async with HealthSubscriber(settings, on_verdict=on_verdict) as sub:
        sent = await publish(settings, events)
        print(f"published {sent} events of {FAILING} and {HEALTHY} (route {ROUTE}); "
              f"{FAILING} fails from +{FAULT_AT_S}s", flush=True)
        try:
            await sub.wait_for(done, timeout_s)
        except TimeoutError:
            print(f"no open verdict for {FAILING} within {timeout_s:g} s", file=sys.stderr, flush=True)
            return 1
        for channel in (FAILING, HEALTHY):
            v = sub.table.verdict(channel)
            assert v is not None
            print(f"final {channel} {v.state} weight={v.weight:.2f}", flush=True)
    return 0


class WorkerExited(RuntimeError):
    """The worker process ended while the example still needed it; the message holds its log's tail."""


def main(argv: list[str] | None = None) -> int:
    """Run the example (see the module docstring); returns the exit code (0 done, 1 failed, 130 stopped)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, help="keep chDB and the worker log here (default: a temporary "
                        "folder, removed at the end)")
    parser.add_argument("--timeout-s", type=float, default=180.0, help="longest wait for the verdicts (s)")
    parser.add_argument("--no-worker", action="store_true", help="start no worker (workers already consume "
                        "CHANNEL_HEALTH_KAFKA_BOOTSTRAP)")
    args = parser.parse_args(argv)
    from pipeline.tools.demo_stop import sigterm_interrupts

    with sigterm_interrupts(), tempfile.TemporaryDirectory(prefix="channel-health-example-") as tmp:
        data_dir = (args.data_dir or Path(tmp)).resolve()
        data_dir.mkdir(parents=True, exist_ok=True)
        return _run_stack(load_settings(), data_dir, args.timeout_s, start_worker=not args.no_worker)


def _run_stack(settings: Settings, data_dir: Path, timeout_s: float, start_worker: bool) -> int:
    from pipeline.kafka.topics import ensure as ensure_topics
    from pipeline.tools.demo_stop import stop_in_order, worker_popen_kwargs
    from pipeline.tools.embedded.broker import EmbeddedBroker

    broker = worker = None
    log_path = data_dir / "worker.log"

    def check() -> None:
        if worker is not None and worker.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
            raise WorkerExited(f"the worker exited with code {worker.returncode}; end of {log_path}:\n{tail}")

    try:
        if not settings.kafka_bootstrap:
            broker = EmbeddedBroker().start()
            settings = settings.with_overrides(kafka_bootstrap=broker.bootstrap)
            print(f"embedded broker at {broker.bootstrap}", flush=True)
        if "CHANNEL_HEALTH_CLICKHOUSE_URL" not in os.environ:
            settings = settings.with_overrides(clickhouse_url=f"chdb://{data_dir / 'chdb'}")
        asyncio.run(ensure_topics(settings))
        if start_worker:
            env = dict(os.environ, CHANNEL_HEALTH_KAFKA_BOOTSTRAP=settings.kafka_bootstrap or "",
                       CHANNEL_HEALTH_CLICKHOUSE_URL=settings.clickhouse_url)
            with open(log_path, "ab") as log:
                worker = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "worker", "--loglevel", "info"],
                                          env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          **worker_popen_kwargs())
            print(f"worker started (pid {worker.pid}, log {log_path})", flush=True)
        rc = asyncio.run(run(settings, timeout_s, check))
    except WorkerExited as exc:
        print(exc, file=sys.stderr, flush=True)
        rc = 1
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        rc = 130
    finally:
        stop_in_order(worker, broker, lambda line: print(line, flush=True))
    return rc


if __name__ == "__main__":
    sys.exit(main())
