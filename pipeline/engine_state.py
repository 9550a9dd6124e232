"""The engine's public per-channel state API: export / import a typed :class:`ChannelState`.

A mixin of :class:`pipeline.engine.Engine` (kept apart so the engine module
stays about detection); snapshots (:mod:`pipeline.state.snapshot`) and the
stream processor use only these methods, never the store's arrays.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

import numpy as np

from pipeline.policy.state_machine import ChannelMachine
from pipeline.state.channel_state import ChannelState
from pipeline.windows.store import WindowStore

#: :class:`ChannelMachine`'s fields, in order (its dict form in :class:`ChannelState`).
_MACHINE_FIELDS = tuple(f.name for f in dataclasses.fields(ChannelMachine))


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
    dropped_state: dict[str, int]
    #: Make room for ``n`` channels in the per-channel arrays (:meth:`pipeline.engine.Engine._grow`).
    _grow: Callable[[int], None]

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
                            machine=machine_dict(self.machines[i]))

    def import_state(self, state: ChannelState) -> int:
        """Load ``state`` (registering its channel); returns the channel's row.

        Window counters and soft findings are matched by name: one the state
        lacks starts empty/inactive, one the engine no longer has is dropped
        (counted in :attr:`dropped_state`). Raises ``ValueError`` when the
        bucket layout or ring sizes differ from the engine's configuration.
        """
        st = self.store
        i = st.channel_index(state.channel, state.route, state.tier)
        self._grow(st.n_channels)
        dropped = st.import_channel(i, state.windows)
        if state.watermark_ms is not None:
            st.watermark_ms = max(st.watermark_ms or state.watermark_ms, state.watermark_ms)
        self.next_eval[i] = state.next_eval_ms or 0
        self.fail_since_eval[i] = state.fail_since_eval
        self.seq[i] = max(self.seq[i], state.seq)
        for name, on in state.active.items():
            if name in self.active:
                self.active[name][i] = on
            else:
                dropped.append(name)
        fields = {f.name for f in dataclasses.fields(ChannelMachine)}
        self.machines[i] = ChannelMachine(**{k: v for k, v in state.machine.items() if k in fields})
        for name in dropped:
            self.dropped_state[name] = self.dropped_state.get(name, 0) + 1
        return i

