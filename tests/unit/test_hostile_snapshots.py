"""Typed, bounded snapshot decode (issue #30 item 3; SPEC §8).

Guarantees checked: a state-topic record that breaks the snapshot contract (a wrong-typed or
out-of-range field, truncated bytes, a zlib or LZ4 bomb, arrays that do not fit the engine's layout)
is refused with ``SnapshotError`` before the engine changes, counted, logged once (bounded in a
flood), and its channel starts fresh: it then publishes exactly the verdicts of a channel that never
had a snapshot; a restart restoring the same bytes again does not crash either; a tombstone clears a
bad record at the loader; mutated bytes of any readable version restore in range or are refused.
"""

from __future__ import annotations

import logging
import math
import tracemalloc
import zlib
from functools import lru_cache
from pathlib import Path

import lz4.block
import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pipeline.contracts import RequestEvent
from pipeline.engine import Engine
from pipeline.metrics import PipelineMetrics
from pipeline.policy.state_machine import ChannelMachine
from pipeline.state.refusals import BURST
from pipeline.state.snapshot import (COMPRESSED_MARK, SnapshotError, decode_snapshot, export_channel,
                                     import_channel, to_state)
from pipeline.state.wire import ChannelSnapshot, MachineWire
from pipeline.engine.batch import BatchProcessor
from pipeline.stream.state_topic import fold_record, parse_offsets_header, parse_partition_header

DATA = Path(__file__).parents[1] / "data"
HOUR = 3_600_000
T0 = 1_750_000_000_000 - 1_750_000_000_000 % HOUR
NOW = T0 + HOUR  # the processors' wall clock: the events below are recent
_enc = msgspec.json.Encoder()
STATES = ("healthy", "degraded", "open", "half_open", "recovering", "no_data")


def _events(start_ms: int, seconds: int, fail_every: int = 0) -> list[RequestEvent]:
    return [RequestEvent(event_id=f"x{start_ms + k * 1000}", ts_ms=start_ms + k * 1000, channel="x", route="r",
                         status="error" if fail_every and k % fail_every == 0 else "ok",
                         latency_ms=100.0 + k % 37, tier="paid", ttft_ms=20.0 + k % 5, cost_usd=0.001,
                         quota_remaining=0.5)
            for k in range(seconds)]


@lru_cache(maxsize=1)
def good_record() -> bytes:
    """A fresh export (version 3) of channel x after 4 minutes of traffic with some failures."""
    eng = Engine()
    eng.process((batch := _events(T0, 240, fail_every=9)), low_watermark_ms=0, fields=eng.read_fields(batch))
    return export_channel(eng, 0)


def _fields(raw: bytes) -> dict:
    """A version-3 record as plain msgpack data."""
    assert raw[:1] == COMPRESSED_MARK
    return msgspec.msgpack.decode(lz4.block.decompress(raw[1:]))


def _record(fields: dict) -> bytes:
    return COMPRESSED_MARK + lz4.block.compress(msgspec.msgpack.encode(fields), store_size=True)


def _with(path: tuple[str, ...], value) -> bytes:
    d = _fields(good_record())
    target = d
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    return _record(d)


# --- end to end: refused, counted, logged once, the channel starts fresh ---------------------------

def _messages() -> list[bytes]:
    return [_enc.encode(e) for e in _events(T0 + 300_000, 180, fail_every=7)]


def _run(snapshot: bytes | None) -> BatchProcessor:
    proc = BatchProcessor(clock_ms=lambda: NOW)
    if snapshot is not None:
        proc.load_snapshots({"x": (snapshot, {0: 5}, 0)}, assigned={0})
    msgs = _messages()
    proc.verdicts = proc.process(msgs, partitions=[0] * len(msgs), offsets=list(range(100, 100 + len(msgs)))).verdicts
    return proc


@lru_cache(maxsize=1)
def fresh_verdicts() -> list[bytes]:
    got = [_enc.encode(v) for v in _run(None).verdicts]
    assert len(got) >= 5 and {msgspec.json.decode(v)["seq"] for v in got} >= {1, 2, 3}
    return got


def _assert_refused_and_fresh(bad: bytes, caplog) -> None:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pipeline.engine.batch"):
        proc = _run(bad)
    assert proc.bad_snapshots == 1 and proc.restored == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "pipeline.engine.batch"]
    assert len(lines) == 1 and "snapshot of channel 'x' refused" in lines[0], lines
    assert [_enc.encode(v) for v in proc.verdicts] == fresh_verdicts()  # fresh, then normal verdicts


