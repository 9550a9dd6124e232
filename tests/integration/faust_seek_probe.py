"""Subprocess of test_faust_seek_back.py: a faust agent with the worker's runtime options reads
partition 0; after offset 5 it starts a new "generation" whose committed offset is 2 and takes input
through the worker's OffsetGate, seeking back with ``consumer.seek_wait`` on a gap exactly as
``pipeline.stream.app`` does. It records what the gate accepted."""

import asyncio
import json
import os
import sys

from faust.types import TP

from pipeline.tools.bench.bare_faust import faust_app, run_worker
from pipeline.stream.offsets import OffsetGate
from pipeline.stream.runtime import disable_read_offset_filter


def main(bootstrap: str, group: str, topic: str, n: int, out: str, datadir: str) -> None:
    app = faust_app(bootstrap, group, datadir)
    disable_read_offset_filter(app.consumer)  # as the worker does
    src = app.topic(topic, key_serializer="raw", value_serializer="raw")
    accepted: list[int] = []
    state: dict = {"gate": None, "seeks": 0}

    @app.agent(src)
    async def probe(stream):
        async for events in stream.noack_take(4, within=0.2):
            gate = state["gate"]
            if gate is None:
                if max(e.message.offset for e in events) > 5:
                    state["gate"] = OffsetGate({0: 2})  # records 6.. are now "fetched before the seek"
                continue
            gaps = False
            for e in events:
                decision = gate.check(0, e.message.offset)
                if decision == "accept":
                    accepted.append(e.message.offset)
                gaps |= decision == "gap"
            if gaps:
                offset = gate.want_seek(0)
                if offset is not None:
                    state["seeks"] += 1
                    await app.consumer.seek_wait({TP(topic, 0): offset})
            if accepted and accepted[-1] == n - 1:
                with open(out, "w") as fh:
                    json.dump({"accepted": accepted, "seeks": state["seeks"], "gaps": gate.gaps,
                               "skipped_starts": gate.skipped_starts}, fh)
                os._exit(0)

    async def give_up():
        await asyncio.sleep(45)
        with open(out, "w") as fh:
            json.dump({"gave_up": accepted, "seeks": state["seeks"]}, fh)
        os._exit(3)

    app.task(give_up)
    run_worker(app)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6])
