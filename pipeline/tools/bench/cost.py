"""``make bench-cost``: instructions per event of the processor, a cost figure that does not move with the VM.

The throughput stages measure rates, which swing by tens of per cent with the
shared VM's speed. This counts CPU *instructions* instead, with valgrind's
callgrind (``valgrind --tool=callgrind``): the count of a deterministic program
is the same on any x86-64 machine with the same Python and libraries, so a
change of a few per cent is the code's, not the VM's. (``perf stat -e
instructions`` would be ~100x faster, but needs a hardware counter: a VM
without a virtual PMU, like this one, answers ``<not supported>``.)

What is counted (:func:`workload`, run under callgrind in its own process):

- a fixed, seeded workload (:mod:`pipeline.tools.bench.workload`):
  ``channels`` channels (default 200, routes of 5) at ``rps_per_channel``
  (default 2) requests/s of event time, in 500-event envelopes from one input
  partition, processed by :class:`~pipeline.engine.batch.BatchProcessor` (decode →
  engine → outputs; Kafka-free) with a fixed clock;
- first ``warm_s`` of event time (default 40 s, two evaluation rounds) to
  register every channel and fill its windows: not counted;
- then the measured ``measure_s`` of event time (default 60 s = 24,000 events,
  two 30 s rounds per channel: each round's verdicts are in the figure).

Only the measured part is counted: the workload calls ``os.getppid()`` right
before and right after it, and callgrind runs with ``--dump-before=getppid``,
so the counters are dumped (and zeroed) at each call; the dump between the two
calls holds exactly the instructions of the measured batches (imports, input
generation, the warm-up and exit fall in the other parts). Determinism: a fixed
``PYTHONHASHSEED``, a fixed clock, seeded inputs, one input partition marked as
having a backlog (:meth:`~pipeline.engine.batch.BatchProcessor.set_partition_status`:
else the low watermark's partition-idle rule reads the wall clock, which
callgrind's slowdown on a loaded machine reaches: runs then differed by 0.2 %)
and the worker's garbage-collector settings.

The figure: instructions of the measured part ÷ events in it. Three runs on the
same code agree to well under 1 % (docs/THROUGHPUT.md, "Instructions per event").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

#: The marker callgrind dumps before (``--dump-before``): a libc call nothing on the processing path makes.
MARKER = "getppid"
#: ``PYTHONHASHSEED`` of the counted process (string hashes, hence set and dict orders, fixed).
HASH_SEED = "0"
#: Event time of the first event: a fixed hour + 5 min (2025-11-24 00:05 UTC), never the wall clock.
START_MS = 1_763_942_700_000
#: A change that raises the figure by more than this fraction says why in its commit body (issue #34).
RAISE_NEEDS_REASON = 0.05


@dataclass(frozen=True)
class CostOptions:
    """The counted workload (defaults: docs/THROUGHPUT.md; ~1-2 min per run under callgrind on 2 vCPUs)."""

    channels: int = 200
    rps_per_channel: float = 2.0
    warm_s: float = 40.0
    measure_s: float = 60.0
    batch_size: int = 500

    def events(self, seconds: float) -> int:
        """Events in ``seconds`` of event time, rounded down to whole batches.

        >>> CostOptions().events(60.0)
        24000
        """
        n = int(self.channels * self.rps_per_channel * seconds)
        return n - n % self.batch_size


@dataclass(frozen=True)
class DumpPart:
    """One callgrind dump: its ``part`` number, its trigger line and the instructions (Ir) it holds."""

    part: int
    trigger: str
    instructions: int


def parse_dump(text: str) -> DumpPart:
    """The part number, trigger and total Ir of one callgrind output file's text.

    Raises ``ValueError`` when a field is missing (not a callgrind file, or one without the Ir event).

    >>> parse_dump("version: 1\\npart: 2\\ndesc: Trigger: --dump-before=getppid\\nevents: Ir\\nsummary: 1234\\n")
    DumpPart(part=2, trigger='--dump-before=getppid', instructions=1234)
    """
    part = re.search(r"^part:\s*(\d+)\s*$", text, re.M)
    trigger = re.search(r"^desc:\s*Trigger:\s*(.*?)\s*$", text, re.M)
    events = re.search(r"^events:\s*(.*?)\s*$", text, re.M)
    total = re.search(r"^(?:summary|totals):\s*([\d ]+?)\s*$", text, re.M)
    if not (part and trigger and events and total):
        raise ValueError("not a callgrind dump with part, trigger, events and summary lines")
    names = events.group(1).split()
    if "Ir" not in names:
        raise ValueError(f"callgrind dump without the Ir event (events: {events.group(1)})")
    values = total.group(1).split()
    return DumpPart(int(part.group(1)), trigger.group(1), int(values[names.index("Ir")]))


def measured_instructions(parts: Sequence[DumpPart], marker: str = MARKER) -> int:
    """Instructions between the two marker calls: the part dumped at the second marker call.

    ``parts``: every dump of one run (any order). Exactly two must be triggered by ``--dump-before=<marker>``
    (else the marker was called elsewhere too, or not at all, and the count would not be the measured part's):
    the first holds everything before the measured part, the second the measured part. Raises ``ValueError``.

    >>> p = [DumpPart(3, "Program termination", 5), DumpPart(1, "--dump-before=getppid", 900),
    ...      DumpPart(2, "--dump-before=getppid", 40)]
    >>> measured_instructions(p)
    40
    """
    marked = sorted((p for p in parts if p.trigger == f"--dump-before={marker}"), key=lambda p: p.part)
    if len(marked) != 2:
        raise ValueError(f"expected 2 dumps at the marker {marker!r}, found {len(marked)}")
    return marked[1].instructions


def spread(values: Sequence[float]) -> float:
    """(max - min) / median of ``values`` (a fraction; 0 for one value). Raises ``ValueError`` when empty.

    >>> round(spread([100.0, 101.0, 99.0]), 4)
    0.02
    """
    if not values:
        raise ValueError("no values")
    return (max(values) - min(values)) / statistics.median(values)


def workload(opts: CostOptions) -> tuple[int, int]:
    """The counted program: warm up, call the marker, process the measured batches, call the marker.

    Returns ``(events, verdicts)`` of the measured part.
    """
    from pipeline.engine.batch import BatchProcessor
    from pipeline.stream.runtime import tune_gc
    from pipeline.tools.bench import workload as W
    from pipeline.tools.bench.fill import PartitionBatcher

    ch = W.Channels.make(opts.channels)
    n_warm, n_measure = opts.events(opts.warm_s), opts.events(opts.measure_s)
    evs = W.stream(ch, n_warm + n_measure, START_MS, opts.rps_per_channel, seed=3, id_prefix="cost")
    batcher = PartitionBatcher(1, opts.batch_size)
    msgs = [v for _, v in batcher.add(evs) + batcher.flush()]
    end_ms = max(e["ts_ms"] for e in evs)
    del evs
    warm_msgs = n_warm // opts.batch_size
    processor = BatchProcessor(clock_ms=lambda: end_ms + 1_000)
    # partition 0 has a backlog, as a worker sees mid-stream: the low watermark is its newest event time, never
    # the wall-clock idle rule (callgrind's slowdown on a loaded machine would reach its 10 s and change the path)
    processor.set_partition_status({0: False})
    tune_gc()
    offset = 0

    def feed(batch: list[bytes]) -> None:
        nonlocal offset
        processor.process(batch, [0] * len(batch), list(range(offset, offset + len(batch))))
        offset += len(batch)

    per_call = 8  # messages per process() call, as the bench's profile stage (about one worker batch)
    for i in range(0, warm_msgs, per_call):
        feed(msgs[i:min(i + per_call, warm_msgs)])
    os.getppid()  # marker: callgrind dumps everything so far
    verdicts = processor.verdicts_out
    for i in range(warm_msgs, len(msgs), per_call):
        feed(msgs[i:i + per_call])
    os.getppid()  # marker: the dump of the measured batches
    assert processor.events_in == n_warm + n_measure, processor.events_in
    return n_measure, processor.verdicts_out - verdicts


def count_once(opts: CostOptions, valgrind: str = "valgrind", keep_dir: str | None = None) -> dict[str, Any]:
    """Run :func:`workload` under callgrind once; its measured instructions and instructions per event.

    Raises ``RuntimeError`` when valgrind fails or its dumps are not the expected ones.
    """
    out_dir = Path(keep_dir or tempfile.mkdtemp(prefix="channel-health-cost-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONHASHSEED": HASH_SEED}
    cmd = [valgrind, "--tool=callgrind", f"--dump-before={MARKER}", "--dump-instr=no",
           f"--callgrind-out-file={out_dir}/callgrind.out", sys.executable, "-m", "pipeline.tools.bench.cost",
           "--workload", json.dumps(asdict(opts))]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"valgrind exited with {proc.returncode}: {proc.stderr[-2000:]}")
        events, verdicts = map(int, proc.stdout.strip().splitlines()[-1].split())
        parts = [parse_dump(p.read_text()) for p in sorted(out_dir.glob("callgrind.out*"))]
        try:
            ir = measured_instructions(parts)
        except ValueError as exc:
            raise RuntimeError(f"callgrind dumps in {out_dir}: {exc}") from exc
    finally:
        if keep_dir is None:
            shutil.rmtree(out_dir, ignore_errors=True)
    return {"instructions": ir, "events": events, "verdicts": verdicts,
            "instructions_per_event": round(ir / events, 1)}


def measure(opts: CostOptions, repeat: int = 3, valgrind: str = "valgrind") -> dict[str, Any]:
    """``repeat`` callgrind runs; the median instructions per event and the runs' spread."""
    runs = [count_once(opts, valgrind) for _ in range(repeat)]
    ipe = [r["instructions_per_event"] for r in runs]
    return {"instructions_per_event": statistics.median(ipe), "runs": ipe, "spread": round(spread(ipe), 6),
            "events": runs[0]["events"], "verdicts": runs[0]["verdicts"], "workload": asdict(opts), "python": sys.version.split()[0],
            "method": f"valgrind --tool=callgrind --dump-before={MARKER}, PYTHONHASHSEED={HASH_SEED}"}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pipeline.tools.bench.cost [--repeat N] [--json PATH]`` (``make bench-cost``)."""
    ap = argparse.ArgumentParser(prog="python -m pipeline.tools.bench.cost", description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="callgrind runs (the median is the figure; default 3)")
    ap.add_argument("--json", help="write the result to this file")
    ap.add_argument("--channels", type=int, default=CostOptions.channels)
    ap.add_argument("--measure-s", type=float, default=CostOptions.measure_s,
                    help="event time of the measured part (s)")
    ap.add_argument("--workload", help=argparse.SUPPRESS)  # the counted process itself (JSON CostOptions)
    ns = ap.parse_args(argv)
    if ns.workload:
        print(*workload(CostOptions(**json.loads(ns.workload))))
        return 0
    valgrind = shutil.which("valgrind")
    if not valgrind:
        print("valgrind not found (apt-get install valgrind)", file=sys.stderr)
        return 2
    if not 1 <= ns.repeat <= 9:
        print(f"--repeat must be 1..9, got {ns.repeat}", file=sys.stderr)
        return 2
    res = measure(CostOptions(channels=ns.channels, measure_s=ns.measure_s), ns.repeat, valgrind)
    print(f"instructions per event: {res['instructions_per_event']:,.0f} (median of {len(res['runs'])}: "
          f"{', '.join(f'{v:,.0f}' for v in res['runs'])}; spread {res['spread']:.3%}; "
          f"{res['events']:,} events and {res['verdicts']:,} verdicts measured)")
    if ns.json:
        Path(ns.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
