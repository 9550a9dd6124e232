"""The typed per-channel state the engine exports and imports (:meth:`pipeline.engine.state_io.StateIO.export_state`).

:mod:`pipeline.state.snapshot` turns it into bytes and back; nothing outside
the engine reaches into the engine's or the store's arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.windows.view import ChannelWindows


#: Most channels of a route whose shares go into its channels' snapshots (a record holds them all, so a
#: route's records grow with the square of its size; routes are groups of interchangeable providers).
#: Larger routes are not saved and start their growth bound afresh after a restart.
MAX_SAVED_ROUTE = 64


@dataclass(frozen=True)
class RouteShareRecord:
    """A route's traffic shares (:mod:`pipeline.engine.route_shares`), as saved with each of its channels.

    ``version``: >= 1, raised with every change of the shares, so that the
    newest of the records a route's channels carry wins on restore (an idle or
    evicted channel keeps an older one); ``shares``: channel -> share after the
    route's last round (at most :data:`MAX_SAVED_ROUTE` channels) (0..1, summing to 1 or all 0); ``round_ms``: the round
    boundary (event time, ms) the route was last computed at; ``round_start``:
    channel -> share before that boundary, where the growth bound of a later
    computation at the same boundary starts (None: no bound for that round).
    """

    version: int
    shares: dict[str, float]
    round_ms: int
    round_start: dict[str, float] | None


@dataclass(frozen=True)
class CapacityRecord:
    """A channel's part of the route capacity model (:class:`pipeline.policy.capacity.CapacityModel`,
    SPEC §4.2 "capacity, not breakage"), as saved with it.

    ``usual``: its usual share (0..1; None before a clean healthy round); ``held``: the shares it held
    over its last rounds (each 0..1, at most :data:`~pipeline.policy.capacity.LOAD_ROUNDS`, newest last);
    ``max_share``: its learned cap (0..1; None: uncapped); ``judged_since_ms``: event time (ms) it is
    judged since while capped (None: not set); ``usual_counts``: (requests, failures) of its clean
    healthy minutes, decayed (each >= 0; None before one).
    """

    usual: float | None = None
    held: tuple[float, ...] = ()
    max_share: float | None = None
    judged_since_ms: int | None = None
    usual_counts: tuple[float, float] | None = None


@dataclass(frozen=True)
class RoundState:
    """What a channel's verdicts depend on besides its windows, machine and route shares (SPEC §4.2), as
    of its last round; every field at its default is what a record written before it restores to.

    ``learns``: whether its events enter the 24 h baselines until its next round (its state at its
    last round was ``healthy`` or ``no_data``; None: take it from the machine's state);
    ``capacity``: its part of the capacity model (None: untracked); ``peer_active``: its
    ``peer_latency`` finding is in force (the rule's hysteresis, :mod:`pipeline.policy.route_wide`);
    ``wide_weight``: the weight a route-wide event holds it at (None: not a member); ``panic_weight``:
    the weight the route's panic floor keeps it at (None: not kept); ``fail_ratio``: its recent failure
    ratio the panic floor ranks by (0..1; None: no round yet); ``recent``: its last minute's (judged
    requests, failures) the route-wide rule reads (each >= 0); ``p95``: (round ms, 5 min P95 ms, its
    lower bound ms) its peers read (NaN: no P95). The last four as of its last round, read by route
    peers reaching a round boundary in another call than its own, and by a trip before its next round.
    ``ok_run``: the successes in a row its own traffic showed while ``open``, as of its last event (``Engine.ok_runs``, the
    re-admission run of :mod:`pipeline.policy.readmit`; 0 .. 2**53, 0: none). ``suspect_sent_ms``: while it is
    suspect (:mod:`pipeline.engine.suspects`), when the request that made it suspect was sent (epoch ms, finite;
    None: not suspect); ``suspect_at_ms``: the event time it became suspect at (epoch ms; set with it);
    ``suspect_expired_ms``: when its last suspicion ran out while its failure run went on (epoch ms; None: none),
    so that it is not suspected again before a success.
    """

    learns: bool | None = None
    capacity: CapacityRecord | None = None
    peer_active: bool = False
    wide_weight: float | None = None
    panic_weight: float | None = None
    fail_ratio: float | None = None
    recent: tuple[float, float] | None = None
    p95: tuple[int, float, float] | None = None
    ok_run: int = 0
    suspect_sent_ms: float | None = None
    suspect_at_ms: int | None = None
    suspect_expired_ms: int | None = None


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
    :class:`~pipeline.policy.state_machine.ChannelMachine` fields;
    ``judged_since_eval``: judged requests (success or upstream failure) since
    its last round, which the round adds with ``fail_since_eval`` to the
    probe's pre-incident baseline (:meth:`ChannelMachine.learn`);
    ``route_shares``: its route's traffic shares as the engine held them
    (None: no round of the route yet); ``round_state``: :class:`RoundState`.
    States written before the last three existed restore with 0.0, None and
    ``RoundState()``.
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
    judged_since_eval: float = 0.0
    route_shares: RouteShareRecord | None = None
    round_state: RoundState = RoundState()


@dataclass(frozen=True)
class HeldChannel:
    """What the engine keeps of a channel restored as evicted (:meth:`pipeline.engine.state_io.StateIO.hold_channel`):
    its state without the windows, which stay in the snapshot bytes until the channel's next event.

    Fields as in :class:`ChannelState`, plus ``last_ts_ms``: its newest event time (event time, ms).
    """

    channel: str
    route: str
    tier: str | None
    last_ts_ms: int
    watermark_ms: int | None
    next_eval_ms: int | None
    seq: int
    machine: dict[str, object]
    route_shares: RouteShareRecord | None = None
    round_state: RoundState = RoundState()
