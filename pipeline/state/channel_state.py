"""The typed per-channel state the engine exports and imports (:meth:`pipeline.engine.Engine.export_state`).

:mod:`pipeline.state.snapshot` turns it into bytes and back; nothing outside
the engine reaches into the engine's or the store's arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.windows.view import ChannelWindows


@dataclass
class ChannelState:
    """One channel's complete detector state.

    ``windows``: its rows of every window ring, counters by name
    (:class:`~pipeline.windows.view.ChannelWindows`); ``watermark_ms``: the
    worker's watermark when exported (event time, ms; None = no events yet);
    ``next_eval_ms``: its next round boundary (0/None = not scheduled);
    ``fail_since_eval``: failures since its last round; ``seq``: its last
    verdict ``seq``; ``active``: soft signal name → whether its finding was
    in force (a signal missing here starts inactive); ``machine``: the
    :class:`~pipeline.policy.state_machine.ChannelMachine` fields.
    """

    channel: str
    route: str
    tier: str | None
    windows: ChannelWindows
    watermark_ms: int | None
    next_eval_ms: int | None
    fail_since_eval: float
    seq: int
    active: dict[str, bool]
    machine: dict[str, object]
