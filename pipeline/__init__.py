"""channel-health: streaming channel-health detection for LLM gateways.

Data flow (one sub-package per stage): ``ingest`` (bytes → validated events or
dead letters) → ``windows`` (event-time rings per channel) → ``signals``
(one module per SPEC §4 signal) → ``policy`` (state machine, weights) →
``stream`` (faust wiring) → ``sinks`` (ClickHouse) and ``router`` (the
subscriber library routers embed).
"""

__version__ = "0.1.0"
