"""CPU cost of one full state snapshot: copy + encode every channel (``python -m pipeline.tools.bench.snapshot_cost``).

Loads the bench's seeded snapshots (a msgpack list of ``[channel, bytes]``,
written by the ``warm`` stage: 1,000 channels after 24 h of event time) into
an :class:`~pipeline.engine.Engine`, then times, in process CPU time
(``time.process_time``, so other processes on the machine do not count), the
copy (:func:`pipeline.state.snapshot.copy_state`) and the encoding
(:func:`pipeline.state.snapshot.encode_state`) of every channel, ``--repeat``
times. Prints one JSON line: median ms per full snapshot, µs per channel and
the encoded bytes. Meant for A/B runs of two trees (run it with each tree on
``PYTHONPATH``, interleaved).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main(argv: list[str] | None = None) -> dict:
    """Run the measurement; returns (and prints) the figures. ``--snapshots``: path of the seeded snapshots."""
    import msgspec

    from pipeline.engine import Engine
    from pipeline.state.snapshot import copy_state, decode_snapshot, encode_state, import_channel

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--snapshots", required=True)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    with open(args.snapshots, "rb") as fh:
        seeded = msgspec.msgpack.decode(fh.read())
    engine = Engine()
    for _, blob in seeded:
        import_channel(engine, decode_snapshot(blob))
    rows = list(range(engine.store.n_channels))
    copy_s, encode_s, size = [], [], 0
    for _ in range(args.repeat):
        t0 = time.process_time()
        frozen = copy_state(engine, rows)
        t1 = time.process_time()
        blobs = [encode_state(s) for s in frozen]
        t2 = time.process_time()
        copy_s.append(t1 - t0)
        encode_s.append(t2 - t1)
        size = sum(map(len, blobs))
    n = len(rows)
    copy_ms, encode_ms = statistics.median(copy_s) * 1e3, statistics.median(encode_s) * 1e3
    out = {"channels": n, "copy_ms": round(copy_ms, 1), "encode_ms": round(encode_ms, 1),
           "total_ms": round(copy_ms + encode_ms, 1), "us_per_channel": round((copy_ms + encode_ms) * 1e3 / n, 1),
           "bytes": size}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
