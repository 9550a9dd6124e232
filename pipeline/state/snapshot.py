"""Export / import one channel's complete detector state as bytes.

A snapshot holds the channel's rows of its rings (30 × 10 s counters,
10 × 30 s latency histograms, 25 × 1 h baseline histograms), its quality-score rings
(30 × 10 s and 25 × 1 h of count / sum / sum of squares, with the model
version they came from; SPEC §4.5), its failure run, newest event time,
soft-finding flags, circuit-breaker machine and verdict ``seq``.
Snapshots written before the quality rings existed load with empty ones;
those written with 30 × 10 s latency histograms (no ``short_lat_slot_id``)
load with them summed into the 30 s slots.
Histograms are mostly zeros, so the arrays are zlib-compressed: a busy
channel's snapshot is a few KB (raw ≈ 75 KB).

The stream worker publishes snapshots of changed channels to the state topic
and acks input offsets only afterwards, so committed offsets never run ahead
of the saved state (see :mod:`pipeline.stream.app`).
"""

from __future__ import annotations

import copy
import dataclasses
import zlib
from types import SimpleNamespace
from typing import Sequence

import msgspec
import numpy as np

from pipeline.policy.state_machine import ChannelMachine

SNAPSHOT_VERSION = 1


class SnapshotError(ValueError):
    """A snapshot cannot be read or does not fit the configured windows."""


class ChannelSnapshot(msgspec.Struct):
    """Wire form of one channel's state (msgpack)."""

    version: int
    channel: str
    route: str
    tier: str | None
    n_buckets: int
    short_slot_id: bytes
    short_counts: bytes
    short_hist: bytes
    base_slot_id: bytes
    base_hist: bytes
    run: int
    last_ts_ms: int
    seq: int
    watermark_ms: int | None
    next_eval_ms: int | None
    fail_since_eval: float
    active: dict[str, bool]
    machine: dict[str, object]
    quality_short_slot_id: bytes = b""
    quality_short_counts: bytes = b""
    quality_base_slot_id: bytes = b""
    quality_base_counts: bytes = b""
    quality_model: str | None = None
    #: Slot ids of ``short_hist`` when it holds the latency ring's slots (empty: the 10 s slots of
    #: ``short_slot_id``, as written before the 30 s latency ring).
    short_lat_slot_id: bytes = b""


def _pack(a: np.ndarray) -> bytes:
    return zlib.compress(np.ascontiguousarray(a).tobytes(), 1)


