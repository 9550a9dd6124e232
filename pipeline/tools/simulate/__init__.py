"""Traffic simulator: realistic gateway request events in event time (SPEC §5).

A pure generator (no sleeping, no I/O besides reading ``../shared/data`` or,
where it is absent, the samples shipped in :mod:`.samples`):
another component publishes the events to Kafka or feeds them straight into
the detector engine.

Modules: :mod:`.traces` (loaders for the real data), :mod:`.samples` (the
shipped samples and their derivation), :mod:`.load` (day/night
curve, burstiness), :mod:`.channels` (channel and route profiles, latency
model), :mod:`.answers` (structured answers from BFCL), :mod:`.faults`
(injected faults), :mod:`.usage_faults` (stream stalls, quota drain, cost
creep), :mod:`.replay` (real-provider replay), :mod:`.generator`
(the block-wise event engine), :mod:`.scenarios` (``SCENARIOS``; the
slow-failure and quota-exhaustion builders are in :mod:`.scenarios_usage`).

Typical use::

    from pipeline.tools.simulate import get_scenario
    sc = get_scenario("gradual-degradation")
    for event in sc.events(start_ms=1_700_000_000_000, seed=1):
        ...  # dict with RequestEvent field names
"""

from .channels import BASE_ERROR_RATE, ChannelProfile, LatencyModel, RouteSpec
from .faults import FAULT_KINDS, Fault
from .load import DiurnalCurve
from .replay import ReplayChannel
from .scenarios import SCENARIOS, WARMUP_S, Scenario, get_scenario
from .traces import DEFAULT_DATA_DIR, DataNotFoundError

__all__ = [
    "BASE_ERROR_RATE",
    "ChannelProfile",
    "DataNotFoundError",
    "DEFAULT_DATA_DIR",
    "DiurnalCurve",
    "FAULT_KINDS",
    "Fault",
    "LatencyModel",
    "ReplayChannel",
    "RouteSpec",
    "SCENARIOS",
    "Scenario",
    "WARMUP_S",
    "get_scenario",
]
