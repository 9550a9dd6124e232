"""Export / import one channel's complete detector state as bytes.

A snapshot is the wire form of :class:`pipeline.state.channel_state.ChannelState`
(:meth:`pipeline.engine.state_io.StateIO.export_state` / ``import_state``): the
channel's rows of its rings (30 × 10 s counters, 10 × 30 s latency
histograms, 25 × 1 h baseline histograms), its quality-score rings (30 × 10 s and
25 × 1 h of count / sum / sum of squares, with the model version they came
from; SPEC §4.5), its failure run, newest event time, soft-finding flags,
circuit-breaker machine, verdict ``seq``, judged requests since its last round
and its route's traffic shares. Histograms are mostly zeros, so
the record is compressed: a busy channel's snapshot is a few KB (raw ≈ 80 KB).

Versions: 3 (written now) holds the arrays raw (``ndarray.tobytes``) and
compresses the whole msgpack record once with LZ4 (block format, size
stored), prefixed by :data:`COMPRESSED_MARK` (``0xc1``, a byte msgpack never
uses, so a reader tells it from the plain msgpack of older versions): one
fast compression per channel instead of one zlib call per array (about 30
of them), see docs/THROUGHPUT.md. Versions 1 and 2 are plain msgpack with
each array zlib-compressed; they still restore. Version 2 keeps the 10 s counters **by feature name**
(``counters``: name → array), so a snapshot written before a signal added a
counter restores with that counter empty and everything else intact (a
counter the engine no longer keeps is dropped and counted in
``Engine.state.dropped_state``). Version 1 (before 2026-12) kept them positional
in ``short_counts``, in the order of
:data:`pipeline.windows.features.V1_COUNTER_NAMES`; it still restores.
Snapshots written before the quality rings existed load with empty ones;
those written with 30 × 10 s latency histograms (no ``short_lat_slot_id``)
load with them summed into the 30 s slots.

What a channel's next rounds depend on besides those (SPEC §4.2: whether its baselines learn and since
when they are held, its part of the capacity model, its route-wide finding and weight, its re-admission
success run) is in the
``extensions`` entry :data:`ROUND_STATE`, each value only when set: a record without any is the record
written before it existed, byte for byte (no version change: readers of either version read each
other's records during a rolling upgrade; an older reader counts the entry as a dropped window).

Decoding is typed and bounded (SPEC §8): :func:`decode_snapshot` checks every field against the
contract of :mod:`pipeline.state.wire` (types, ranges, sizes) and a compressed record's stated size
against :data:`MAX_RECORD_BYTES` before allocating; :func:`to_state` checks each packed array's size
against the engine's layout before decompressing it, inflates at most that many bytes (a zlib bomb
costs nothing) and refuses NaN or infinity; :meth:`pipeline.engine.state_io.StateIO.import_state` checks the
rest before it changes anything. Whatever breaks the contract raises :class:`SnapshotError`, which
the worker counts, logs (bounded) and answers by starting the channel fresh.

The stream worker publishes snapshots of changed channels to the state topic
and acks input offsets only afterwards, so committed offsets never run ahead
of the saved state (see :mod:`pipeline.stream.app`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import zlib
from typing import Any, Literal, Mapping, Sequence, cast

import lz4.block
import msgspec
import numpy as np

from pipeline.state.channel_state import CapacityRecord, ChannelState, HeldChannel, RoundState, RouteShareRecord
from pipeline.state.wire import ChannelSnapshot, ExtensionDtype, MachineWire, RouteSharesWire
from pipeline.windows.features import V1_COUNTER_NAMES
from pipeline.windows.histogram import LatencyBuckets
from pipeline.windows.ring import coarsen_slots
from pipeline.windows.view import ChannelWindows

SNAPSHOT_VERSION = 3
#: Versions :func:`decode_snapshot` reads.
READABLE_VERSIONS = (1, 2, 3)
#: Versions whose arrays are each zlib-compressed (later ones: raw bytes, the record compressed as a whole).
ZLIB_ARRAY_VERSIONS = (1, 2)
#: First byte of a compressed record (version >= 3): ``0xc1`` is never used by msgpack, so no plain
#: msgpack record starts with it.
COMPRESSED_MARK = b"\xc1"
#: Largest decompressed record accepted (bytes): a busy channel's record is ~80 KB and one of 4096 latency
#: buckets ~1 MB; a corrupt or hostile size header must not allocate more.
MAX_RECORD_BYTES = 8 << 20


#: The signals whose windows a record keeps in top-level fields: the store kept them built in before every
#: signal's windows went through one mechanism (issue #31), and records keep that layout so that workers
#: of either version read each other's snapshots during a rolling upgrade. Signal → array of its
#: windows' rows (:meth:`~pipeline.windows.extension.SignalWindows.export_row`) → field of
#: :class:`~pipeline.state.wire.ChannelSnapshot`; every other signal's arrays go under ``extensions``.
LATENCY, RUNS, QUALITY = "latency_p95_ratio", "consecutive_failures", "quality"
WIRE_FIELDS = {
    LATENCY: {"short.slot_id": "short_lat_slot_id", "short.hist": "short_hist", "base.slot_id": "base_slot_id",
              "base.hist": "base_hist"},
    RUNS: {"run": "run"},
    QUALITY: {"short.slot_id": "quality_short_slot_id", "short.counts": "quality_short_counts",
              "base.slot_id": "quality_base_slot_id", "base.counts": "quality_base_counts", "model": "quality_model"},
}
#: The ``extensions`` entry (not a signal: signal names hold no ``:``) that carries the channel's
#: :class:`~pipeline.state.channel_state.RoundState` and its baselines' hold clock
#: (``ChannelWindows.held_since_ms``), SPEC §4.2. Each array is written only when its value is not the
#: default (``learns``: when it differs from the machine's state; the others: when set), so a record of a
#: channel without any is the record written before they were saved, byte for byte, and older records
#: restore them at their defaults; a reader without it counts the entry as a dropped signal window.
#: Arrays: ``learns`` and ``peer_active`` bool (1,); ``held_since_ms``, ``judged_since_ms``,
#: ``p95_round_ms`` and ``ok_run`` (the re-admission success run, when > 0) int64 (1,); ``usual``,
#: ``max_share``, ``wide_weight``, ``panic_weight``, ``fail_ratio``, ``suspect_sent_ms`` (while suspect)
#: float64 (1,); ``suspect_at_ms`` (with it) and ``suspect_expired_ms`` int64 (1,); ``held`` float64 (k,), k <= 64; ``usual_counts``, ``recent`` float64 (2,); ``p95`` float64
#: (2,): the P95 and its lower bound in ms, -1 for NaN (no P95).
ROUND_STATE = "engine:round"
#: Shapes of the fixed-size arrays of :data:`ROUND_STATE` (``held`` is checked on its own).
_ROUND_LAYOUT = {"learns": (1,), "peer_active": (1,), "held_since_ms": (1,), "judged_since_ms": (1,),
                 "usual": (1,), "max_share": (1,), "wide_weight": (1,), "usual_counts": (2,),
                 "panic_weight": (1,), "fail_ratio": (1,), "recent": (2,), "p95_round_ms": (1,), "p95": (2,),
                 "ok_run": (1,), "suspect_sent_ms": (1,), "suspect_at_ms": (1,),
                 "suspect_expired_ms": (1,)}
_LEARNING = ("healthy", "no_data")  # pipeline.policy.state_machine.LEARNING_STATES (not imported here)

#: ``n_buckets`` of a record whose engine keeps no latency windows (the default bucket mapping's).
DEFAULT_N_BUCKETS = LatencyBuckets().n_buckets


class SnapshotError(ValueError):
    """A snapshot cannot be read or does not fit the configured windows."""


#: dtypes a snapshot's signal windows may hold (anything else is refused as corrupt).
_EXTENSION_DTYPES = frozenset({"<f4", "<f8", "<i8", "<i4", "|b1"})


def _pack(a: np.ndarray) -> bytes:
    """An array's bytes in a current-version record (raw, C order; the record is compressed whole)."""
    return a.tobytes()