def _unpack(b: bytes, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    try:
        arr = np.frombuffer(zlib.decompress(b), dtype=dtype)
        return arr.reshape(shape)
    except (zlib.error, ValueError) as exc:
        raise SnapshotError(f"corrupt or mismatched snapshot array: {exc}") from None


def export_channel(engine, index: int) -> bytes:
    """Snapshot of channel ``index`` of ``engine`` (a :class:`pipeline.engine.Engine`, or its :func:`copy_state`)."""
    st = engine.store
    m: ChannelMachine = engine.machines[index]
    snap = ChannelSnapshot(
        version=SNAPSHOT_VERSION,
        channel=st.names[index], route=st.routes[index], tier=st.tiers[index],
        n_buckets=st.buckets.n_buckets,
        short_slot_id=_pack(st.short.slot_id[index]), short_counts=_pack(st.short.counts[index]),
        short_hist=_pack(st.short_lat.hist[index]), short_lat_slot_id=_pack(st.short_lat.slot_id[index]),
        base_slot_id=_pack(st.base.slot_id[index]), base_hist=_pack(st.base.hist[index]),
        run=int(st.runs.trailing[index]), last_ts_ms=int(st.last_ts_ms[index]),
        seq=int(engine.seq[index]), watermark_ms=st.watermark_ms, next_eval_ms=int(engine.next_eval[index]),
        fail_since_eval=float(engine.fail_since_eval[index]),
        active={k: bool(v[index]) for k, v in engine.active.items()},
        machine=dataclasses.asdict(m),
        quality_short_slot_id=_pack(st.quality.short.slot_id[index]),
        quality_short_counts=_pack(st.quality.short.counts[index]),
        quality_base_slot_id=_pack(st.quality.base.slot_id[index]),
        quality_base_counts=_pack(st.quality.base.counts[index]),
        quality_model=st.quality.version[index],
    )
    return msgspec.msgpack.encode(snap)


def copy_state(engine, rows: Sequence[int] | None = None) -> SimpleNamespace:
    """A copy of everything :func:`export_channel` reads from ``engine``, for channels ``rows`` (default: all).

    ``export_channel(copy, k)`` returns the bytes ``export_channel(engine, rows[k])``
    returned when the copy was taken, however the engine changes afterwards.
    So a worker takes this copy while its state is consistent (between two
    batches, under its lock) and encodes the snapshots from it in another
    thread meanwhile the engine moves on: the copy is one memory copy of the
    chosen channels' ring rows (pass only resident channels: an evicted one has
    its snapshot already, and copying its released rows would commit their
    memory again), while encoding them (mostly zlib) costs several times that
    in CPU. zlib releases the GIL (CPython ``zlibmodule.c``), so most of the
    encoding runs beside the event loop, not in it.
    """
    st = engine.store
    idx = np.arange(st.n_channels) if rows is None else np.asarray(rows, dtype=np.int64)

    def ring(r, *names: str) -> SimpleNamespace:
        return SimpleNamespace(**{name: getattr(r, name)[idx] for name in names})  # fancy indexing: a copy

    def pick(seq) -> list:
        return [seq[i] for i in idx.tolist()]

    q = st.quality
    store = SimpleNamespace(
        names=pick(st.names), routes=pick(st.routes), tiers=pick(st.tiers),
        buckets=SimpleNamespace(n_buckets=st.buckets.n_buckets),
        short=ring(st.short, "slot_id", "counts"), short_lat=ring(st.short_lat, "slot_id", "hist"),
        base=ring(st.base, "slot_id", "hist"),
        runs=SimpleNamespace(trailing=st.runs.trailing[idx]), last_ts_ms=st.last_ts_ms[idx],
        watermark_ms=st.watermark_ms,
        quality=SimpleNamespace(short=ring(q.short, "slot_id", "counts"), base=ring(q.base, "slot_id", "counts"),
                                version=pick(q.version)))
    return SimpleNamespace(
        store=store, seq=pick(engine.seq), next_eval=engine.next_eval[idx],
        fail_since_eval=engine.fail_since_eval[idx],
        active={k: v[idx] for k, v in engine.active.items()},
        machines=copy.deepcopy(pick(engine.machines)))


def decode_snapshot(raw: bytes) -> ChannelSnapshot:
    """Decode snapshot bytes; raises :class:`SnapshotError` on bad bytes or version."""
    try:
        snap = msgspec.msgpack.decode(raw, type=ChannelSnapshot)
    except msgspec.MsgspecError as exc:
        raise SnapshotError(f"undecodable snapshot: {exc}") from None
    if snap.version != SNAPSHOT_VERSION:
        raise SnapshotError(f"snapshot version {snap.version} is not {SNAPSHOT_VERSION}")
    return snap


def _load_10s_hist(lat, i: int, ids: np.ndarray, hist: np.ndarray, slot_ms: int) -> None:
    """Sum a snapshot's 10 s latency histograms (slot ids ``ids``) into row ``i`` of the latency ring
    ``lat``, keeping its ``n_slots`` newest slots."""
    lat.slot_id[i] = -1
    lat.hist[i] = 0.0
    held = ids >= 0
    if not held.any():
        return
    target = ids[held] * slot_ms // lat.slot_ms
    keep = target > target.max() - lat.n_slots
    for t, h in zip(target[keep].tolist(), hist[held][keep]):
        lat.slot_id[i, t % lat.n_slots] = t
        lat.hist[i, t % lat.n_slots] += h


def import_channel(engine, snap: ChannelSnapshot) -> int:
    """Load ``snap`` into ``engine`` (registering the channel); returns its index.

    Raises :class:`SnapshotError` when the bucket layout or ring sizes differ
    from the engine's configuration.
    """
    st = engine.store
    if snap.n_buckets != st.buckets.n_buckets:
        raise SnapshotError(f"snapshot has {snap.n_buckets} latency buckets, engine {st.buckets.n_buckets}")
    i = st.channel_index(snap.channel, snap.route, snap.tier)
    engine._grow(st.n_channels)
    ns, nb, k = st.short.n_slots, st.base.n_slots, st.buckets.n_buckets
    st.short.slot_id[i] = _unpack(snap.short_slot_id, np.int64, (ns,))
    st.short.counts[i] = _unpack(snap.short_counts, np.float32, (ns, st.short.n_counters))
    lat = st.short_lat
    if snap.short_lat_slot_id:
        lat.slot_id[i] = _unpack(snap.short_lat_slot_id, np.int64, (lat.n_slots,))
        lat.hist[i] = _unpack(snap.short_hist, np.float32, (lat.n_slots, k))
    else:
        _load_10s_hist(lat, i, st.short.slot_id[i], _unpack(snap.short_hist, np.float32, (ns, k)), st.short.slot_ms)
    st.base.slot_id[i] = _unpack(snap.base_slot_id, np.int64, (nb,))
    st.base.hist[i] = _unpack(snap.base_hist, np.float32, (nb, k))
    q = st.quality
    if snap.quality_short_slot_id:
        qs, qb, qk = q.short.n_slots, q.base.n_slots, q.short.n_counters
        q.short.slot_id[i] = _unpack(snap.quality_short_slot_id, np.int64, (qs,))
        q.short.counts[i] = _unpack(snap.quality_short_counts, np.float32, (qs, qk))
        q.base.slot_id[i] = _unpack(snap.quality_base_slot_id, np.int64, (qb,))
        q.base.counts[i] = _unpack(snap.quality_base_counts, np.float32, (qb, qk))
        q.version[i] = snap.quality_model
    else:
        q.reset([i])
        q.version[i] = None
    st.runs.trailing[i] = snap.run
    st.last_ts_ms[i] = max(int(st.last_ts_ms[i]), snap.last_ts_ms)
    if snap.watermark_ms is not None:
        st.watermark_ms = max(st.watermark_ms or snap.watermark_ms, snap.watermark_ms)
    st.invalidate_baseline(i)
    engine.next_eval[i] = snap.next_eval_ms or 0
    engine.fail_since_eval[i] = snap.fail_since_eval
    engine.seq[i] = max(engine.seq[i], snap.seq)
    for k2, v in snap.active.items():
        if k2 in engine.active:
            engine.active[k2][i] = v
    engine.machines[i] = _machine(snap)
    return i


def _machine(snap: ChannelSnapshot) -> ChannelMachine:
    fields = {f.name for f in dataclasses.fields(ChannelMachine)}
    return ChannelMachine(**{k: v for k, v in snap.machine.items() if k in fields})


def hold_channel(engine, snap: ChannelSnapshot, raw: bytes) -> int:
    """Register ``snap``'s channel in ``engine`` as evicted (``raw``: its snapshot bytes); returns its index.

    Only the registry, state machine, ``seq``, newest event time and next round are loaded (for
    route shares and the channel limit); the windows stay in ``raw`` until the channel's next event
    (:meth:`pipeline.engine.Engine.process` imports it then). Raises :class:`SnapshotError` when the
    bucket layout differs from the engine's.
    """
    st = engine.store
    if snap.n_buckets != st.buckets.n_buckets:
        raise SnapshotError(f"snapshot has {snap.n_buckets} latency buckets, engine {st.buckets.n_buckets}")
    i = st.channel_index(snap.channel, snap.route, snap.tier)
    engine._grow(st.n_channels)
    engine.resident[i] = False
    engine.evicted[snap.channel] = raw
    st.last_ts_ms[i] = max(int(st.last_ts_ms[i]), snap.last_ts_ms)
    if snap.watermark_ms is not None:
        st.watermark_ms = max(st.watermark_ms or snap.watermark_ms, snap.watermark_ms)
    engine.next_eval[i] = snap.next_eval_ms or 0
    engine.seq[i] = max(engine.seq[i], snap.seq)
    engine.machines[i] = _machine(snap)
    return i
