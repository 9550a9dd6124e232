"""Issue #33 part 4 / SPEC §4.2 "Route-wide events": scenarios about a route's channels side by side.

Registered in :data:`pipeline.tools.simulate.scenarios.SCENARIOS`. Flat load (no day curve, no bursts),
2 h healthy warm-up, real llmperf latency shapes of one model (Llama-2 70B) from four providers.

* ``route-wide``: the model's upstream slows down and fails more on every channel of a 4-channel route
  for 20 min (P95 x 2.5, failures 0.2 % -> 6 %), then recovers.
* ``peer-creep``: one channel of a 3-channel route creeps slower over two days (P95 x 1 -> x 4,
  linear), slowly enough that its own 24 h baseline follows it; its two peers stay as they were.
"""

from __future__ import annotations

from .channels import ChannelProfile, RouteSpec
from .background import never_bad
from .faults import Fault
from .scenario import WARMUP_S, Scenario

#: route-wide: how long the upstream stays slow and failing, and its P95 factor and failure share.
ROUTE_WIDE_S, ROUTE_WIDE_FACTOR, ROUTE_WIDE_ERROR = 1200, 2.5, 0.06
#: peer-creep: the creep's length (two days) and the P95 factor at its end.
CREEP_S, CREEP_FACTOR = 48 * 3600, 4.0


def _pool(route: str) -> tuple[ChannelProfile, ...]:
    """Four paid channels of Llama-2 70B, each with its provider's own llmperf latency shape."""
    return tuple(ChannelProfile(f"{src.split('_')[0]}/llama-70b@paid", route, "paid", latency_source=src,
                                latency_ms=ms, error_rate=0.002, price_in_usd_per_mtok=0.9,
                                price_out_usd_per_mtok=0.9)
                 for src, ms in (("fireworks_70b", 2400.0), ("together_70b", 2200.0), ("anyscale_70b", 2600.0),
                                 ("lepton_70b", 2300.0)))


def route_wide() -> Scenario:
    """Issue #33: the upstream of a 4-channel route slows (P95 x 2.5) and fails (6 %) on every channel for 20 min.

    Route chat-70b at 12 req/s, 3 req/s per channel. From 10:00 every channel's P95 rises x 2.5 and
    its failures 0.2 % -> 6 % within a minute (a model- or upstream-wide incident: no channel is
    better than another); 30 min after it ends. Expected: every channel leaves healthy during the
    event, its verdicts carry ``route_wide``, the route's shares stay even among the four.
    """
    t0, end = WARMUP_S, WARMUP_S + ROUTE_WIDE_S
    duration = end + 1800
    chans = _pool("chat-70b")
    faults = tuple(f for c in chans for f in (
        Fault(c.name, "latency_ramp", t0, end, {"factor": ROUTE_WIDE_FACTOR, "ramp_s": 60}),
        Fault(c.name, "error_ramp", t0, end, {"to_rate": ROUTE_WIDE_ERROR, "ramp_s": 60,
                                              "mix": {"error": 0.8, "timeout": 0.2}})))
    return Scenario(
        name="route-wide",
        description=("Route chat-70b (4 channels x 3 req/s). From 10:00 for 20 min every channel's P95 is x 2.5 "
                     "and its failures 6 % (an upstream-wide incident); then 30 min of recovery."),
        duration_s=duration, channels=chans,
        routes=(RouteSpec("chat-70b", 12.0, {c.name: 0.25 for c in chans}, burstiness=0.0),),
        faults=faults,
        expected=(*(never_bad(c.name, t0) for c in chans),
                  *({"channel": c.name, "state_in": ["degraded", "open"], "from_s": t0, "by_s": t0 + 300,
                     "reasons_any": ["route_wide"]} for c in chans),
                  *({"channel": c.name, "state_in": ["healthy"], "from_s": end, "by_s": duration}
                    for c in chans)),
        start_hour=8.0, night_fraction=1.0, latency_swing=0.0)


def peer_creep() -> Scenario:
    """Issue #33: one channel of a 3-channel route gets slower over two days (P95 x 1 -> x 4, linear).

    Route chat-70b at 3 req/s, 1 req/s per channel. From 10:00 fireworks/llama-70b@paid's latency grows
    linearly to x 4 over 48 h; its own 24 h baseline follows it (its SPEC §4.3 ratio stays under the
    1.8 trip line), its peers together/ and anyscale/ stay as they are. Expected: flagged
    ``peer_latency`` (P95 >= 3 x the peers' median) in the last third of the creep, never before the
    creep passes x 2.5; the peers stay healthy throughout.
    """
    t0 = WARMUP_S
    duration = t0 + CREEP_S
    creeper, *peers = _pool("chat-70b")[:3]
    # the creep's P95 factor is 1 + 3 t / 48 h: x 2.5 at 24 h, x 3 at 32 h
    x25 = t0 + CREEP_S * (2.5 - 1.0) / (CREEP_FACTOR - 1.0)
    return Scenario(
        name="peer-creep",
        description=("Route chat-70b (3 channels x 1 req/s). From 10:00 fireworks/llama-70b@paid's latency "
                     "creeps x 1 -> x 4 over 48 h; its peers stay as they are."),
        duration_s=duration, channels=(creeper, *peers),
        routes=(RouteSpec("chat-70b", 3.0, {c.name: 1 / 3 for c in (creeper, *peers)}, burstiness=0.0),),
        faults=(Fault(creeper.name, "latency_ramp", t0, duration, {"factor": CREEP_FACTOR, "ramp_s": CREEP_S}),),
        expected=(never_bad(creeper.name, x25),
                  {"channel": creeper.name, "state_in": ["degraded"], "from_s": x25, "by_s": duration,
                   "reasons_any": ["peer_latency"]},
                  *(never_bad(c.name, duration) for c in peers)),
        start_hour=8.0, night_fraction=1.0, latency_swing=0.0)
