"""The engine's public per-channel state API: export / import a typed :class:`ChannelState`.

:class:`StateIO` is the engine's ``state`` part (kept apart so the engine core
stays about detection); snapshots (:mod:`pipeline.state.snapshot`) and the
stream processor use only these methods, never the store's arrays.

Change tracking (issue #15): ``Engine.changed`` flags, per channel row, that
its exported state may differ from the one its last captured snapshot holds.
The engine sets it where a channel's state changes: events accepted into its
windows, a round that steps its machine, flips a finding or publishes a
verdict (``seq``), quality scores, a restore (:meth:`StateIO.import_state`,
:meth:`StateIO.hold_channel`) and an eviction; new channels
start flagged. A round of a channel that is idle and already reported
``no_data`` only moves its next round boundary (``next_eval_ms``): not
flagged, since a restore from its older record replays those rounds, which
change nothing either. Events refused or too late change no channel's state.
The snapshot capture takes and clears the flags (:meth:`Engine.take_changed <pipeline.engine.core.Engine.take_changed>`)
and puts them back when its records are not published (:meth:`Engine.mark_changed <pipeline.engine.core.Engine.mark_changed>`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Protocol, TypeVar

import msgspec
import numpy as np

from pipeline.policy.capacity import LOAD_ROUNDS, OVER_CAPACITY
from pipeline.policy.route_wide import PEER_LATENCY
from pipeline.policy.state_machine import CLASS_REASON, LEARNING_STATES, NO_DATA, ChannelMachine
from pipeline.state.channel_state import CapacityRecord, ChannelState, HeldChannel, RoundState
from pipeline.state.wire import MAX_SEQ, MachineWire
from pipeline.engine.residency import Residency
from pipeline.engine.route_shares import RouteShares
from pipeline.engine.suspects import Suspects
from pipeline.windows.store import WindowStore

#: :class:`ChannelMachine`'s fields, in order (its dict form in :class:`ChannelState`).
_MACHINE_FIELDS = tuple(f.name for f in dataclasses.fields(ChannelMachine))
_MACHINE_FIELD_SET = frozenset(_MACHINE_FIELDS)


def machine_dict(m: ChannelMachine) -> dict[str, object]:
    """``dataclasses.asdict(m)`` for the machine's flat fields (numbers, strings, lists of strings),
    about 10 times cheaper: lists are copied, everything else is immutable."""
    out = {}
    for k in _MACHINE_FIELDS:
        v = getattr(m, k)
        out[k] = list(v) if type(v) is list else v
    return out


class EngineParts(Protocol):
    """What :class:`StateIO` reads and writes of its engine (:class:`~pipeline.engine.core.Engine` has it);
    a protocol, so that this module does not import the engine that holds it."""

    store: WindowStore
    machines: list[ChannelMachine]
    seq: list[int]
    active: dict[str, np.ndarray]
    next_eval: np.ndarray
    fail_since_eval: np.ndarray
    judged_since_eval: np.ndarray
    learns: np.ndarray
    ok_runs: dict[int, int]
    suspects: Suspects
    hard: tuple
    soft: tuple
    advisory: tuple
    routes: RouteShares
    residency: Residency

    def grow(self, n: int) -> None: ...

    def mark_changed(self, rows) -> None: ...


class StateIO:
    """Per-channel state in and out of one engine (``engine.state``): export, import, hold.

    ``engine``: the :class:`~pipeline.engine.core.Engine` it belongs to; read and written through its
    public per-channel arrays (``store``, ``machines``, ``seq``, ``active``, ``next_eval``,
    ``fail_since_eval``, ``judged_since_eval``), its named parts (``routes``, ``residency``) and
    :meth:`~pipeline.engine.core.Engine.grow` / :meth:`~pipeline.engine.core.Engine.mark_changed`.
    """

    def __init__(self, engine: EngineParts):
        self.engine = engine
        #: Restored state a signal no longer uses (window counter or soft finding name → channels).
        self.dropped_state: dict[str, int] = {}

    def export_state(self, i: int) -> ChannelState:
        """Channel ``i``'s complete state (copies; ``0 <= i <`` channels registered)."""
        e = self.engine
        st = e.store
        return ChannelState(channel=st.names[i], route=st.routes[i], tier=st.tiers[i],
                            windows=st.export_channel(i), watermark_ms=st.watermark_ms,
                            next_eval_ms=int(e.next_eval[i]), fail_since_eval=float(e.fail_since_eval[i]),
                            seq=int(e.seq[i]), active={k: bool(v[i]) for k, v in e.active.items()},
                            machine=machine_dict(e.machines[i]),
                            judged_since_eval=float(e.judged_since_eval[i]),
                            route_shares=e.routes.export_route_shares(i), round_state=self._round_state(i))

    def _round_state(self, i: int) -> RoundState:
        """Channel ``i``'s :class:`RoundState`: its baselines' learning flag, its part of the capacity model and
        of the route-wide rules (SPEC §4.2)."""
        e = self.engine
        cap, wide = e.routes.capacity, e.routes.wide
        record = None
        if i in cap.usual or i in cap.held or i in cap.max_share or i in cap.judged_since_ms or i in cap.usual_counts:
            counts = cap.usual_counts.get(i)
            record = CapacityRecord(usual=cap.usual.get(i), held=tuple(cap.held.get(i, ())),
                                    max_share=cap.max_share.get(i), judged_since_ms=cap.judged_since_ms.get(i),
                                    usual_counts=None if counts is None else (float(counts[0]), float(counts[1])))
        recent, p95 = wide.recent.get(i), wide.p95.get(i)
        return RoundState(learns=bool(e.learns[i]), capacity=record, peer_active=i in wide.peer_active,
                          wide_weight=wide.weight.get(i), panic_weight=e.routes.panic_weight.get(i),
                          fail_ratio=e.routes.fail_ratio.get(i),
                          recent=None if recent is None else (float(recent[0]), float(recent[1])),
                          p95=None if p95 is None else (int(p95[0]), float(p95[1]), float(p95[2])),
                          ok_run=e.ok_runs.get(i, 0), suspect_sent_ms=e.suspects.since_ms.get(i),
                          suspect_at_ms=e.suspects.began_ms.get(i),
                          suspect_expired_ms=e.suspects.expired.get(i))

    def import_state(self, state: ChannelState) -> int:
        """Load ``state`` (registering its channel); returns the channel's row.

        Window counters and soft findings are matched by name: one the state
        lacks starts empty/inactive, one the engine no longer has is dropped
        (counted in :attr:`dropped_state`). The route's shares are handed to
        :meth:`~pipeline.engine.route_shares.RouteShares.restore_route_shares`. Raises
        ``ValueError`` when the bucket layout or ring sizes differ from the
        engine's configuration or a field is out of range (:meth:`_check_head`,
        ``fail_since_eval`` and ``judged_since_eval`` finite >= 0): all checked
        before the engine changes, so a refused state leaves no trace.
        """
        for what, v in (("fail_since_eval", state.fail_since_eval), ("judged_since_eval", state.judged_since_eval)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"state {what} {v!r} is not a finite number >= 0")
        e = self.engine
        machine, unknown = self._check_head(state)
        e.store.check_channel(state.windows)
        i = self._register(state)
        dropped = e.store.import_channel(i, state.windows) + unknown
        self._load_head(i, state, machine)
        e.fail_since_eval[i] = state.fail_since_eval
        e.judged_since_eval[i] = state.judged_since_eval
        for name, on in state.active.items():
            if name in e.active:
                e.active[name][i] = on
            else:
                dropped.append(name)
        for name in dropped:
            self.dropped_state[name] = self.dropped_state.get(name, 0) + 1
        return i

    def hold_channel(self, head: HeldChannel, raw: bytes) -> int:
        """Register ``head``'s channel as evicted, its windows left in ``raw`` (its snapshot bytes) until its
        next event (:func:`pipeline.engine.residency.restore` imports them then); returns the channel's row.

        Loads what the route shares and the channel limit need without the windows: registry row, state
        machine, ``seq``, newest event time, next round, the route's shares. Raises ``ValueError`` (before
        the engine changes) when a field is out of range (:meth:`_check_head`).
        """
        machine, unknown = self._check_head(head)
        if not 0 <= head.last_ts_ms <= MAX_SEQ:
            raise ValueError(f"state last_ts_ms {head.last_ts_ms!r} out of range")
        for name in unknown:
            self.dropped_state[name] = self.dropped_state.get(name, 0) + 1
        e = self.engine
        i = self._register(head)
        e.residency.resident[i] = False
        e.residency.evicted[head.channel] = raw
        e.store.last_ts_ms[i] = max(int(e.store.last_ts_ms[i]), head.last_ts_ms)
        self._load_head(i, head, machine)
        return i

    def _check_head(self, head: ChannelState | HeldChannel) -> tuple[ChannelMachine, list[str]]:
        """The machine of ``head``, checked, and the reason codes it held that this engine does not know
        (left out of the machine, named ``"reason <code>"`` for :attr:`dropped_state`).

        Raises ``ValueError`` when a machine field has the wrong type or is out of range
        (:class:`~pipeline.state.wire.MachineWire`: a known state, ``weight`` 0..1, ``penalty`` and the
        baseline counts finite >= 0, times and ``seq`` 0..2**53, at most 16 reasons), or ``seq``,
        ``next_eval_ms`` or ``watermark_ms`` is out of ``0 .. 2**53``."""
        for what, v in (("seq", head.seq), ("next_eval_ms", head.next_eval_ms or 0),
                        ("watermark_ms", head.watermark_ms or 0)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not 0 <= v <= MAX_SEQ:
                raise ValueError(f"state {what} {v!r} is not an integer in 0 .. 2**53")
        check_round_state(head.round_state)
        try:
            wire = msgspec.convert(dict(head.machine), MachineWire)
        except (msgspec.ValidationError, TypeError) as exc:
            raise ValueError(f"state machine: {exc}") from None
        e = self.engine
        known = ({d.reason for d in (*e.hard, *e.soft)} | {d.reason for d, _ in e.advisory} | {NO_DATA}
                 | set(CLASS_REASON.values()) | {OVER_CAPACITY, PEER_LATENCY})  # SPEC §4.2's soft reasons
        unknown = [f"reason {r}" for r in wire.reasons if r not in known]
        fields = msgspec.structs.asdict(wire)
        fields["reasons"] = [r for r in wire.reasons if r in known]
        return _machine(fields), unknown

    def _register(self, head: ChannelState | HeldChannel) -> int:
        """The row of ``head``'s channel (registered if new), with room for it in the per-channel arrays."""
        store = self.engine.store
        i = store.channel_index(head.channel, head.route, head.tier)
        self.engine.grow(store.n_channels)
        return i

    def _load_head(self, i: int, head: ChannelState | HeldChannel, machine: ChannelMachine) -> None:
        """Row ``i``'s watermark, next round, ``seq``, ``machine`` (checked: :meth:`_check_head`) and route
        shares from ``head``; flags it changed. Shared by :meth:`import_state` and :meth:`hold_channel` (the
        fields both states carry)."""
        e = self.engine
        st = e.store
        if head.watermark_ms is not None:
            st.watermark_ms = max(st.watermark_ms or head.watermark_ms, head.watermark_ms)
        e.next_eval[i] = head.next_eval_ms or 0
        e.seq[i] = max(e.seq[i], head.seq)
        e.machines[i] = machine
        e.routes.restore_route_shares(head.route, head.route_shares)
        self._load_round_state(i, head.round_state, machine)
        e.mark_changed(i)

    def _load_round_state(self, i: int, rs: RoundState, machine: ChannelMachine) -> None:
        """Row ``i``'s :class:`RoundState` (checked: :func:`check_round_state`); ``learns`` None: from ``machine``'s
        state (a record written before the flag was saved)."""
        e = self.engine
        e.learns[i] = machine.state in LEARNING_STATES if rs.learns is None else rs.learns
        cap, wide, c = e.routes.capacity, e.routes.wide, rs.capacity
        _put(cap.usual, i, None if c is None else c.usual)
        _put(cap.held, i, None if c is None or not c.held else list(c.held))
        _put(cap.max_share, i, None if c is None else c.max_share)
        _put(cap.judged_since_ms, i, None if c is None else c.judged_since_ms)
        _put(cap.usual_counts, i, None if c is None else c.usual_counts)
        if rs.peer_active:
            wide.peer_active.add(i)
        else:
            wide.peer_active.discard(i)
        _put(wide.weight, i, rs.wide_weight)
        _put(wide.recent, i, rs.recent)
        _put(wide.p95, i, rs.p95)
        _put(e.routes.panic_weight, i, rs.panic_weight)
        _put(e.routes.fail_ratio, i, rs.fail_ratio)
        _put(e.ok_runs, i, rs.ok_run or None)  # a run of 0 acts as no entry (Engine._readmit)
        _put(e.suspects.since_ms, i, rs.suspect_sent_ms)
        _put(e.suspects.began_ms, i, rs.suspect_at_ms)
        _put(e.suspects.expired, i, rs.suspect_expired_ms)


_T = TypeVar("_T")


def _put(part: dict[int, _T], i: int, v: _T | None) -> None:
    """``part[i] = v``, or no entry for ``i`` when ``v`` is None."""
    if v is None:
        part.pop(i, None)
    else:
        part[i] = v


def check_round_state(rs: RoundState) -> None:
    """Raise ``ValueError`` when a field of ``rs`` is out of range: shares and weights in 0..1, at most
    :data:`~pipeline.policy.capacity.LOAD_ROUNDS` held shares, counts finite >= 0, a time and the
    re-admission success run integers in 0..2**53."""
    def share(what: str, v: object) -> None:
        if not (isinstance(v, float) and 0.0 <= v <= 1.0):
            raise ValueError(f"state {what} {v!r} is not a share in 0..1")

    if rs.learns is not None and not isinstance(rs.learns, (bool, np.bool_)):
        raise ValueError(f"state learns {rs.learns!r} is not a bool")
    if not (isinstance(rs.ok_run, int) and not isinstance(rs.ok_run, bool) and 0 <= rs.ok_run <= MAX_SEQ):
        raise ValueError(f"state re-admission success run {rs.ok_run!r} is not an integer in 0 .. 2**53")
    if rs.suspect_sent_ms is not None and not (isinstance(rs.suspect_sent_ms, float)
                                               and abs(rs.suspect_sent_ms) <= 2.0 ** 53):
        raise ValueError(f"state suspect_sent_ms {rs.suspect_sent_ms!r} is not a time in -2**53 .. 2**53 ms")
    if (rs.suspect_sent_ms is None) != (rs.suspect_at_ms is None) or (rs.suspect_at_ms is not None and not (
            isinstance(rs.suspect_at_ms, int) and 0 <= rs.suspect_at_ms <= MAX_SEQ)):
        raise ValueError(f"state suspect_at_ms {rs.suspect_at_ms!r} is not a time in 0 .. 2**53 ms set with "
                         "suspect_sent_ms")
    if rs.suspect_expired_ms is not None and not (isinstance(rs.suspect_expired_ms, int)
                                                  and 0 <= rs.suspect_expired_ms <= MAX_SEQ):
        raise ValueError(f"state suspect_expired_ms {rs.suspect_expired_ms!r} is not a time in 0 .. 2**53 ms")
    for what, w in (("route-wide weight", rs.wide_weight), ("panic weight", rs.panic_weight),
                    ("failure ratio", rs.fail_ratio)):
        if w is not None:
            share(what, w)
    if rs.recent is not None and not (len(rs.recent) == 2 and all(
            isinstance(x, float) and math.isfinite(x) and x >= 0 for x in rs.recent)):
        raise ValueError(f"state recent outcomes {rs.recent!r} are not two finite counts >= 0")
    if rs.p95 is not None and not (len(rs.p95) == 3 and isinstance(rs.p95[0], int) and 0 <= rs.p95[0] <= MAX_SEQ
                                   and all(isinstance(x, float) and not x < 0 and x != math.inf for x in rs.p95[1:])):
        raise ValueError(f"state peer P95 {rs.p95!r} is not (time, P95 ms, lower ms), each >= 0 or NaN")
    c = rs.capacity
    if c is None:
        return
    if len(c.held) > LOAD_ROUNDS:
        raise ValueError(f"state capacity holds {len(c.held)} shares, at most {LOAD_ROUNDS}")
    for what, v in (("usual share", c.usual), ("max_share", c.max_share), *(("held share", x) for x in c.held)):
        if v is not None:
            share(f"capacity {what}", v)
    if c.judged_since_ms is not None and not (isinstance(c.judged_since_ms, int) and 0 <= c.judged_since_ms <= MAX_SEQ):
        raise ValueError(f"state capacity judged_since_ms {c.judged_since_ms!r} is not in 0 .. 2**53")
    if c.usual_counts is not None and not (len(c.usual_counts) == 2 and all(
            isinstance(x, float) and math.isfinite(x) and x >= 0 for x in c.usual_counts)):
        raise ValueError(f"state capacity usual_counts {c.usual_counts!r} are not two finite counts >= 0")


def _machine(fields: Mapping[str, object]) -> ChannelMachine:
    """A :class:`ChannelMachine` of saved ``fields``; fields it no longer has are ignored, new ones default."""
    kept: dict[str, Any] = {k: v for k, v in fields.items() if k in _MACHINE_FIELD_SET}  # checked on import
    return ChannelMachine(**kept)