def _inflate(b: bytes, size: int) -> bytes:
    """The zlib stream ``b`` decompressed, which must hold exactly ``size`` bytes (>= 0).

    Bounded: never produces more than ``size + 1`` bytes whatever ``b`` claims or holds (a zlib bomb is
    refused after ``size + 1`` bytes of output). Raises :class:`SnapshotError` for a corrupt, truncated,
    longer or shorter stream."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(b, size + 1)
    except zlib.error as exc:
        raise SnapshotError(f"corrupt or mismatched snapshot array: {exc}") from None
    if len(out) != size or d.unconsumed_tail or not d.eof:
        raise SnapshotError(f"corrupt or mismatched snapshot array: zlib stream does not hold exactly {size} bytes")
    return out


def _unpack(b: bytes, dtype: type | np.dtype[Any], shape: tuple[int, ...], zlibbed: bool = False) -> np.ndarray:
    """The array packed in ``b`` (``zlibbed``: a version 1-2 record's zlib-compressed array).

    Read-only when not ``zlibbed`` (a view of the record). The size is that of ``shape`` (checked before
    anything is decompressed or allocated: at most that many bytes are ever inflated), and a float array
    holds only finite numbers. Raises :class:`SnapshotError` when it does not decompress, has not the
    size of ``shape`` or holds NaN or infinity."""
    dt = np.dtype(dtype)
    size = dt.itemsize * math.prod(shape)
    data = _inflate(b, size) if zlibbed else b
    if len(data) != size:
        raise SnapshotError(f"corrupt or mismatched snapshot array: {len(data)} bytes, shape {shape} "
                            f"of {dt.str} needs {size}")
    arr = np.frombuffer(data, dtype=dt).reshape(shape)
    if dt.kind == "f" and not np.isfinite(arr).all():
        raise SnapshotError(f"snapshot array of shape {shape} holds NaN or infinity")
    return arr


def _unpack_extension(name: str, key: str, dtype: str, shape: list[int], b: bytes, zlibbed: bool,
                      layout: Mapping[str, Mapping[str, tuple[int, ...]]] | None) -> np.ndarray:
    """One signal-window array (``layout``: signal → array → shape of the engine's rows, checked before
    anything is unpacked; an array the layout does not name is unpacked within the wire's own bounds)."""
    want = None if layout is None else layout.get(name, {}).get(key)
    if dtype not in _EXTENSION_DTYPES or (want is not None and tuple(shape) != want):
        raise SnapshotError(f"snapshot windows {name}.{key}: dtype {dtype!r} shape {shape} refused"
                            + ("" if want is None else f" (engine: {want})"))
    if math.prod(shape) * np.dtype(dtype).itemsize > MAX_RECORD_BYTES:
        raise SnapshotError(f"snapshot windows {name}.{key}: shape {shape} over {MAX_RECORD_BYTES} bytes")
    return _unpack(b, np.dtype(dtype), tuple(shape), zlibbed).copy()


def export_channel(engine, index: int) -> bytes:
    """Snapshot bytes (current version) of channel ``index`` of ``engine`` (a :class:`pipeline.engine.Engine`)."""
    return encode_state(engine.state.export_state(index))


def encode_state(state: "ChannelState | FrozenState") -> bytes:
    """:class:`ChannelState` (or a :class:`FrozenState` capture of one) → snapshot bytes (version
    :data:`SNAPSHOT_VERSION`: :data:`COMPRESSED_MARK` and the LZ4 block, size stored, of the msgpack record
    with raw arrays)."""
    if isinstance(state, FrozenState):
        state = state.thaw()
    w = state.windows
    ext = dict(w.extensions)
    lat, runs, q = ext.pop(LATENCY, None), ext.pop(RUNS, None), ext.pop(QUALITY, None)
    model = None if q is None or "model" not in q else str(q["model"])
    snap = ChannelSnapshot(
        version=SNAPSHOT_VERSION, channel=state.channel, route=state.route,
        tier=cast(Literal["free", "paid"] | None, state.tier),
        n_buckets=DEFAULT_N_BUCKETS if lat is None else lat["base.hist"].shape[-1],
        short_slot_id=_pack(w.short_slot_id), short_hist=b"" if lat is None else _pack(lat["short.hist"]),
        short_lat_slot_id=b"" if lat is None else _pack(lat["short.slot_id"]),
        counters={name: _pack(a) for name, a in w.counters.items()},
        base_slot_id=b"" if lat is None else _pack(lat["base.slot_id"]),
        base_hist=b"" if lat is None else _pack(lat["base.hist"]),
        run=0 if runs is None else int(runs["run"]), last_ts_ms=w.last_ts_ms, seq=state.seq,
        watermark_ms=state.watermark_ms,
        next_eval_ms=state.next_eval_ms, fail_since_eval=state.fail_since_eval, active=dict(state.active),
        machine=cast(MachineWire, dict(state.machine)),  # encoded as the dict it is (msgspec writes a map)
        quality_short_slot_id=b"" if q is None else _pack(q["short.slot_id"]),
        quality_short_counts=b"" if q is None else _pack(q["short.counts"]),
        quality_base_slot_id=b"" if q is None else _pack(q["base.slot_id"]),
        quality_base_counts=b"" if q is None else _pack(q["base.counts"]),
        quality_model=model,
        extensions={name: {key: (cast(ExtensionDtype, a.dtype.str), list(a.shape), _pack(a)) for key, a in arrays.items()}
                    for name, arrays in _with_round_state(ext, state).items()},
        judged_since_eval=state.judged_since_eval,
        route_shares=None if state.route_shares is None else RouteSharesWire(**dataclasses.asdict(state.route_shares)),
    )
    return COMPRESSED_MARK + lz4.block.compress(msgspec.msgpack.encode(snap), store_size=True)


def _with_round_state(ext: dict[str, dict[str, np.ndarray]], state: ChannelState) -> dict[str, dict[str, np.ndarray]]:
    """``ext`` with the :data:`ROUND_STATE` entry of ``state`` added when any of its values is set."""
    rs, out = state.round_state, {}
    if rs.learns is not None and rs.learns != (state.machine.get("state") in _LEARNING):
        out["learns"] = np.array([rs.learns], bool)
    if state.windows.held_since_ms >= 0:
        out["held_since_ms"] = np.array([state.windows.held_since_ms], np.int64)
    c = rs.capacity
    if c is not None:
        for key, v in (("usual", c.usual), ("max_share", c.max_share)):
            if v is not None:
                out[key] = np.array([v], np.float64)
        if c.held:
            out["held"] = np.array(c.held, np.float64)
        if c.judged_since_ms is not None:
            out["judged_since_ms"] = np.array([c.judged_since_ms], np.int64)
        if c.usual_counts is not None:
            out["usual_counts"] = np.array(c.usual_counts, np.float64)
    if rs.peer_active:
        out["peer_active"] = np.array([True])
    for key, v in (("wide_weight", rs.wide_weight), ("panic_weight", rs.panic_weight), ("fail_ratio", rs.fail_ratio)):
        if v is not None:
            out[key] = np.array([v], np.float64)
    if rs.recent is not None:
        out["recent"] = np.array(rs.recent, np.float64)
    if rs.p95 is not None:
        out["p95_round_ms"] = np.array([rs.p95[0]], np.int64)
        out["p95"] = np.nan_to_num(np.array(rs.p95[1:], np.float64), nan=-1.0)
    if rs.ok_run:
        out["ok_run"] = np.array([rs.ok_run], np.int64)
    if rs.suspect_sent_ms is not None:
        out["suspect_sent_ms"] = np.array([rs.suspect_sent_ms], np.float64)
    if rs.suspect_at_ms is not None:
        out["suspect_at_ms"] = np.array([rs.suspect_at_ms], np.int64)
    if rs.suspect_expired_ms is not None:
        out["suspect_expired_ms"] = np.array([rs.suspect_expired_ms], np.int64)
    return {**ext, ROUND_STATE: out} if out else ext


def _round_state(snap: ChannelSnapshot) -> tuple[RoundState, int]:
    """The :class:`RoundState` and baselines' hold start (ms, -1: none) of ``snap``'s :data:`ROUND_STATE`
    entry (defaults without one). Values are range-checked on import
    (:func:`pipeline.engine.state_io.check_round_state`); raises :class:`SnapshotError` for an array of
    the wrong dtype or shape."""
    packed = snap.extensions.get(ROUND_STATE)
    if not packed:
        return RoundState(), -1
    z = snap.version in ZLIB_ARRAY_VERSIONS
    want = {"learns": "|b1", "peer_active": "|b1", "held_since_ms": "<i8", "judged_since_ms": "<i8",
            "p95_round_ms": "<i8", "ok_run": "<i8", "suspect_at_ms": "<i8",
            "suspect_expired_ms": "<i8"}
    a: dict[str, np.ndarray] = {}
    for key, (dtype, shape, b) in packed.items():
        if dtype != want.get(key, "<f8") or (key != "held" and tuple(shape) != _ROUND_LAYOUT.get(key)) or (
                key == "held" and (len(shape) != 1 or shape[0] > 64)):
            raise SnapshotError(f"snapshot {ROUND_STATE}.{key}: dtype {dtype!r} shape {shape} refused")
        a[key] = _unpack(b, np.dtype(dtype), tuple(shape), z)

    def one(key: str, kind: type) -> Any:
        return None if key not in a else kind(a[key][0])

    capacity = None
    if {"usual", "held", "max_share", "judged_since_ms", "usual_counts"} & a.keys():
        counts = a.get("usual_counts")
        capacity = CapacityRecord(usual=one("usual", float), held=tuple(float(x) for x in a.get("held", ())),
                                  max_share=one("max_share", float), judged_since_ms=one("judged_since_ms", int),
                                  usual_counts=None if counts is None else (float(counts[0]), float(counts[1])))
    recent, p95 = a.get("recent"), a.get("p95")
    if (p95 is None) != ("p95_round_ms" not in a):
        raise SnapshotError(f"snapshot {ROUND_STATE}: p95 and p95_round_ms come together")
    rs = RoundState(learns=one("learns", bool), capacity=capacity, peer_active=bool(one("peer_active", bool)),
                    wide_weight=one("wide_weight", float), panic_weight=one("panic_weight", float),
                    fail_ratio=one("fail_ratio", float),
                    recent=None if recent is None else (float(recent[0]), float(recent[1])),
                    p95=None if p95 is None else (one("p95_round_ms", int),
                                                  *(float("nan") if x == -1.0 else float(x) for x in p95.tolist())),
                    ok_run=one("ok_run", int) or 0, suspect_sent_ms=one("suspect_sent_ms", float),
                    suspect_at_ms=one("suspect_at_ms", int),
                    suspect_expired_ms=one("suspect_expired_ms", int))
    held = one("held_since_ms", int)
    return rs, -1 if held is None else held


#: A signal window's array of one channel of at least this many bytes is kept compact in a capture
#: (:class:`FrozenState`): its all-zero rows (ring slots) are not copied.
COMPACT_MIN_BYTES = 256


#: The layouts of :class:`FrozenState` captures, each held once (every channel of an engine has the same),
#: and the unpacking plan of each: ``(signal, name, shape, dtype, compact, elements, elements per row)``.
_LAYOUTS: dict[tuple, tuple] = {}
_PLANS: dict[int, tuple[tuple[str, str, tuple[int, ...], np.dtype, bool, int, int], ...]] = {}


@functools.lru_cache(maxsize=64)
def _all_rows(n: int) -> bytes:
    """The row indices ``0 .. n-1`` as little-endian ``uint16`` bytes (a compact array with every row kept)."""
    return np.arange(n, dtype=np.uint16).tobytes()


#: The unsigned integer read of a row whose byte size has this lowest set bit (1, 2 or 4).
_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def _plan(layout: tuple) -> tuple[tuple[str, str, tuple[int, ...], np.dtype, bool, int, int], ...]:
    plan = _PLANS.get(id(layout))
    if plan is None:  # layouts are interned in _LAYOUTS and never dropped: their ids stay theirs
        plan = tuple((name, key, shape, np.dtype(dtype), compact, int(np.prod(shape, dtype=np.int64)),
                      int(np.prod(shape[1:], dtype=np.int64)))
                     for name, key, shape, dtype, compact in layout)
        _PLANS[id(layout)] = plan
    return plan


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenState:
    """A captured :class:`ChannelState` with its window arrays packed into one ``bytes`` (``blob``).

    ``state``: the channel's state without its window arrays (``short_slot_id`` empty, no counters, no
    signal windows); ``layout``: ``(signal or "", array name, shape, dtype str, compact)`` per array in
    blob order, shared by every capture with the same layout (the signal ``""`` holds the store's
    ``short_slot_id`` and its counters by name). An array of :data:`COMPACT_MIN_BYTES` or more (a ring's
    histograms or counters, slots along its first axis) is compact: a ``uint16`` count ``m``, ``m``
    ``uint16`` indices of its rows holding a non-zero byte, then those rows; a smaller one is its raw
    bytes. :meth:`thaw` gives the bit-identical :class:`ChannelState` back, so the encoded snapshot is
    the same bytes. Why (issue #34 part 1): a worker copies every changed channel before encoding, and a
    one-event channel's rows are ~80 KB with one slot written; 20,000 dense copies took the worker from
    0.4 GB to 2 GB, and as ~60 small numpy arrays each they still took ~19 KB per channel (docs/MEMORY.md).
    """

    state: ChannelState
    layout: tuple[tuple[str, str, tuple[int, ...], str, bool], ...]
    blob: bytes

    @classmethod
    def of(cls, state: ChannelState) -> "FrozenState":
        """Pack ``state``'s window arrays (raises ``ValueError`` for an array of more than 65,535 rows)."""
        w = state.windows
        items = [("", "short_slot_id", w.short_slot_id), *(("", k, a) for k, a in w.counters.items()),
                 *((name, k, a) for name, arrays in w.extensions.items() for k, a in arrays.items())]
        layout = []
        parts: list[bytes] = []
        for name, key, a in items:
            compact = a.nbytes >= COMPACT_MIN_BYTES and a.ndim >= 2
            layout.append((name, key, a.shape, a.dtype.str, compact))
            if not compact:
                parts.append(a.tobytes())
                continue
            n = a.shape[0]
            if n > 0xFFFF:
                raise ValueError(f"windows {name}.{key}: {n} rows, at most 65,535 can be packed")
            a = np.ascontiguousarray(a)
            # a row is kept when any of its bytes is non-zero (so -0.0 and NaN are kept): the bytes read as
            # unsigned integers of the widest size that divides a row (fewer elements to reduce than uint8)
            row_bytes = a.nbytes // n  # n >= 1: a compact array has >= COMPACT_MIN_BYTES
            word = _WORDS[row_bytes & -row_bytes] if row_bytes & 7 else np.uint64
            rows = np.flatnonzero(a.reshape(n, -1).view(word).any(axis=1))
            m = rows.shape[0]
            if m == n:  # a busy channel's ring: every row, in order (no gather)
                parts += [m.to_bytes(2, "little"), _all_rows(n), a.tobytes()]
            else:
                parts += [m.to_bytes(2, "little"), rows.astype(np.uint16).tobytes(), a[rows].tobytes()]
        key_ = tuple(layout)
        shared = _LAYOUTS.setdefault(key_, key_)
        windows = dataclasses.replace(w, short_slot_id=np.empty(0, np.int64), counters={}, extensions={})
        return cls(dataclasses.replace(state, windows=windows), shared, b"".join(parts))

    def thaw(self) -> ChannelState:
        """The :class:`ChannelState` captured (dense arrays, zeros in the rows a compact array did not hold)."""
        blob, at = self.blob, 0
        short_slot_id = np.empty(0, np.int64)
        counters: dict[str, np.ndarray] = {}
        ext: dict[str, dict[str, np.ndarray]] = {}
        for name, key, shape, dt, compact, size, row in _plan(self.layout):
            if compact:
                m = int.from_bytes(blob[at:at + 2], "little")
                rows = np.frombuffer(blob, np.uint16, m, at + 2)
                at += 2 + 2 * m
                a = np.zeros(shape, dt)
                a[rows] = np.frombuffer(blob, dt, m * row, at).reshape((m, *shape[1:]))
                at += m * row * dt.itemsize
            else:
                a = np.frombuffer(blob, dt, size, at).reshape(shape)  # read-only view: encoding only reads
                at += size * dt.itemsize
            if name:
                ext.setdefault(name, {})[key] = a
            elif key == "short_slot_id":
                short_slot_id = a
            else:
                counters[key] = a
        windows = dataclasses.replace(self.state.windows, short_slot_id=short_slot_id, counters=counters,
                                      extensions=ext)
        return dataclasses.replace(self.state, windows=windows)

    def nbytes(self) -> int:
        """Bytes of the packed window arrays (the windows' share of this capture's memory)."""
        return len(self.blob)


#: A channel whose largest window array has at least this share of its rows written is captured as its plain
#: export: packing it (:class:`FrozenState`) would save at most the unwritten share of its bytes (the largest
#: arrays, a ring's histograms, hold most of them) for ~2x the capture's CPU (issue #34, paced stage).
DENSE_CAPTURE_SHARE = 0.5


def _mostly_written(state: ChannelState) -> bool:
    """Whether the largest 2-D window array of ``state`` has >= :data:`DENSE_CAPTURE_SHARE` of its rows holding a
    non-zero byte (False when it has no 2-D array of :data:`COMPACT_MIN_BYTES` or more)."""
    big: np.ndarray | None = None
    for arrays in state.windows.extensions.values():
        for a in arrays.values():
            if a.ndim >= 2 and a.nbytes >= COMPACT_MIN_BYTES and (big is None or a.nbytes > big.nbytes):
                big = a
    if big is None:
        return False
    n = big.shape[0]
    written = int(np.count_nonzero(np.ascontiguousarray(big).view(np.uint8).reshape(n, -1).any(axis=1)))
    return written >= DENSE_CAPTURE_SHARE * n


def copy_state(engine, rows: Sequence[int]) -> list[ChannelState | FrozenState]:
    """Copies of channels ``rows``' state (:meth:`pipeline.engine.state_io.StateIO.export_state`), to encode later;
    a sparse channel's kept compact (:class:`FrozenState`: its written slots, not its whole rows), a busy one's
    (:func:`_mostly_written`) as exported, which packing would barely shrink. Both encode to the same bytes.

    A worker takes them while its state is consistent (between two batches,
    under its lock) and encodes them (:func:`encode_state`, mostly zlib, which
    releases the GIL) in another thread while the engine moves on. Pass only
    resident channels: an evicted one has its snapshot bytes already, and
    copying its released rows would commit their memory again.
    """
    out: list[ChannelState | FrozenState] = []
    for i in rows:
        state = engine.state.export_state(i)
        out.append(state if _mostly_written(state) else FrozenState.of(state))
    return out


def decode_snapshot(raw: bytes) -> ChannelSnapshot:
    """Decode snapshot bytes (a compressed record, or the plain msgpack of any readable version);
    raises :class:`SnapshotError` on bad bytes, a size over :data:`MAX_RECORD_BYTES` (checked before
    decompressing), a field that breaks the typed contract (:class:`~pipeline.state.wire.ChannelSnapshot`)
    or an unknown version."""
    if raw[:1] == COMPRESSED_MARK:
        size = int.from_bytes(raw[1:5], "little") if len(raw) >= 5 else -1
        if not 0 <= size <= MAX_RECORD_BYTES:
            raise SnapshotError(f"compressed snapshot of {size} bytes refused (at most {MAX_RECORD_BYTES})")
        try:
            raw = lz4.block.decompress(raw[1:])
        except lz4.block.LZ4BlockError as exc:
            raise SnapshotError(f"undecodable snapshot: {exc}") from None
    try:
        snap = msgspec.msgpack.decode(raw, type=ChannelSnapshot)
    except msgspec.MsgspecError as exc:
        raise SnapshotError(f"undecodable snapshot: {exc}") from None
    if snap.version not in READABLE_VERSIONS:
        raise SnapshotError(f"snapshot version {snap.version} is not one of {READABLE_VERSIONS}")
    return snap


def to_state(snap: ChannelSnapshot, short_slots: int = 30, base_slots: int = 25, quality_counters: int = 3,
             lat_slots: int = 10, windows_layout: Mapping[str, Mapping[str, tuple[int, ...]]] | None = None
             ) -> ChannelState:
    """The :class:`ChannelState` a decoded snapshot holds (ring sizes: the engine's).

    The top-level fields of :data:`WIRE_FIELDS` become the rows of those signals' windows
    (``ChannelWindows.extensions``, beside the others). ``short_hist`` is the latency ring's ``(lat_slots, n_buckets)`` with
    ``short_lat_slot_id``, or (older snapshots) ``(short_slots, n_buckets)`` in
    the 10 s slots of ``short_slot_id`` with ``short_lat_slot_id`` None.

    ``windows_layout``: the engine's signal windows (signal → array → shape of one channel's row,
    :meth:`pipeline.windows.store.WindowStore.windows_layout`); a saved array of a known signal with
    another shape is refused before it is unpacked (None: only the wire's own bounds).

    Raises :class:`SnapshotError` when an array does not unpack to its ring's shape or holds NaN or
    infinity.
    """
    ns, nb, k = short_slots, base_slots, snap.n_buckets
    z = snap.version in ZLIB_ARRAY_VERSIONS

    def unpack(b: bytes, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
        return _unpack(b, dtype, shape, z)

    if snap.version == 1:
        cube = unpack(snap.short_counts, np.float32, (ns, len(V1_COUNTER_NAMES)))
        counters = {name: cube[:, j].copy() for j, name in enumerate(V1_COUNTER_NAMES)}
    else:
        counters = {name: unpack(b, np.float32, (ns,)) for name, b in snap.counters.items()}
    extensions = {name: {key: _unpack_extension(name, key, *packed, z, windows_layout)
                         for key, packed in arrays.items()}
                  for name, arrays in snap.extensions.items() if name != ROUND_STATE}
    round_state, held_since_ms = _round_state(snap)
    short_slot_id = unpack(snap.short_slot_id, np.int64, (ns,))
    if snap.base_hist:  # the latency windows (a record of an engine without them has none)
        if snap.short_lat_slot_id:
            lat_ids = unpack(snap.short_lat_slot_id, np.int64, (lat_slots,))
            lat_hist = unpack(snap.short_hist, np.float32, (lat_slots, k))
        else:  # written with 10 s latency slots: summed into the ring's longer ones
            lat_ids, lat_hist = coarsen_slots(short_slot_id, unpack(snap.short_hist, np.float32, (ns, k)),
                                              ns // lat_slots, lat_slots)
        extensions[LATENCY] = {"short.slot_id": lat_ids, "short.hist": lat_hist,
                               "base.slot_id": unpack(snap.base_slot_id, np.int64, (nb,)),
                               "base.hist": unpack(snap.base_hist, np.float32, (nb, k))}
    extensions[RUNS] = {"run": np.array(snap.run, np.int32)}
    if snap.quality_short_slot_id:
        qk = quality_counters
        extensions[QUALITY] = {"short.slot_id": unpack(snap.quality_short_slot_id, np.int64, (ns,)),
                               "short.counts": unpack(snap.quality_short_counts, np.float32, (ns, qk)),
                               "base.slot_id": unpack(snap.quality_base_slot_id, np.int64, (nb,)),
                               "base.counts": unpack(snap.quality_base_counts, np.float32, (nb, qk))}
        if snap.quality_model is not None:
            extensions[QUALITY]["model"] = np.array(snap.quality_model)
    windows = ChannelWindows(short_slot_id=short_slot_id, counters=counters, last_ts_ms=snap.last_ts_ms,
                             extensions=extensions, held_since_ms=held_since_ms)
    return ChannelState(channel=snap.channel, route=snap.route, tier=snap.tier, windows=windows,
                        watermark_ms=snap.watermark_ms, next_eval_ms=snap.next_eval_ms,
                        fail_since_eval=snap.fail_since_eval, seq=snap.seq, active=dict(snap.active),
                        machine=_machine_fields(snap.machine), judged_since_eval=snap.judged_since_eval,
                        route_shares=_route_shares(snap), round_state=round_state)


def _machine_fields(m: MachineWire | dict) -> dict[str, object]:
    """A decoded machine's fields as the dict :class:`ChannelState` carries (a copy)."""
    if isinstance(m, MachineWire):
        return {k: (list(v) if type(v) is list else v) for k, v in msgspec.structs.asdict(m).items()}
    return dict(m)


def _route_shares(snap: ChannelSnapshot) -> RouteShareRecord | None:
    """The route shares a snapshot holds, if any."""
    w = snap.route_shares
    if w is None:
        return None
    return RouteShareRecord(version=w.version, shares=dict(w.shares), round_ms=w.round_ms,
                            round_start=None if w.round_start is None else dict(w.round_start))


def import_channel(engine, snap: ChannelSnapshot) -> int:
    """Load ``snap`` (any readable version) into ``engine`` (registering the channel); returns its index.

    Raises :class:`SnapshotError` when the bucket layout or ring sizes differ
    from the engine's configuration or a value is out of range (checked before the engine changes: a
    refused snapshot leaves no trace in it).
    """
    st = engine.store
    layout = st.windows_layout()
    _check_buckets(snap, layout)
    lat, q = layout.get(LATENCY, {}), layout.get(QUALITY, {})
    state = to_state(snap, st.short.n_slots, lat.get("base.hist", (st.baseline_hours + 1,))[0],
                     q.get("short.counts", (0, 3))[-1], lat.get("short.hist", (10,))[0], layout)
    try:
        return engine.state.import_state(state)
    except ValueError as exc:
        raise SnapshotError(str(exc)) from None


def hold_channel(engine, snap: ChannelSnapshot, raw: bytes) -> int:
    """Register ``snap``'s channel in ``engine`` as evicted (``raw``: its snapshot bytes); returns its index.

    Only the registry, state machine, ``seq``, newest event time and next round are loaded (for
    route shares and the channel limit; :meth:`pipeline.engine.state_io.StateIO.hold_channel`); the windows stay
    in ``raw`` until the channel's next event (:meth:`pipeline.engine.Engine.process` imports it then).
    Raises :class:`SnapshotError` when the bucket layout differs from the engine's or the machine's
    fields are out of range (before the engine changes). The windows in ``raw`` are checked when they
    are loaded (:func:`pipeline.engine.residency.restore`: a bad one then starts the channel's windows empty).
    """
    _check_buckets(snap, engine.store.windows_layout())
    try:
        return engine.state.hold_channel(HeldChannel(
            channel=snap.channel, route=snap.route, tier=snap.tier, last_ts_ms=snap.last_ts_ms,
            watermark_ms=snap.watermark_ms, next_eval_ms=snap.next_eval_ms, seq=snap.seq,
            machine=_machine_fields(snap.machine), route_shares=_route_shares(snap),
            round_state=_round_state(snap)[0]), raw)
    except ValueError as exc:
        raise SnapshotError(str(exc)) from None


def _check_buckets(snap: ChannelSnapshot, layout: Mapping[str, Mapping[str, tuple[int, ...]]]) -> None:
    """Raise :class:`SnapshotError` when ``snap``'s latency buckets differ from those of the engine's latency
    windows (``layout``: :meth:`~pipeline.windows.store.WindowStore.windows_layout`; none: no check)."""
    hist = layout.get(LATENCY, {}).get("base.hist")
    if hist is not None and snap.base_hist and snap.n_buckets != hist[-1]:
        raise SnapshotError(f"snapshot has {snap.n_buckets} latency buckets, engine {hist[-1]}")
