"""Re-admission on evidence: an ``open`` channel whose own traffic answers again (SPEC §4.2, issue #33).

A channel opened by the §4 detectors waits out its cooldown before a ``half_open`` probe, because
nobody knows whether it is back and a probe costs the requests it fails. When requests still reach the
open channel (a gateway that retries, or routes by its own rules, keeps sending them) its answers are
that evidence: a run of ``k`` successes in a row (``PolicyConfig.readmit_success_run``, default 10)
says it serves again. While another channel of its route carries more than its learned ``max_share``
(the route is short of capacity: every second the channel stays out, the overloaded peer fails
requests), such a channel goes ``half_open`` at the event that completed the run instead of at the end
of its cooldown, and its route's shares are recomputed at once (the peer's excess goes to it when it
serves as well: :func:`~pipeline.policy.capacity.cap_shares`).

Sources: Higress ai-proxy re-adds a removed key after one successful health check
(``provider/failover.go``, ``successThreshold`` 1, every 5 s); Envoy un-ejects a host on a successful
active health check (``successful_active_health_check_uneject_host``, default true). Here the check is
passive (the channel's own answers) and asks for ``k`` in a row: a channel still failing half of its
requests shows such a run at a given request with probability 0.5**k (1e-3 for k = 10), and a wrong
re-admission costs one failed probe (a run of ``half_open_failure_run`` = 2 failures re-opens it).
"""

from __future__ import annotations

import numpy as np

__all__ = ["success_run_crossing"]


def success_run_crossing(outcome: np.ndarray, run: int, k: int) -> tuple[int, int]:
    """Where a run of successes reaches ``k`` in one channel's events, in order.

    ``outcome`` int (n,): 1 upstream failure, 0 success, -1 neutral (cancelled / filtered: neither breaks
    nor extends the run); ``run`` >= 0 the successes in a row before these events; ``k`` >= 1.
    Returns ``(index, run_after)``: the index of the event that made the run reach ``k`` (-1: none) and
    the trailing run after all the events.

    >>> success_run_crossing(np.array([0, 1, 0, 0, -1, 0]), 0, 3)
    (5, 3)
    >>> success_run_crossing(np.array([0, 0]), 1, 3)
    (1, 3)
    >>> success_run_crossing(np.array([0, 1]), 1, 3)
    (-1, 0)
    """
    if k < 1 or run < 0:
        raise ValueError(f"need k >= 1 and run >= 0, got k={k}, run={run}")
    judged = np.flatnonzero(outcome >= 0)
    if judged.size == 0:
        return -1, run
    ok = outcome[judged] == 0
    fails = np.flatnonzero(~ok)
    # the run at each judged event: successes since the last failure (plus ``run`` before any failure)
    pos = np.arange(judged.size)
    last_fail = np.full(judged.size, -1)
    last_fail[fails] = fails
    last_fail = np.maximum.accumulate(last_fail)
    runs = np.where(last_fail < 0, run + pos + 1, pos - last_fail)
    runs[~ok] = 0
    hit = np.flatnonzero(runs >= k)
    return (int(judged[hit[0]]) if hit.size else -1), int(runs[-1])
