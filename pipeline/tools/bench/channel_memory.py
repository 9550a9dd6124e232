"""Bytes per channel of each window family (issue #34 part 1's measurement; docs/MEMORY.md).

``python -m pipeline.tools.bench.channel_memory CHANNELS EVENTS_PER_CHANNEL``: an
:class:`~pipeline.engine.Engine` in this process takes ``CHANNELS`` channels
(``p{i%7}/m-{i:05d}``, routes of 5) with ``EVENTS_PER_CHANNEL`` ``ok`` events
each, spread over 24 h of event time (all at one time for 1), in event-time
order in batches of 5,000 with the low watermark at each batch's end. It prints
JSON: the engine's RSS growth (psutil) and, per window family of the
:class:`~pipeline.windows.store.WindowStore`, the bytes of its numpy arrays per
channel two ways: ``allocated`` (``nbytes``: the cost once every slot is
written) and ``written_pages`` (4 KiB pages holding a non-zero byte: a lower
bound of what is resident, as Linux maps an anonymous page on its first write).

``python -m pipeline.tools.bench.channel_memory --busy CHANNELS``: the same for busy channels, every slot of
every window written (:func:`busy_times`: 204 events each over 24 h), the "1,000 busy channels" figure.

``python -m pipeline.tools.bench.channel_memory --worker CHANNELS EVENTS_PER_CHANNEL``: the whole worker's
RSS in this process (:func:`measure_worker`: its modules, decoder, dedup, engine and one snapshot capture
of every channel), the figure of issue #34 part 1 (20,000 one-event channels ≤ 1 GB).
"""

from __future__ import annotations

import gc
import json
import sys
from typing import Any

import numpy as np

PAGE = 4096
DAY_MS = 86_400_000
T0 = 1_780_000_000_000 - 1_780_000_000_000 % 3_600_000


def arrays(obj: Any, seen: set[int] | None = None, depth: int = 0) -> list[np.ndarray]:
    """The numpy arrays reachable from ``obj`` through attributes, lists, tuples and dict values (4 levels).

    >>> class A: pass
    >>> a = A(); a.x = np.zeros(3); a.y = [np.ones(2), {"k": np.zeros(1)}]
    >>> sorted(x.size for x in arrays(a))
    [1, 2, 3]
    """
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 4:
        return []
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return [obj]
    if isinstance(obj, (list, tuple)):
        items: list[Any] = list(obj)
    elif isinstance(obj, dict):
        items = list(obj.values())
    elif hasattr(obj, "__dict__"):
        items = list(vars(obj).values())
    else:
        items = [getattr(obj, s) for s in getattr(obj, "__slots__", ()) if hasattr(obj, s)]
    return [a for x in items for a in arrays(x, seen, depth + 1)]


def owners(arrs: list[np.ndarray]) -> list[np.ndarray]:
    """``arrs`` less the views of another array in ``arrs`` (a ring's ``counts`` / ``hist`` are views of its
    slot-major cells: counted once, as the contiguous array that holds the memory).

    >>> a = np.zeros((2, 3)); [x.shape for x in owners([a, a.T, np.ones(1)])]
    [(2, 3), (1,)]
    """
    ids = {id(a) for a in arrs}
    return [a for a in arrs if a.base is None or id(a.base) not in ids]


def written_bytes(a: np.ndarray) -> int:
    """Bytes in the 4 KiB pages of ``a``'s buffer that hold a non-zero byte (whole ``nbytes`` when small or
    not contiguous).

    >>> z = np.zeros(4 * 4096, np.uint8); z[5000] = 1
    >>> written_bytes(z)
    4096
    """
    if a.nbytes < PAGE or not a.flags.c_contiguous:
        return int(a.nbytes)
    b = a.reshape(-1).view(np.uint8)
    n = b.size // PAGE
    return int(b[:n * PAGE].reshape(n, PAGE).any(axis=1).sum()) * PAGE + int(b.size - n * PAGE)


def families(store: Any) -> dict[str, Any]:
    """The window families of a :class:`~pipeline.windows.store.WindowStore`, by name."""
    fam: dict[str, Any] = {"short": store.short}
    fam.update({f"ext:{name}": ext for name, ext in store.extensions.items()})
    return fam


def busy_times() -> list[int]:
    """Event times of a busy channel (``--busy``): one event per 10 min over 24 h (every hourly slot of
    the baselines written), then one per 10 s over the last 10 min (every 10 s and 30 s slot of the short
    windows written): 204 events, every window slot a channel has written. Its windows hold what any
    busier channel's hold (a ring's memory depends on the slots written, not on the events in them)."""
    day = [T0 + k * 600_000 for k in range(144)]
    return day + [day[-1] + 600_000 + k * 10_000 for k in range(60)]


