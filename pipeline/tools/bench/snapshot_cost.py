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

``--changed F`` (0 < F <= 1; trees with change tracking only) also times the
worker's capture path (``BatchProcessor.snapshot_capture(changed_only=True)``
and its encoding, with the refresh share of
:attr:`pipeline.config.StreamTunables.refresh_every_captures`) when a random share
``F`` of the channels changed since the last capture (``changed_*`` figures).
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
    ap.add_argument("--changed", type=float, default=None)
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
    if args.changed is not None:
        out.update(_changed_capture(engine, args.changed, args.repeat))
    print(json.dumps(out))
    return out


def _changed_capture(engine, share: float, repeat: int) -> dict:
    """Median process-time ms of capture + encode through the worker's path when ``share`` of the channels
    changed (seeded choice), and the records' bytes."""
    import numpy as np

    from pipeline.engine.batch import BatchProcessor
    from pipeline.config import StreamTunables

    refresh_every = StreamTunables().refresh_every_captures

    if not 0 < share <= 1:
        raise SystemExit(f"--changed must be in (0, 1], got {share}")
    processor = BatchProcessor(engine)
    rng = np.random.default_rng(0)
    n = engine.store.n_channels
    times, size, records = [], 0, 0
    for k in range(repeat):
        engine.changed[:n] = False
        engine.mark_changed(rng.choice(n, max(1, round(share * n)), replace=False))
        t0 = time.process_time()
        out = processor.snapshot_capture({0: 0}, changed_only=True, refresh_every=refresh_every,
                                         refresh_phase=k % refresh_every)()
        times.append(time.process_time() - t0)
        size, records = sum(len(b) for _, b, _, _ in out), len(out)
    return {"changed_share": share, "changed_records": records, "changed_ms": round(statistics.median(times) * 1e3, 1),
            "changed_bytes": size}


if __name__ == "__main__":
    main()
