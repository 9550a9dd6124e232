"""Stage (b): a bare faust agent that does nothing with each message.

Same broker settings and consumer as the real worker
(:func:`pipeline.stream.runtime.faust_broker_kwargs`), raw key/value
serializers, ``async for value in stream: pass`` -- what faust itself costs
per message. Batch envelopes are not even decoded, so for them the figure
is messages/s times the events per message.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

from pipeline.tools.bench.consume import Clock
from pipeline.tools.bench.rss import peak_rss_mb
from pipeline.tools.bench.stage import scratch_dir, stage_main, write_result


def finish(args: dict[str, Any], result: dict[str, Any]) -> None:
    """Write the stage result and leave at once (a bench worker has nothing to commit)."""
    result["peak_rss_mb"] = round(peak_rss_mb(), 1)
    write_result(args, result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_worker(app: Any) -> None:
    """Run a faust app in this process until the stage calls :func:`finish`."""
    from pipeline.stream.runtime import BoundedStopWorker

    sys.argv = [sys.argv[0], "worker"]
    # The worker class of ``channel-health worker`` (no terminal spinner, so the root logger stays at
    # WARNING), for the bare agent as for the pipeline: the ratio compares the agents' code, not logging.
    BoundedStopWorker(app, loglevel="warning", quiet=True).execute_from_commandline()


def faust_app(bootstrap: str, group: str, datadir: str) -> Any:
    """A faust app with the worker's broker settings (no web server, memory store)."""
    import faust

    from pipeline.config import Settings
    from pipeline.stream.runtime import cap_fetch_wait, faust_broker_kwargs

    cap_fetch_wait()  # as the worker does
    settings = Settings(kafka_bootstrap=bootstrap, clickhouse_url="chdb:///unused", consumer_group=group)
    return faust.App(group, store="memory://", datadir=datadir,
                     web_enabled=False, topic_partitions=settings.partitions, consumer_auto_offset_reset="earliest",
                     topic_allow_declare=False, stream_wait_empty=False, **faust_broker_kwargs(settings))


def run(args: dict[str, Any]) -> None:
    app = faust_app(args["bootstrap"], args["group"], scratch_dir(args, "faust-"))
    topic = app.topic(args["topic"], key_serializer="raw", value_serializer="raw")
    expected = int(args["messages"])
    events = int(args["events"])
    clock = Clock()
    start: Callable[[], None] = clock.start

    @app.agent(topic)
    async def bare(stream: Any) -> None:
        async for _value in stream:
            start()
            clock.messages += 1
            if clock.messages >= expected:
                clock.stop()
                clock.events = events
                finish(args, clock.result())

    run_worker(app)


if __name__ == "__main__":
    stage_main(run)