def test_the_good_record_restores_and_differs_from_a_fresh_start():
    """Control: the unmodified record is restored (so what the other tests refuse is the change)."""
    proc = _run(good_record())
    assert proc.restored == 1 and proc.bad_snapshots == 0
    assert [_enc.encode(v) for v in proc.verdicts] != fresh_verdicts()


@pytest.mark.parametrize("field", [f for f in ChannelSnapshot.__struct_fields__])
def test_a_wrong_typed_snapshot_field_is_refused(field, caplog):
    _assert_refused_and_fresh(_with((field,), [[1]]), caplog)


@pytest.mark.parametrize("field", [f for f in MachineWire.__struct_fields__])
def test_a_wrong_typed_machine_field_is_refused(field, caplog):
    """``machine.weight = "abc"`` (the issue's case) and every other machine field as a string."""
    with pytest.raises(SnapshotError):
        import_channel(Engine(), decode_snapshot(_with(("machine", field), "abc")))
    _assert_refused_and_fresh(_with(("machine", field), "abc"), caplog)


@pytest.mark.parametrize("path,value", [
    (("machine", "weight"), math.nan), (("machine", "weight"), math.inf), (("machine", "weight"), -0.1),
    (("machine", "weight"), 1.5), (("machine", "penalty"), -1.0), (("machine", "penalty"), math.inf),
    (("machine", "base_requests"), math.nan), (("machine", "state"), "exploded"),
    (("machine", "entered_ms"), -1), (("machine", "entered_ms"), 2 ** 62),
    (("machine", "reasons"), ["error_rate"] * 17), (("machine", "reasons"), ["e" * 65]),
    (("seq",), 2 ** 60), (("seq",), -1), (("run",), 2 ** 40), (("last_ts_ms",), 2 ** 62),
    (("watermark_ms",), -5), (("fail_since_eval",), math.nan), (("judged_since_eval",), -1.0),
    (("n_buckets",), 0), (("channel",), ""), (("channel",), "y"), (("route",), "r" * 513),
    (("tier",), "gold"), (("active",), {f"s{i}": True for i in range(65)}),
    (("route_shares",), {"version": 1, "shares": {"x": 2.0}, "round_ms": T0}),
])
def test_an_out_of_range_value_is_refused(path, value, caplog):
    """NaN / inf / negative weight, an unknown state, a huge seq, ...; a record of key x holding channel y."""
    _assert_refused_and_fresh(_with(path, value), caplog)


@pytest.mark.parametrize("cut", [1, 5, 40, 200, -1])
def test_truncated_bytes_are_refused(cut, caplog):
    raw = good_record()
    with pytest.raises(SnapshotError):
        decode_snapshot(raw[:cut])
    _assert_refused_and_fresh(raw[:cut], caplog)


def test_a_restart_restoring_the_same_bad_bytes_does_not_crash(caplog):
    """The issue's crash loop: every new processor (a restart) restoring the bad record refuses it."""
    bad = _with(("machine", "weight"), "abc")
    for _ in range(3):
        _assert_refused_and_fresh(bad, caplog)


# --- bounded decompression --------------------------------------------------------------------------

@lru_cache(maxsize=1)
def zlib_bomb() -> bytes:
    """1 GiB of zeros, zlib-compressed while streaming (about 1 MB)."""
    c = zlib.compressobj(9)
    block = bytes(1 << 20)
    return b"".join([*(c.compress(block) for _ in range(1024)), c.flush()])


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_zlib_bomb_in_a_version_2_array_is_refused_in_little_memory():
    d = msgspec.msgpack.decode((DATA / "snapshot_v2.msgpack").read_bytes())
    d["counters"]["judged"] = zlib_bomb()
    raw = msgspec.msgpack.encode(d)

    def restore():
        with pytest.raises(SnapshotError, match="exactly 120 bytes"):
            import_channel(Engine(), decode_snapshot(raw))

    assert _peak_bytes(restore) < 50 << 20  # the unbounded inflate took 1 GiB here


@pytest.mark.parametrize("claimed", [60 << 20, (1 << 32) - 1])
def test_an_lz4_block_claiming_a_huge_size_is_refused_before_allocating(claimed):
    raw = COMPRESSED_MARK + claimed.to_bytes(4, "little") + lz4.block.compress(b"\x00" * 1000, store_size=False)

    def decode():
        with pytest.raises(SnapshotError):
            decode_snapshot(raw)

    assert _peak_bytes(decode) < 50 << 20


