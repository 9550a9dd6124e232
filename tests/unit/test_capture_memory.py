"""A worker's snapshot capture holds a sparse channel's written slots, not its whole rows (issue #34 part 1).

The worker copies every changed channel (:func:`pipeline.state.snapshot.copy_state`) and encodes the copies
later in another thread; with 20,000 one-event channels the dense copies (~80 KB each) took the worker from
0.4 GB to 2 GB of RSS (docs/MEMORY.md). The copies are packed (:class:`FrozenState`): the bound below is the
deterministic byte count of a one-event channel's packed windows, and the encoded snapshot stays the same
bytes for sparse and busy channels alike (snapshots stay compatible).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pipeline.contracts import RequestEvent
from pipeline.engine import Engine
from pipeline.state.snapshot import FrozenState, copy_state, encode_state

HOUR = 3_600_000
T0 = 1_780_000_000_000 - 1_780_000_000_000 % HOUR

#: A one-event channel's captured windows, bytes: its 1-D rows kept whole (slot ids and 10 s counters, about
#: 4.2 KB with today's signals) plus one written slot of each 2-D ring array (a 334-bucket latency histogram
#: row is 1,336 B). The dense copy held 79,824 B (the sum of its rows' ``nbytes``).
SPARSE_CAPTURE_BYTES = 6_144


def _held_bytes(obj: object, seen: set[int] | None = None) -> int:
    """Bytes of the numpy arrays and ``bytes`` reachable from ``obj`` (dataclass fields, dicts, lists)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, bytes):
        return len(obj)
    if isinstance(obj, dict):
        return sum(_held_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_held_bytes(v, seen) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(_held_bytes(getattr(obj, f.name), seen) for f in dataclasses.fields(obj))
    return 0


def _engine(events: list[RequestEvent]) -> Engine:
    eng = Engine()
    events = sorted(events, key=lambda e: e.ts_ms)
    for j in range(0, len(events), 500):
        batch = events[j:j + 500]
        eng.process(batch, low_watermark_ms=batch[-1].ts_ms, fields=eng.read_fields(batch))
    return eng


def _busy(channel: str, n: int = 480) -> list[RequestEvent]:
    """``n`` events over 24 h: every hourly and many 30 s slots written, errors and a latency spread."""
    return [RequestEvent(event_id=f"{channel}-{k}", ts_ms=T0 + k * (24 * HOUR // n), channel=channel, route="r",
                         status="error" if k % 7 == 0 else "ok", error_type="upstream_5xx" if k % 7 == 0 else None,
                         latency_ms=50.0 + (k * 37) % 2000)
            for k in range(n)]


def test_a_one_event_channels_capture_holds_a_few_kb_and_encodes_the_same_bytes() -> None:
    eng = _engine([RequestEvent(event_id="e1", ts_ms=T0, channel="p/m", route="r", status="ok", latency_ms=120.0)])
    dense = eng.state.export_state(0)
    [frozen] = copy_state(eng, [0])
    assert _held_bytes(dense.windows) == 79_824  # what the dense copy held (and old copy_state kept)
    assert _held_bytes(frozen) <= SPARSE_CAPTURE_BYTES
    assert encode_state(frozen) == encode_state(dense)


def test_a_busy_channels_capture_round_trips_bit_for_bit() -> None:
    eng = _engine(_busy("p/busy"))
    dense = eng.state.export_state(0)
    frozen = FrozenState.of(eng.state.export_state(0))
    thawed = frozen.thaw()
    assert thawed.windows.extensions.keys() == dense.windows.extensions.keys()
    for name, arrays in dense.windows.extensions.items():
        for key, a in arrays.items():
            got = thawed.windows.extensions[name][key]
            assert got.dtype == a.dtype and got.shape == a.shape and got.tobytes() == a.tobytes(), (name, key)
    assert thawed.windows.counters.keys() == dense.windows.counters.keys()
    assert np.array_equal(thawed.windows.short_slot_id, dense.windows.short_slot_id)
    assert encode_state(frozen) == encode_state(dense)
    # busy: 24 h of events write 24 of the latency baseline's 25 hourly slots
    assert int(dense.windows.extensions["latency_p95_ratio"]["base.hist"].any(axis=1).sum()) == 24


def test_bytes_outside_the_held_slots_and_negative_zeros_survive_the_capture() -> None:
    # a restored snapshot may hold a value in a slot whose id is -1; -0.0 is a non-zero byte pattern
    eng = _engine([RequestEvent(event_id="e1", ts_ms=T0, channel="p/m", route="r", status="ok", latency_ms=120.0)])
    state = eng.state.export_state(0)
    hist = state.windows.extensions["latency_p95_ratio"]["base.hist"]
    hist[7, 3] = 2.5
    hist[11, 0] = -0.0
    thawed = FrozenState.of(state).thaw().windows.extensions["latency_p95_ratio"]["base.hist"]
    assert thawed.tobytes() == hist.tobytes()
    assert thawed[7, 3] == 2.5 and np.signbit(thawed[11, 0])


def _reference_blob(state) -> bytes:  # noqa: ANN001 - the packing FrozenState documents, written out plainly
    w = state.windows
    items = [w.short_slot_id, *w.counters.values(), *(a for arrays in w.extensions.values() for a in arrays.values())]
    out = b""
    for a in items:
        if a.nbytes < 256 or a.ndim < 2:
            out += a.tobytes()
            continue
        rows = [i for i in range(a.shape[0]) if any(a[i].tobytes())]
        out += len(rows).to_bytes(2, "little") + np.array(rows, np.uint16).tobytes() + a[rows].tobytes()
    return out


def test_fully_written_and_odd_sized_rows_pack_as_documented() -> None:
    # every row written (a busy channel's short rings: packed whole), 12- and 20-byte rows (read as uint32)
    # with only a -0.0 or a NaN in a row: each array's count, row indices and rows, byte for byte
    eng = _engine(_busy("p/busy"))
    state = eng.state.export_state(0)
    ext = state.windows.extensions
    ext["latency_p95_ratio"]["short.hist"][:] = 1.0
    ext["quality"]["short.counts"][4, 2] = -0.0
    ext["quota"]["minute.counts"][31, 0] = np.nan
    frozen = FrozenState.of(state)
    assert frozen.blob == _reference_blob(state)
    thawed = frozen.thaw().windows.extensions
    assert thawed["latency_p95_ratio"]["short.hist"].tobytes() == ext["latency_p95_ratio"]["short.hist"].tobytes()
    assert np.signbit(thawed["quality"]["short.counts"][4, 2]) and np.isnan(thawed["quota"]["minute.counts"][31, 0])
    assert encode_state(frozen) == encode_state(state)


def test_a_busy_channel_is_captured_as_exported_and_a_sparse_one_packed() -> None:
    # packing a busy channel saves little (24 of the latency baseline's 25 hourly rows are written) for ~2x the
    # capture's CPU on the worker's event loop: copy_state keeps its export; a one-event channel stays packed
    eng = _engine(_busy("p/busy") + [RequestEvent(event_id="one", ts_ms=T0 + 24 * HOUR - 1, channel="p/one",
                                                  route="r", status="ok", latency_ms=120.0)])
    busy_row, one_row = (list(eng.store.names).index(c) for c in ("p/busy", "p/one"))
    busy, one = copy_state(eng, [busy_row, one_row])
    assert not isinstance(busy, FrozenState) and isinstance(one, FrozenState)
    assert _held_bytes(one) <= SPARSE_CAPTURE_BYTES
    assert encode_state(busy) == encode_state(eng.state.export_state(busy_row))
    assert encode_state(one) == encode_state(eng.state.export_state(one_row))
