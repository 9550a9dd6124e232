"""The engine's public per-channel state API: export / import a typed :class:`ChannelState`.

A mixin of :class:`pipeline.engine.Engine` (kept apart so the engine module
stays about detection); snapshots (:mod:`pipeline.state.snapshot`) and the
stream processor use only these methods, never the store's arrays.

Change tracking (issue #15): ``Engine.changed`` flags, per channel row, that
its exported state may differ from the one its last captured snapshot holds.
The engine sets it where a channel's state changes: events accepted into its
windows, a round that steps its machine, flips a finding or publishes a
verdict (``seq``), quality scores, a restore (:meth:`EngineStateIO.import_state`,
:meth:`EngineStateIO.hold_channel`) and an eviction; new channels
start flagged. A round of a channel that is idle and already reported
``no_data`` only moves its next round boundary (``next_eval_ms``): not
flagged, since a restore from its older record replays those rounds, which
change nothing either. Events refused or too late change no channel's state.
The snapshot capture takes and clears the flags (:meth:`EngineStateIO.take_changed`)
and puts them back when its records are not published (:meth:`EngineStateIO.mark_changed`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping

import msgspec
import numpy as np

from pipeline.policy.state_machine import NO_DATA, ChannelMachine
from pipeline.state.channel_state import ChannelState, HeldChannel, RouteShareRecord
from pipeline.state.wire import MAX_SEQ, MachineWire
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


class EngineStateIO:
    """Per-channel state in and out of an :class:`~pipeline.engine.Engine` (which provides the attributes)."""

    store: WindowStore
    machines: list[ChannelMachine]
    seq: list[int]
    active: dict[str, np.ndarray]
    next_eval: np.ndarray
    fail_since_eval: np.ndarray
    judged_since_eval: np.ndarray
    dropped_state: dict[str, int]
    #: The engine's detectors (their ``reason`` codes are the ones a restored machine may hold).
    hard: tuple
    soft: tuple
    advisory: tuple
    changed: np.ndarray
    resident: np.ndarray
    evicted: dict[str, bytes]
    #: Make room for ``n`` channels in the per-channel arrays (:meth:`pipeline.engine.Engine._grow`).
    _grow: Callable[[int], None]
    #: Route shares in and out of snapshots (:class:`pipeline.engine.route_shares.RouteShares`).
    export_route_shares: Callable[[int], RouteShareRecord | None]
    restore_route_shares: Callable[[str, RouteShareRecord | None], None]

    @property
    def channel_rows(self) -> Mapping[str, int]:
        """Channel name → row in the engine's per-channel arrays (read-only; channels seen or restored)."""
        return self.store.index

    def export_state(self, i: int) -> ChannelState:
        """Channel ``i``'s complete state (copies; ``0 <= i <`` channels registered)."""
        st = self.store
        return ChannelState(channel=st.names[i], route=st.routes[i], tier=st.tiers[i],
                            windows=st.export_channel(i), watermark_ms=st.watermark_ms,
                            next_eval_ms=int(self.next_eval[i]), fail_since_eval=float(self.fail_since_eval[i]),
                            seq=int(self.seq[i]), active={k: bool(v[i]) for k, v in self.active.items()},
                            machine=machine_dict(self.machines[i]),
                            judged_since_eval=float(self.judged_since_eval[i]),
                            route_shares=self.export_route_shares(i))

    def mark_changed(self, rows) -> None:
        """Flag channel rows ``rows`` (ints or a bool mask over the registered channels) as changed since
        their last captured snapshot (see the module docstring)."""
        self.changed[rows] = True

    def take_changed(self, start: int = 0, stop: int | None = None, refresh_every: int = 0,
                     refresh_phase: int = 0) -> np.ndarray:
        """Rows in ``start:stop`` (positions in the append-only channel list) flagged changed, and clear
        their flags; with ``refresh_every`` > 0 also the rows ``r`` with ``r % refresh_every == refresh_phase``
        (so that, with the phase stepping once per capture, every channel is captured at least every
        ``refresh_every`` captures however long it stays unchanged). Returns sorted int64 rows.
        Raises ``ValueError`` for ``start < 0`` or ``refresh_every < 0``."""
        if start < 0 or refresh_every < 0:
            raise ValueError(f"start and refresh_every must be >= 0, got {start!r}, {refresh_every!r}")
        c = self.store.n_channels
        stop = c if stop is None else min(stop, c)
        if start >= stop:
            return np.zeros(0, np.int64)
        flags = self.changed[start:stop]
        if refresh_every:
            first = start + (refresh_phase - start) % refresh_every
            flags = flags.copy()
            flags[first - start::refresh_every] = True
        rows = np.flatnonzero(flags) + start
        self.changed[rows] = False
        return rows

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
        machine, unknown = self._check_head(state)
        self.store.check_channel(state.windows)
        i = self._register(state)
        dropped = self.store.import_channel(i, state.windows) + unknown
        self._load_head(i, state, machine)
        self.fail_since_eval[i] = state.fail_since_eval
        self.judged_since_eval[i] = state.judged_since_eval
        for name, on in state.active.items():
            if name in self.active:
                self.active[name][i] = on
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
        i = self._register(head)
        self.resident[i] = False
        self.evicted[head.channel] = raw
        self.store.last_ts_ms[i] = max(int(self.store.last_ts_ms[i]), head.last_ts_ms)
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
        try:
            wire = msgspec.convert(dict(head.machine), MachineWire)
        except (msgspec.ValidationError, TypeError) as exc:
            raise ValueError(f"state machine: {exc}") from None
        known = {d.reason for d in (*self.hard, *self.soft)} | {d.reason for d, _ in self.advisory} | {NO_DATA}
        unknown = [f"reason {r}" for r in wire.reasons if r not in known]
        fields = msgspec.structs.asdict(wire)
        fields["reasons"] = [r for r in wire.reasons if r in known]
        return _machine(fields), unknown

    def _register(self, head: ChannelState | HeldChannel) -> int:
        """The row of ``head``'s channel (registered if new), with room for it in the per-channel arrays."""
        i = self.store.channel_index(head.channel, head.route, head.tier)
        self._grow(self.store.n_channels)
        return i

    def _load_head(self, i: int, head: ChannelState | HeldChannel, machine: ChannelMachine) -> None:
        """Row ``i``'s watermark, next round, ``seq``, ``machine`` (checked: :meth:`_check_head`) and route
        shares from ``head``; flags it changed. Shared by :meth:`import_state` and :meth:`hold_channel` (the
        fields both states carry)."""
        st = self.store
        if head.watermark_ms is not None:
            st.watermark_ms = max(st.watermark_ms or head.watermark_ms, head.watermark_ms)
        self.next_eval[i] = head.next_eval_ms or 0
        self.seq[i] = max(self.seq[i], head.seq)
        self.machines[i] = machine
        self.restore_route_shares(head.route, head.route_shares)
        self.changed[i] = True


def _machine(fields: Mapping[str, object]) -> ChannelMachine:
    """A :class:`ChannelMachine` of saved ``fields``; fields it no longer has are ignored, new ones default."""
    return ChannelMachine(**{k: v for k, v in fields.items() if k in _MACHINE_FIELD_SET})