def test_signal_windows_shaped_unlike_the_engine_are_refused_before_unpacking():
    d = _fields(good_record())
    name, arrays = next(iter(d["extensions"].items()))
    key, (dtype, shape, packed) = next(iter(arrays.items()))
    d["extensions"][name][key] = [dtype, [1 << 20, 1 << 20], packed]
    with pytest.raises(SnapshotError, match="refused"):
        import_channel(Engine(), decode_snapshot(_record(d)))
    d["extensions"][name][key] = [dtype, [shape[0] + 1, *shape[1:]], packed + packed[: len(packed) // shape[0]]]
    eng = Engine()
    with pytest.raises(SnapshotError, match="engine"):
        import_channel(eng, decode_snapshot(_record(d)))
    assert eng.store.n_channels == 0


def test_a_refused_state_leaves_no_trace_in_the_engine():
    """Checked before anything is mutated: no channel registered, no machine, no window written."""
    good = to_state(decode_snapshot(good_record()), 30, 25, 3, 10)
    eng = Engine()
    bad_machine = dict(good.machine, weight="abc")
    with pytest.raises(ValueError, match="weight"):
        eng.state.import_state(type(good)(**{**vars(good), "machine": bad_machine}))
    ext = dict(good.windows.extensions)
    last = list(ext)[-1]
    ext[last] = {k: a[:-1] for k, a in ext[last].items()}  # the last signal's rows are short
    windows = type(good.windows)(**{**vars(good.windows), "extensions": ext})
    with pytest.raises(ValueError):
        eng.state.import_state(type(good)(**{**vars(good), "windows": windows}))
    assert eng.store.n_channels == 0 and eng.channel_rows == {}


def test_reasons_the_engine_does_not_know_are_dropped_and_counted():
    eng = Engine()
    i = import_channel(eng, decode_snapshot(_with(("machine", "reasons"), ["error_rate", "retired_signal"])))
    assert eng.machines[i].reasons == ["error_rate"] and eng.state.dropped_state == {"reason retired_signal": 1}


def test_machine_wire_has_the_machine_fields_and_defaults():
    assert msgspec.structs.asdict(MachineWire()) == vars(ChannelMachine())


# --- evicted channels: the same decode on return --------------------------------------------------

def test_a_bad_held_record_starts_the_channel_windows_empty_on_its_return(caplog):
    """A record of an idle channel is held (windows left in the bytes); broken windows are refused when
    its next event brings it back, counted in the engine and the processor's metric, never raised."""
    d = _fields(good_record())
    d["watermark_ms"] = d["last_ts_ms"] + 2 * HOUR  # idle for longer than evict_idle_ms: held
    d["base_hist"] = d["base_hist"][:-4]
    proc = BatchProcessor(clock_ms=lambda: NOW + 3 * HOUR)
    assert proc.load_snapshots({"x": (_record(d), {}, 0)}, assigned={0}) == 1
    assert "x" in proc.engine.residency.evicted
    msgs = [_enc.encode(e) for e in _events(d["watermark_ms"] + 1000, 60)]
    with caplog.at_level(logging.WARNING, logger="pipeline.engine.residency"):
        out = proc.process(msgs, partitions=[0] * len(msgs), offsets=list(range(len(msgs))))
    assert proc.engine.residency.bad_snapshots == 1 and proc.refused_snapshots == 1 and out.verdicts
    assert [r.getMessage() for r in caplog.records if r.name == "pipeline.engine.residency"] == [
        "evicted snapshot of channel 'x' refused (corrupt or mismatched snapshot array: 33396 bytes, shape "
        "(25, 334) of <f4 needs 33400); its windows start empty"]
    m = PipelineMetrics()
    m.track_processor(lambda: proc)
    assert m.registry.get_sample_value("channel_health_snapshots_refused_total") == 1


# --- logged once, not a flood -----------------------------------------------------------------------

def test_a_flood_of_bad_records_is_counted_in_full_and_logged_in_a_bounded_number_of_lines(caplog):
    bad = _with(("machine", "weight"), "abc")
    records = {f"c{i}": (bad, {}, 0) for i in range(1000)}
    proc = BatchProcessor(clock_ms=lambda: NOW)
    with caplog.at_level(logging.WARNING, logger="pipeline.engine.batch"):
        proc.load_snapshots(records, assigned={0})
    lines = [r.getMessage() for r in caplog.records if r.name == "pipeline.engine.batch"]
    assert proc.bad_snapshots == 1000 and proc.engine.store.n_channels == 0
    assert len(lines) == BURST + 1
    assert lines[0].startswith("snapshot of channel 'c0' refused (")
    assert lines[-1] == f"{1000 - BURST} more snapshots refused and not logged one by one (1000 refused in all)"
    m = PipelineMetrics()
    m.track_processor(lambda: proc)
    assert m.registry.get_sample_value("channel_health_snapshots_refused_total") == 1000


# --- the state-topic loader ------------------------------------------------------------------------

def test_a_tombstone_clears_a_bad_record_at_the_loader():
    out: dict = {}
    bad = _with(("machine", "weight"), "abc")
    fold_record(out, b"x", good_record(), [("input_offsets", b'{"0":4}'), ("input_partition", b"0")])
    fold_record(out, b"x", bad, [("input_offsets", b'{"0":9}')])
    fold_record(out, b"y", good_record(), None)
    fold_record(out, None, bad, None)  # no key: skipped
    assert out["x"] == (bad, {0: 9}, None) and set(out) == {"x", "y"}
    fold_record(out, b"x", None, None)  # the tombstone
    assert set(out) == {"y"}
    fold_record(out, b"x", good_record(), None)
    assert out["x"] == (good_record(), {}, None)


@pytest.mark.parametrize("value", [b"[" * 100_000, b'{"0": 1e400}', b'{"-1": 3}', b'{"0": true}',
                                   b'{"99999999999": 1}', b'{"0": 99999999999999999999}', b"{}" + b" " * (1 << 18)])
def test_a_malformed_offsets_header_reads_as_absent(value):
    assert parse_offsets_header([("input_offsets", value)]) == {}


@pytest.mark.parametrize("value", [b"9" * 50, b"-1", b"3.0", b"\xff"])
def test_a_malformed_partition_header_reads_as_absent(value):
    assert parse_partition_header([("input_partition", value)]) is None


# --- fuzz: mutated bytes restore in range or are refused, never anything else ---------------------

def _sources() -> list[bytes]:
    v3_plain = msgspec.msgpack.encode(_fields(good_record()))
    return [(DATA / "snapshot_v1.msgpack").read_bytes(), (DATA / "snapshot_v2.msgpack").read_bytes(), v3_plain]


SOURCES = _sources()


def _check_restore(raw: bytes) -> None:
    eng = Engine()
    try:
        i = import_channel(eng, decode_snapshot(raw))
    except SnapshotError:
        assert eng.store.n_channels == 0
        return
    m = eng.machines[i]
    assert m.state in STATES and 0.0 <= m.weight <= 1.0
    for v in (m.penalty, m.base_requests, m.base_failures):
        assert type(v) is float and math.isfinite(v) and v >= 0
    for v in (m.entered_ms, m.last_step_ms, m.penalty_ms, m.left_open_ms, m.base_ms, eng.seq[i]):
        assert type(v) is int and 0 <= v <= 1 << 53
    assert all(type(r) is str for r in m.reasons) and len(m.reasons) <= 16
    eng.evaluate(int(eng.store.last_ts_ms[i]) + 60_000)  # and the engine runs a round with it


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(src=st.sampled_from(range(len(SOURCES))),
       edits=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.floats(0, 1)), compress=st.booleans())
def test_fuzzed_snapshots_restore_in_range_or_are_refused(src, edits, cut, compress):
    raw = bytearray(SOURCES[src])
    for at, byte in edits:
        raw[int(at * len(raw))] = byte
    if cut is not None:
        raw = raw[: int(cut * len(raw))]
    raw = bytes(raw)
    _check_restore(raw)
    if compress:  # the same bytes as a compressed record
        _check_restore(COMPRESSED_MARK + lz4.block.compress(raw, store_size=True))


def test_the_fixtures_and_a_fresh_export_restore_in_range():
    for raw in [*SOURCES, good_record()]:
        _check_restore(raw)
    assert decode_snapshot(good_record()).machine.state in STATES
    assert np.isfinite(np.frombuffer(decode_snapshot(good_record()).base_hist, np.float32)).all()


_PATHS = [("machine", f) for f in MachineWire.__struct_fields__] + [(f,) for f in ChannelSnapshot.__struct_fields__]
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 63), 2 ** 64 - 1), st.floats(),
                    st.text(max_size=8), st.binary(max_size=8), st.lists(st.integers(-5, 5), max_size=3),
                    st.dictionaries(st.text(max_size=3), st.integers(-5, 5), max_size=2))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(src=st.sampled_from([1, 2]), changes=st.lists(st.tuples(st.sampled_from(_PATHS), _VALUES), min_size=1,
                                                        max_size=3))
def test_fuzzed_snapshot_fields_restore_in_range_or_are_refused(src, changes):
    """Structured mutation: any field (machine fields included) set to any msgpack value."""
    d = msgspec.msgpack.decode(SOURCES[src])
    for path, value in changes:
        target = d["machine"] if len(path) == 2 else d
        if isinstance(target, dict):  # (the machine itself may have been replaced by a change before)
            target[path[-1]] = value
    _check_restore(msgspec.msgpack.encode(d))
