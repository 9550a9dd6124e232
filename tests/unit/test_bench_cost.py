"""The arithmetic and parsing of ``make bench-cost`` (:mod:`pipeline.tools.bench.cost`); no valgrind run here.

The counted figure itself is recorded in docs/THROUGHPUT.md; these tests check that a callgrind run's dumps
are read as the measured part, and that a run whose marker fired the wrong number of times is refused.
"""

from __future__ import annotations

import pytest

from pipeline.tools.bench.cost import CostOptions, DumpPart, measured_instructions, parse_dump, spread

#: The head of a real dump of ``valgrind --tool=callgrind --dump-before=getppid`` (valgrind 3.19), cut short.
DUMP = """# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 2344
cmd:  /work/main/.venv/bin/python -S -c import os; os.getppid()
part: 2


desc: I1 cache: 
desc: Timerange: Basic block 4711 - 1234567
desc: Trigger: --dump-before=getppid

positions: line
events: Ir
summary: 17776817


ob=(1) /lib/x86_64-linux-gnu/libc.so.6
fl=(1) ???
fn=(1) getppid
0 5
totals: 17776817
"""


def test_parse_dump_reads_part_trigger_and_ir() -> None:
    assert parse_dump(DUMP) == DumpPart(2, "--dump-before=getppid", 17_776_817)


def test_parse_dump_takes_ir_among_several_events() -> None:
    text = "part: 1\ndesc: Trigger: Program termination\nevents: Dr Ir Dw\nsummary: 7 123456 9\n"
    assert parse_dump(text).instructions == 123_456


@pytest.mark.parametrize("text", ["part: 1\nevents: Ir\nsummary: 5\n",  # no trigger
                                  "part: 1\ndesc: Trigger: x\nevents: Dr\nsummary: 5\n",  # no Ir
                                  "hello\n"])
def test_parse_dump_refuses_what_is_not_a_full_dump(text: str) -> None:
    with pytest.raises(ValueError):
        parse_dump(text)


def test_measured_part_is_the_second_marker_dump_whatever_the_file_order() -> None:
    parts = [DumpPart(3, "Program termination", 7_000), DumpPart(2, "--dump-before=getppid", 1_014_000),
             DumpPart(1, "--dump-before=getppid", 2_000_000_000)]
    assert measured_instructions(parts) == 1_014_000
    assert measured_instructions(parts) / CostOptions().events(60.0) == 42.25


@pytest.mark.parametrize("n_marked", [0, 1, 3])
def test_a_marker_fired_other_than_twice_is_refused(n_marked: int) -> None:
    parts = [DumpPart(k + 1, "--dump-before=getppid", 10) for k in range(n_marked)]
    parts.append(DumpPart(n_marked + 1, "Program termination", 10))
    with pytest.raises(ValueError, match=f"found {n_marked}"):
        measured_instructions(parts)


def test_spread_is_range_over_median() -> None:
    assert spread([42_000.0, 42_210.0, 42_105.0]) == pytest.approx(210 / 42_105)
    assert spread([5.0]) == 0.0
    with pytest.raises(ValueError):
        spread([])


def test_workload_sizes_are_whole_batches() -> None:
    opts = CostOptions(channels=7, rps_per_channel=3.0, batch_size=500)
    assert opts.events(60.0) == 1_000  # 1,260 events of event time, cut to two 500-event batches
    assert CostOptions().events(40.0) == 16_000