def measure(n_channels: int, per_channel: int, busy: bool = False) -> dict[str, Any]:
    """The figures described in the module docstring (``busy``: :func:`busy_times` for every channel)."""
    import psutil

    from pipeline.contracts import RequestEvent
    from pipeline.engine import Engine

    proc = psutil.Process()
    engine = Engine()
    gc.collect()
    rss0 = proc.memory_info().rss
    if busy:
        times = busy_times()
        per_channel = len(times)
        for j in range(0, len(times), max(5_000 // n_channels, 1)):  # batches of whole time steps, as generated
            batch = [RequestEvent(event_id=f"e{k}-{i}", ts_ms=ts + i, channel=f"p{i % 7}/m-{i:05d}", route=f"r{i // 5}",
                                  status="ok", latency_ms=100.0 + (i + k) % 50 * 7)
                     for k, ts in enumerate(times[j:j + max(5_000 // n_channels, 1)], j) for i in range(n_channels)]
            engine.process(batch, low_watermark_ms=batch[-1].ts_ms, fields=engine.read_fields(batch))
    else:
        events = [RequestEvent(event_id=f"e{k}-{i}", ts_ms=T0 + (k * DAY_MS // per_channel if per_channel > 1 else 0)
                               + i, channel=f"p{i % 7}/m-{i:05d}", route=f"r{i // 5}", status="ok",
                               latency_ms=100.0 + (i % 50) * 7)
                  for k in range(per_channel) for i in range(n_channels)]
        events.sort(key=lambda e: e.ts_ms)
        for j in range(0, len(events), 5_000):
            batch = events[j:j + 5_000]
            engine.process(batch, low_watermark_ms=batch[-1].ts_ms, fields=engine.read_fields(batch))
        del events
    del batch
    gc.collect()
    grown = proc.memory_info().rss - rss0
    out: dict[str, Any] = {"channels": n_channels, "events_per_channel": per_channel,
                           "engine_rss_growth_mb": round(grown / 2**20, 1),
                           "rss_per_channel_kb": round(grown / n_channels / 1024, 1), "families": {}}
    for name, obj in families(engine.store).items():
        arrs = owners(arrays(obj))
        out["families"][name] = {"allocated": round(sum(a.nbytes for a in arrs) / n_channels),
                                 "written_pages": round(sum(written_bytes(a) for a in arrs) / n_channels)}
    return out


def measure_worker(n_channels: int, per_channel: int, partitions: int = 8) -> dict[str, Any]:
    """A worker's RSS in this process: the stream worker's modules imported (faust, aiokafka), a
    :class:`~pipeline.engine.batch.BatchProcessor` (decoder, dedup, engine) taking ``n_channels`` channels with
    ``per_channel`` events each as JSON messages of 500 from ``partitions`` input partitions, then one
    snapshot capture of every changed channel, encoded (what the worker copies and publishes, issue #34
    part 1). MiB: ``rss_start`` (modules loaded), ``rss_processed``, ``rss_peak`` (kernel high-water mark,
    through the capture) and ``rss_after_capture`` (records still held, as until they are published)."""
    import time

    import msgspec

    import pipeline.stream.app  # noqa: F401  (the worker's modules: faust, aiokafka, sinks)
    from pipeline.engine.batch import BatchProcessor
    from pipeline.tools.bench.rss import peak_rss_mb, rss_mb

    enc = msgspec.json.Encoder()
    t0 = int(time.time() * 1000) - 25 * 3_600_000  # within the decoder's age bound
    bp = BatchProcessor()
    gc.collect()
    start = rss_mb()
    for k in range(per_channel):
        ts = t0 + (k * DAY_MS // per_channel if per_channel > 1 else 0)
        raws = [enc.encode({"event_id": f"e{k}-{i}", "ts_ms": ts + i % 1000, "channel": f"p{i % 7}/m-{i:05d}",
                            "route": f"r{i // 5}", "status": "ok", "latency_ms": 100.0 + (i % 50) * 7})
                for i in range(n_channels)]
        for j in range(0, n_channels, 500):
            part = raws[j:j + 500]
            bp.process(part, [(j + x) % partitions for x in range(len(part))],
                       [k * n_channels + j + x for x in range(len(part))])
        del raws
    gc.collect()
    processed = rss_mb()
    records = bp.snapshot_capture({p: per_channel * n_channels for p in range(partitions)}, changed_only=True)()
    after = rss_mb()
    return {"channels": n_channels, "events_per_channel": per_channel, "rss_start_mb": round(start, 1),
            "rss_processed_mb": round(processed, 1), "rss_peak_mb": round(peak_rss_mb(), 1),
            "rss_after_capture_mb": round(after, 1), "records": len(records),
            "record_bytes_per_channel": round(sum(len(r[1]) for r in records) / max(len(records), 1))}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--busy"]:
        print(json.dumps(measure(int(sys.argv[2]), 0, busy=True), indent=1))
    elif sys.argv[1:2] == ["--worker"]:
        print(json.dumps(measure_worker(int(sys.argv[2]), int(sys.argv[3])), indent=1))
    else:
        print(json.dumps(measure(int(sys.argv[1]), int(sys.argv[2])), indent=1))
