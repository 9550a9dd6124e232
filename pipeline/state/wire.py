"""The typed, bounded wire contract of a channel snapshot (SPEC §8: every record the worker reads is
decoded against a typed, bounded contract).

:class:`ChannelSnapshot` is what :func:`pipeline.state.snapshot.decode_snapshot` decodes a record into:
msgspec checks, in C while decoding, every field's type and range (string lengths, numeric ranges,
list and map sizes, the known states), so a record that breaks the contract is refused as a whole
(``msgspec.ValidationError``, turned into ``SnapshotError`` by the decoder) before anything of it
reaches an engine. The packed arrays' sizes and values are checked when they are unpacked
(:mod:`pipeline.state.snapshot`), against the engine's layout.

Bounds (all inclusive): timestamps (``*_ms``) ``0..``:data:`MAX_TS_MS`; ``seq`` and route-share
versions ``0..``:data:`MAX_SEQ`; ``run`` ``0..2**31 - 1`` (the store's int32); counts and the penalty
finite and >= 0; ``weight`` and shares ``0..1`` (NaN and inf fail every range); channel and route
names 1..512 characters (as in request events); at most :data:`MAX_NAMES` counters, soft findings,
signal windows (and arrays per signal window) and :data:`MAX_REASONS` machine reasons.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from pipeline.contracts import DBL_MAX, ShortStr, State
from pipeline.state.channel_state import MAX_SAVED_ROUTE

#: Latest timestamp a snapshot may hold (ms, 2200-01-01 UTC): later ones are corrupt, not clocks.
MAX_TS_MS = 7_258_118_400_000
#: Largest ``seq`` / share version (2**53: still exact in a JSON reader's double).
MAX_SEQ = 1 << 53
#: Most entries of a snapshot's name-keyed maps (counters, soft findings, signal windows, arrays of one).
MAX_NAMES = 64
#: Most reasons a machine holds (the registered signals and ``no_data``).
MAX_REASONS = 16

TsMs = Annotated[int, msgspec.Meta(ge=0, le=MAX_TS_MS)]
Seq = Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)]
Count = Annotated[float, msgspec.Meta(ge=0.0, le=DBL_MAX)]
Weight = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
#: A signal, counter or array name, or a reason code (as the registry spells them).
Code = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:\-]+$")]
_Shares = Annotated[dict[ShortStr, Weight], msgspec.Meta(max_length=MAX_SAVED_ROUTE)]
#: dtypes a snapshot's signal windows may hold.
ExtensionDtype = Literal["<f4", "<f8", "<i8", "<i4", "|b1"]
#: A signal window array's shape: at most 4 dimensions of at most 2**20.
ExtensionShape = Annotated[list[Annotated[int, msgspec.Meta(ge=0, le=1 << 20)]], msgspec.Meta(max_length=4)]


class RouteSharesWire(msgspec.Struct):
    """Wire form of a :class:`~pipeline.state.channel_state.RouteShareRecord` (shares in 0..1, at most
    :data:`~pipeline.state.channel_state.MAX_SAVED_ROUTE` channels: a larger record is refused as corrupt)."""

    version: Annotated[int, msgspec.Meta(ge=1, le=MAX_SEQ)]
    shares: _Shares
    round_ms: TsMs
    round_start: _Shares | None = None


class MachineWire(msgspec.Struct):
    """Wire form of a :class:`~pipeline.policy.state_machine.ChannelMachine` (same fields and defaults, so a
    record written before a field existed restores it at its default; a field the machine no longer has
    is ignored). ``state`` one of the machine's states; ``weight`` 0..1; ``penalty``, ``base_requests``,
    ``base_failures`` finite >= 0; times 0..:data:`MAX_TS_MS`; ``reasons`` at most :data:`MAX_REASONS`
    codes (which of them the engine knows is checked on import)."""

    state: State = "no_data"
    weight: Weight = 1.0
    entered_ms: TsMs = 0
    last_step_ms: TsMs = 0
    penalty: Count = 0.0
    penalty_ms: TsMs = 0
    reasons: Annotated[list[Code], msgspec.Meta(max_length=MAX_REASONS)] = []
    left_open_ms: TsMs = 0
    base_requests: Count = 0.0
    base_failures: Count = 0.0
    base_ms: TsMs = 0
    cause: Literal["", "credential", "quota_exhausted", "rate_limited"] = ""
    cooldown_ms: TsMs = 0
    reopens: Annotated[int, msgspec.Meta(ge=0, le=1 << 20)] = 0


class ChannelSnapshot(msgspec.Struct):
    """Wire form of one channel's state (msgpack). ``short_counts``: version 1 only;
    ``counters``: versions >= 2 (feature name → packed float32 (30,)). Packed arrays: zlib of the
    raw bytes in versions 1-2, the raw bytes in version 3 (:func:`pipeline.state.snapshot._pack`).
    Field bounds: see the module docstring."""

    version: int
    channel: ShortStr
    route: ShortStr
    tier: Literal["free", "paid"] | None
    n_buckets: Annotated[int, msgspec.Meta(ge=1, le=4096)]
    short_slot_id: bytes
    short_hist: bytes
    base_slot_id: bytes
    base_hist: bytes
    run: Annotated[int, msgspec.Meta(ge=0, le=(1 << 31) - 1)]
    last_ts_ms: TsMs
    seq: Seq
    watermark_ms: TsMs | None
    next_eval_ms: TsMs | None
    fail_since_eval: Count
    active: Annotated[dict[Code, bool], msgspec.Meta(max_length=MAX_NAMES)]
    machine: MachineWire
    quality_short_slot_id: bytes = b""
    quality_short_counts: bytes = b""
    quality_base_slot_id: bytes = b""
    quality_base_counts: bytes = b""
    quality_model: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    short_counts: bytes = b""
    counters: Annotated[dict[Code, bytes], msgspec.Meta(max_length=MAX_NAMES)] = {}
    #: Slot ids of ``short_hist`` when it holds the 30 s latency ring's slots (empty: the 10 s slots of
    #: ``short_slot_id``, as written before the 30 s latency ring).
    short_lat_slot_id: bytes = b""
    #: Signal name → array name → (dtype, shape, packed bytes): the signals' own windows
    #: (:mod:`pipeline.windows.extension`); absent in snapshots written before them.
    extensions: Annotated[dict[Code, Annotated[dict[Code, tuple[ExtensionDtype, ExtensionShape, bytes]],
                                               msgspec.Meta(max_length=MAX_NAMES)]],
                          msgspec.Meta(max_length=MAX_NAMES)] = {}
    #: Judged requests since the channel's last round (absent before 2026-12-02: restores as 0).
    judged_since_eval: Count = 0.0
    #: Its route's shares (absent before 2026-12-02, or no round of the route yet).
    route_shares: RouteSharesWire | None = None
