"""Export / import one channel's complete detector state as bytes.

A snapshot holds the channel's rows of both rings (30 × 10 s counters and
latency histograms, 25 × 1 h baseline histograms), its quality-score rings
(30 × 10 s and 25 × 1 h of count / sum / sum of squares, with the model
version they came from; SPEC §4.5), its failure run, newest event time,
soft-finding flags, circuit-breaker machine and verdict ``seq``.
Snapshots written before the quality rings existed load with empty ones.
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
        short_hist=_pack(st.short.hist[index]),
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


def copy_state(engine) -> SimpleNamespace:
    """A copy of everything :func:`export_channel` reads from ``engine``, for each of its channels.

    ``export_channel(copy, i)`` returns the bytes ``export_channel(engine, i)``
    returned when the copy was taken, however the engine changes afterwards.
    So a worker takes this copy while its state is consistent (between two
    batches, under its lock) and encodes the snapshots from it in another
    thread meanwhile the engine moves on: the copy is one memory copy of the
    channels' ring rows (≈ 75 KB a channel, freed with the copy), while
    encoding them (mostly zlib) costs several times that in CPU. zlib releases
    the GIL (CPython ``zlibmodule.c``), so most of the encoding runs beside
    the event loop, not in it.
    """
    st = engine.store
    n = st.n_channels

    def ring(r, *names: str) -> SimpleNamespace:
        return SimpleNamespace(**{name: getattr(r, name)[:n].copy() for name in names})

    q = st.quality
    store = SimpleNamespace(
        names=list(st.names[:n]), routes=list(st.routes[:n]), tiers=list(st.tiers[:n]),
        buckets=SimpleNamespace(n_buckets=st.buckets.n_buckets),
        short=ring(st.short, "slot_id", "counts", "hist"), base=ring(st.base, "slot_id", "hist"),
        runs=SimpleNamespace(trailing=st.runs.trailing[:n].copy()), last_ts_ms=st.last_ts_ms[:n].copy(),
        watermark_ms=st.watermark_ms,
        quality=SimpleNamespace(short=ring(q.short, "slot_id", "counts"), base=ring(q.base, "slot_id", "counts"),
                                version=list(q.version[:n])))
    return SimpleNamespace(
        store=store, seq=list(engine.seq[:n]), next_eval=engine.next_eval[:n].copy(),
        fail_since_eval=engine.fail_since_eval[:n].copy(),
        active={k: v[:n].copy() for k, v in engine.active.items()},
        machines=copy.deepcopy(engine.machines[:n]))


def decode_snapshot(raw: bytes) -> ChannelSnapshot:
    """Decode snapshot bytes; raises :class:`SnapshotError` on bad bytes or version."""
    try:
        snap = msgspec.msgpack.decode(raw, type=ChannelSnapshot)
    except msgspec.MsgspecError as exc:
        raise SnapshotError(f"undecodable snapshot: {exc}") from None
    if snap.version != SNAPSHOT_VERSION:
        raise SnapshotError(f"snapshot version {snap.version} is not {SNAPSHOT_VERSION}")
    return snap


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
    st.short.hist[i] = _unpack(snap.short_hist, np.float32, (ns, k))
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
    fields = {f.name for f in dataclasses.fields(ChannelMachine)}
    engine.machines[i] = ChannelMachine(**{k2: v for k2, v in snap.machine.items() if k2 in fields})
    return i
