"""Building blocks of the event generator (:mod:`.generator`): status tables, the per-channel
run state and one block's buffered events, the event-id prefix and the status-mix pick."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from .channels import FAILURE_KINDS, ChannelProfile, LatencyModel, RouteSpec
from .faults import Fault
from .traces import AzureTrace

STATUS_NAMES: tuple[str, ...] = ("ok",) + FAILURE_KINDS
_STATUS_INDEX = {s: i for i, s in enumerate(STATUS_NAMES)}
#: Gateways that report the events (``gateway_id``), chosen uniformly.
GATEWAY_IDS: tuple[str, ...] = ("gw-eu-1", "gw-eu-2", "gw-us-1")
#: Delay between a failed attempt finishing and its retry starting, seconds.
RETRY_DELAY_S = 0.05
#: Status mix of failures caused by overload.
OVERLOAD_MIX: dict[str, float] = {"error": 0.5, "timeout": 0.3, "rate_limited": 0.2}
#: Latency of a failed ``error`` as a share of a healthy answer's latency
#: (uniform in this range: upstream errors come back early).
ERROR_LATENCY_SHARE = (0.05, 0.4)
#: Latency of a ``rate_limited`` refusal, ms (uniform).
RATE_LIMITED_LATENCY_MS = (15.0, 80.0)


def event_id_prefix(scenario: str, seed: int, start_ms: int) -> str:
    """Stable 10-hex-digit prefix of the event ids of one run.

    >>> event_id_prefix("clean-day", 0, 0) == event_id_prefix("clean-day", 0, 0)
    True
    """
    digest = hashlib.blake2b(f"{scenario}|{seed}|{start_ms}".encode(), digest_size=5).hexdigest()
    return f"sim-{digest}"


@dataclass
class _Detail:
    """Per-channel table of (status index, http_status, error_type, error_message, retry_after_s)."""

    rows: list[tuple[int, int | None, str | None, str | None, float | None]] = field(default_factory=list)

    def add(self, status: str, http: int | None, error_type: str | None, message: str | None = None,
            retry_after_s: float | None = None) -> int:
        self.rows.append((_STATUS_INDEX[status], http, error_type, message, retry_after_s))
        return len(self.rows) - 1


@dataclass
class _ChannelRun:
    profile: ChannelProfile
    route: RouteSpec
    latency: LatencyModel
    trace: AzureTrace
    rng: np.random.Generator
    faults: tuple[Fault, ...]
    detail: _Detail
    base_detail: np.ndarray  # detail index for ok/error/timeout/rate_limited
    outage_detail: list[int]
    base_mix: dict[str, float]
    load_rps: float | None = None
    pending_retries: int = 0
    text_rng: np.random.Generator | None = None
    #: ``caller_errors`` faults with the detail row of their failures (SPEC §4.1).
    caller_detail: list = field(default_factory=list)


@dataclass
class _Block:
    ts: list[np.ndarray] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)


def _mix_pick(mix: Mapping[str, float], v: np.ndarray) -> np.ndarray:
    """Status index per uniform ``v`` under ``mix`` ({status: share}, sums to 1)."""
    names = list(mix)
    cum = np.cumsum([mix[k] for k in names])
    pick = np.minimum(np.searchsorted(cum, v * cum[-1], side="right"), len(names) - 1)
    return np.array([_STATUS_INDEX[k] for k in names], dtype=np.int64)[pick]
