"""The paced stage's feed, built before its clock starts.

The paced stage of ``channel-health bench`` offers a live topic ``rate``
events/s for ``seconds`` of wall time, event time running ``speed`` times
faster. It used to build and JSON-encode the events while feeding (about 0.4
of a core at 95,000 events/s on the 2-core machine, CPU taken from the worker
under test, whereas the batched rate it halves was measured on pre-filled
topics). :func:`paced_schedule` builds the same feed in advance -- the feeder
then only sends bytes at their times:

- a tick every ``tick_s`` (20 ms, the feeder's sleep) at offset ``t``: the
  events due so far, ``int(rate * t)`` minus those already built, with event
  times drawn uniformly in ``[start_ms + speed * t_prev, start_ms + speed * t)``
  (ms) and sorted, each on a uniformly drawn channel;
- those events go through a :class:`~pipeline.tools.bench.fill.PartitionBatcher`
  (``batch_size``-event envelopes per partition, full ones are sent at once);
- every ``flush_s`` (100 ms, a gateway's flush deadline) the partly filled
  envelopes are sent too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.tools.bench import workload as W
from pipeline.tools.bench.fill import PartitionBatcher


@dataclass(frozen=True)
class Tick:
    """What the feeder sends ``offset_s`` seconds after its clock starts.

    ``messages``: ``(partition, envelope bytes, newest ts_ms in it)`` in send order; ``events``: how many
    events were built at this tick (in this tick's full envelopes or sent by a later flush; as the live
    feeder did, events still buffered after the last tick are not sent).
    """

    offset_s: float
    messages: list[tuple[int, bytes, int]]
    events: int


def paced_schedule(ch: W.Channels, start_ms: int, rate: float, seconds: float, speed: float, partitions: int,
                   batch_size: int, seed: int = 11, tick_s: float = 0.02, flush_s: float = 0.1) -> list[Tick]:
    """The ticks of a paced feed (see the module doc), only those that send something, in time order.

    ``rate`` > 0 events/s of wall time; ``seconds`` > 0 of wall time (ticks at ``k * tick_s < seconds``);
    ``speed`` > 0 ms of event time per wall ms; ``tick_s`` > 0 and ``flush_s`` a multiple of it (>= 1 tick).
    Event ids are ``paced-<n>`` numbered from 0; the same arguments give the same bytes. Memory: the
    encoded envelopes (~280 bytes per event, ~0.55 GB for 20 s at 95,000 events/s).

    Raises ValueError for a non-positive ``rate``, ``seconds``, ``speed`` or ``tick_s``.
    """
    if rate <= 0 or seconds <= 0 or speed <= 0 or tick_s <= 0:
        raise ValueError("rate, seconds, speed and tick_s must be > 0")
    flush_every = max(1, round(flush_s / tick_s))
    rng = np.random.default_rng(seed)
    batcher = PartitionBatcher(partitions, batch_size)
    ticks: list[Tick] = []
    n_built, ev_prev = 0, start_ms
    k = 0
    while (t := k * tick_s) < seconds:
        msgs: list[tuple[int, bytes, int]] = []
        n_new = int(rate * t) - n_built
        ev_now = start_ms + int(t * speed * 1000)
        if n_new > 0:
            ts = np.sort(rng.integers(ev_prev, max(ev_now, ev_prev + 1), n_new))
            evs = W.events(ch, ts, rng.integers(0, len(ch), n_new), 1000 + n_built, "paced", id_start=n_built)
            full = batcher.add(evs)
            msgs += [(p, v, mts) for (p, v), mts in zip(full, batcher.last_max_ts)]
            n_built += n_new
            ev_prev = ev_now
        if k > 0 and k % flush_every == 0:
            part = batcher.flush()
            msgs += [(p, v, mts) for (p, v), mts in zip(part, batcher.last_max_ts)]
        if msgs or n_new > 0:
            ticks.append(Tick(t, msgs, max(n_new, 0)))
        k += 1
    return ticks
