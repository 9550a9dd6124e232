"""Stage (a): the ceiling -- a bare aiokafka consumer that only decodes the messages.

Reads the whole topic from the beginning with ``getmany`` and decodes every
message with msgspec into the contract's :class:`RequestEvent` structs (a
batch envelope into a list of them): the least work any consumer of this
topic must do. No validation beyond the types, no windows, no output.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from pipeline.tools.bench.consume import Clock, open_reader
from pipeline.tools.bench.rss import peak_rss_mb
from pipeline.tools.bench.stage import stage_main
from pipeline.contracts import RequestEvent


class Envelope(msgspec.Struct):
    """A batch envelope decoded straight into contract structs."""

    events: list[RequestEvent]


async def read(bootstrap: str, topic: str, expected_messages: int) -> dict[str, Any]:
    consumer = await open_reader(bootstrap, topic)
    single = msgspec.json.Decoder(RequestEvent)
    batch = msgspec.json.Decoder(Envelope)
    clock = Clock()
    try:
        while clock.messages < expected_messages:
            got = await consumer.getmany(timeout_ms=200, max_records=5_000)
            if not got:
                continue
            clock.start()
            for records in got.values():
                for r in records:
                    v = r.value
                    if v[:10].startswith(b'{"events"'):
                        clock.events += len(batch.decode(v).events)
                    else:
                        single.decode(v)
                        clock.events += 1
                clock.messages += len(records)
            clock.stop()
    finally:
        await consumer.stop()
    return clock.result()


def run(args: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for kind, spec in args["topics"].items():
        out[kind] = asyncio.run(read(args["bootstrap"], spec["topic"], int(spec["messages"])))
    out["peak_rss_mb"] = round(peak_rss_mb(), 1)
    return out


if __name__ == "__main__":
    stage_main(run)
