"""Snapshots of changed channels only (issue #15): which channels are flagged, and exact restarts from a
state topic where idle channels' records are many captures old.

Guarantee checked: a worker restarted from a state topic written by changed-only captures (newest record
per channel, each with the input offsets it covers; idle channels' records many captures old) and an
older committed offset publishes exactly the verdicts that a restart from full snapshots taken at the same
points publishes, and those are the verdicts of the worker that never stopped (same ``(channel, seq)``
set, same content), on seeded streams where channels go idle for hours (``no_data``, heartbeats,
eviction), return, and trip, with restarts at 3 points per stream and captures every 3-40 input
messages. Source of the argument: :mod:`pipeline.engine.capture`.

One exception: ``route_share`` depends on where the worker's batches are cut (a channel's share at a
round boundary is computed with the weights of the route's channels that have reached that boundary in
the same or an earlier call), and the restarted worker is fed in other batches than the one that never
stopped; so it is left out of that comparison (not of the one between the two restarts).
:func:`test_restarts_continue_route_shares_and_probe_baselines_exactly` feeds both the same batches and
compares everything, ``route_share`` and each channel's final state included.
"""

from __future__ import annotations

import math
import random

import msgspec
import pytest

from pipeline.config import StateLimits
from pipeline.contracts import RequestEvent
from pipeline.engine import Engine
from pipeline.engine.batch import BatchProcessor
from tests.unit.test_restart_shares import final_state
from tests.unit.test_stream_delivery import key, run_batches

_enc = msgspec.json.Encoder()
HOUR = 3_600_000
START_MS = 1_780_000_000_000 - 1_780_000_000_000 % HOUR
#: channel → route, active spans (hours from the start), failure burst start (hours) or None
CHANNELS = {
    "a0/m@paid": ("chat", [(0, 3)], None),
    "a1/m@paid": ("chat", [(0, 0.67), (2.5, 3)], None),        # idle 110 min: no_data, heartbeats, evicted, back
    "a2/m@paid": ("chat", [(0, 3)], 1.5),                       # trips open at 1.5 h
    "b0/m@paid": ("embed", [(0, 3)], None),
    "b1/m@paid": ("embed", [(0, 0.17)], None),                  # idle from 10 min to the end
    "b2/m@paid": ("embed", [(1, 3)], None),                     # new after 1 h
}


def _messages(seed: int) -> list[bytes]:
    """One partition of batch envelopes, one per channel and aligned 10 s span, span after span (as
    ``BatchingProducer`` makes them; no span straddles a 30 s round boundary, so verdicts do not depend
    on where a worker's batches are cut)."""
    rng = random.Random(seed)
    spans: dict[tuple[int, str], list[dict]] = {}
    for ch, (route, active, burst) in CHANNELS.items():
        for lo, hi in active:
            t, end = START_MS + int(lo * HOUR), START_MS + int(hi * HOUR)
            while t < end:
                lat = 200.0 * (1 + 0.2 * math.sin(t / 600_000)) * math.exp(rng.gauss(0, 0.25))
                failing = burst is not None and 0 <= t - START_MS - burst * HOUR < 20_000
                spans.setdefault(((t - START_MS) // 10_000, ch), []).append(
                    {"event_id": f"{ch}#{t}", "ts_ms": t, "channel": ch, "route": route, "tier": "paid",
                     "status": "error" if failing else "ok", "latency_ms": round(lat, 2)})
                t += rng.randint(2_000, 6_000)
    return [_enc.encode({"events": spans[key]}) for key in sorted(spans)]


def _limits() -> StateLimits:
    return StateLimits(evict_idle_ms=HOUR)


def _processor() -> BatchProcessor:
    return BatchProcessor(Engine(limits=_limits()), clock_ms=lambda: START_MS + 4 * HOUR)


#: Batch sizes the worker is fed in (small: snapshots fall between many batches).
SIZES = (1, 3, 8, 20)


def _without_share(v):
    """``v`` without ``route_share`` (see the module docstring)."""
    return msgspec.structs.replace(v, metrics={k: x for k, x in v.metrics.items() if k != "route_share"})


def _restarted(msgs: list[bytes], reference: list, state_topic: dict, committed: int, resent: int,
               rng: random.Random) -> dict:
    """(channel, seq) → verdict of a worker that published ``reference[:resent]``, died, and a new one
    restored from ``state_topic`` that resumed at input offset ``committed``; re-sent verdicts must match."""
    after = _processor()
    after.load_snapshots(state_topic, assigned=[0])
    by_key: dict = {}
    for v in reference[:resent] + run_batches(after, msgs, committed, len(msgs), rng, SIZES):
        assert _without_share(by_key.setdefault(key(v), v)) == _without_share(v), f"{key(v)} re-sent differently"
    return by_key


@pytest.mark.parametrize("seed,refresh_every", [(1, 7), (2, 0), (3, 50)])
def test_restarts_from_records_of_changed_channels_only_are_exact(seed: int, refresh_every: int) -> None:
    msgs = _messages(seed)
    rng = random.Random(seed)
    worker = _processor()
    topic: dict[str, tuple[bytes, dict[int, int], int | None]] = {}
    captures: list[tuple[int, int, dict, dict]] = []  # (input covered, verdicts so far, topic, full snapshot)
    captured: list[list[str]] = []
    due = [rng.randint(3, 40)]

    def maybe_capture(pos: int, n_verdicts: int) -> None:
        if pos < due[0]:
            return
        full = {name: (blob, offs, part) for name, blob, offs, part in worker.snapshot_records({0: pos - 1})}
        records = worker.snapshot_capture({0: pos - 1}, changed_only=True, refresh_every=refresh_every,
                                          refresh_phase=len(captures) % max(refresh_every, 1))()
        captured.append([name for name, *_ in records])
        topic.update({name: (blob, offs, part) for name, blob, offs, part in records})
        captures.append((pos, n_verdicts, dict(topic), full))
        due[0] = pos + rng.randint(3, 40)

    reference = run_batches(worker, msgs, 0, len(msgs), rng, SIZES, maybe_capture)
    ref = {key(v): _without_share(v) for v in reference}
    assert len(ref) == len(reference) > 500
    assert {"no_data", "open", "half_open", "healthy"} <= {v.state for v in reference}
    assert worker.engine.residency.evictions >= 2 and worker.engine.residency.returns >= 1
    # b1, idle from 10 min on, is captured for its own changes (events, rounds until no_data, heartbeats until
    # its eviction, the eviction) and once per refresh_every captures: 20-30 of ~220 captures without refresh
    idle = sum("b1/m@paid" in names for names in captured)
    assert idle <= 35 + (len(captures) // refresh_every if refresh_every else 0) < len(captures) // 2

    for k in sorted(rng.sample(range(len(captures) // 10, len(captures) - 1), 3)):
        pos, _, state_topic, full = captures[k]
        committed = captures[max(0, k - rng.randrange(0, 3))][0]   # the consumer's commit may lag the snapshot
        resent = captures[k + 1][1]                                 # ran on to the next capture, then was killed
        if refresh_every == 0:  # idle channels restore from records older than the last capture
            assert any(offs[0] < pos - 1 for _, offs, _ in state_topic.values())
        got = _restarted(msgs, reference, state_topic, committed, resent, random.Random(seed * 100 + k))
        want = _restarted(msgs, reference, full, committed, resent, random.Random(seed * 100 + k))
        assert got == want, f"restart at capture {k} (input {pos}): not what full snapshots give"
        assert {k2: _without_share(v) for k2, v in got.items()} == ref, f"restart at capture {k} (input {pos})"


def _batches(n_msgs: int, rng: random.Random) -> list[int]:
    """Batch boundaries over ``n_msgs`` input messages: 0, then sizes drawn from :data:`SIZES`, ending at n."""
    cuts = [0]
    while cuts[-1] < n_msgs:
        cuts.append(min(n_msgs, cuts[-1] + rng.choice(SIZES)))
    return cuts


def _feed(bp: BatchProcessor, msgs: list[bytes], cuts: list[int], lo: int, hi: int, on_batch=None) -> list:
    """The verdicts of ``msgs[lo:hi]`` (``lo``, ``hi`` in ``cuts``) fed to ``bp`` batch by batch (partition 0,
    offset = index); ``on_batch(next offset, verdicts so far)`` after each batch."""
    out: list = []
    for a, b in zip(cuts, cuts[1:]):
        if lo <= a and b <= hi:
            bp.set_partition_status({0: b >= len(msgs)})
            out += bp.process(msgs[a:b], [0] * (b - a), list(range(a, b))).verdicts
            if on_batch is not None:
                on_batch(b, len(out))
    return out


def test_restarts_continue_route_shares_and_probe_baselines_exactly(seed: int = 2) -> None:
    """Guarantee: fed the same batches after the restart as the worker that never stopped, a worker restored
    from changed-only records publishes exactly its verdicts (``route_share`` included: a route's shares and
    the round in progress are in its channels' records, the newest version winning) and ends with every
    channel's state machine (the half-open probe's pre-incident baseline, fed by the judged requests since
    the last round) and route shares identical; restarts at 2 captures in the second half of a seeded stream, resuming at
    the capture or up to 2 captures earlier (covered input replayed; idle channels restored as evicted).
    Finer cuts across a recovery ramp: ``tests/unit/test_restart_shares.py``."""
    msgs = _messages(seed)
    rng = random.Random(seed)
    cuts = _batches(len(msgs), rng)
    worker = _processor()
    topic: dict = {}
    captures: list[tuple[int, int, dict]] = []  # (input covered, verdicts so far, state topic)

    def capture(pos: int, n_verdicts: int) -> None:
        if rng.random() < 0.2:
            records = worker.snapshot_capture({0: pos - 1}, changed_only=True)()
            topic.update({name: (blob, offs, part) for name, blob, offs, part in records})
            captures.append((pos, n_verdicts, dict(topic)))

    reference = _feed(worker, msgs, cuts, 0, len(msgs), capture)
    final = final_state(worker.engine)
    shares = {v.metrics.get("route_share") for v in reference if v.route == "chat"}
    assert len(shares) > 5 and {"open", "half_open", "recovering"} <= {v.state for v in reference}
    assert any(m["base_requests"] > 0 for m, *_ in final.values())
    held = 0
    for k in sorted(rng.sample(range(len(captures) // 2, len(captures)), 2)):
        pos, n_verdicts, state_topic = captures[k]
        committed = captures[max(0, k - rng.randrange(0, 3))][0]
        after = _processor()
        after.load_snapshots(state_topic, assigned=[0])
        held += len(after.engine.residency.evicted)  # idle channels restored as evicted: their route shares too
        got = {key(v): v for v in _feed(after, msgs, cuts, committed, len(msgs))}
        ref = {key(v): v for v in reference}
        assert all(ref[k2] == v for k2, v in got.items()), f"restart at capture {k} (input {pos})"
        assert {key(v) for v in reference[n_verdicts:]} <= got.keys()
        assert final_state(after.engine) == final, f"restart at capture {k} (input {pos})"
    assert held >= 2


def test_changed_flags_follow_events_rounds_and_verdicts() -> None:
    """New channels and channels with events are flagged; once x is idle and reported ``no_data``, its round
    flags it exactly when it publishes (the heartbeats, every ``no_data_heartbeat_ms``) and never otherwise;
    ``take_changed`` clears what it returns."""
    eng = Engine(limits=StateLimits(evict_idle_ms=0))

    def ev(ch: str, t: int) -> RequestEvent:
        return RequestEvent(event_id=f"{ch}{t}", ts_ms=t, channel=ch, route="r", status="ok", latency_ms=100.0,
                            tier="paid")

    eng.process((batch := [ev("x", START_MS), ev("y", START_MS)]), low_watermark_ms=START_MS,
                fields=eng.read_fields(batch))
    assert eng.take_changed().tolist() == [0, 1] and eng.take_changed().tolist() == []
    quiet, beats, t = 0, [], START_MS
    while t < START_MS + 45 * 60_000:  # y busy, x silent: no_data 5 min after its last event
        t += 30_000
        out = eng.process((batch := [ev("y", t)]), low_watermark_ms=t, fields=eng.read_fields(batch)).verdicts
        changed = eng.take_changed().tolist()
        assert 1 in changed  # y had an event
        x_out = [v for v in out if v.channel == "x"]
        if eng.machines[0].state == "no_data" and x_out == [] and 0 not in changed:
            quiet += 1
        if eng.machines[0].reasons == ["no_data"] and t - START_MS > eng.policy.no_data_after_ms + 60_000:
            assert (0 in changed) == bool(x_out), f"at {t - START_MS} ms: flag {0 in changed}, verdicts {x_out}"
            beats += [v.ts_ms for v in x_out]
    heartbeat = eng.policy.no_data_heartbeat_ms
    assert len(beats) == 4 and all(b2 - b1 == heartbeat for b1, b2 in zip(beats, beats[1:]))
    assert quiet == 76  # of 90 rounds: all but the 10 up to its no_data verdict at 5 min and its 4 heartbeats


def test_take_changed_adds_the_refresh_share_and_checks_its_arguments() -> None:
    eng = Engine()
    eng.grow(10)
    eng.store.reserve(10)
    for i in range(10):
        eng.store.channel_index(f"c{i}", "r", None)
    eng.changed[:] = False
    eng.mark_changed([4])
    assert eng.take_changed(0, None, refresh_every=3, refresh_phase=2).tolist() == [2, 4, 5, 8]
    assert eng.take_changed(3, 9, refresh_every=3, refresh_phase=1).tolist() == [4, 7]
    assert eng.take_changed(3, 9).tolist() == []
    with pytest.raises(ValueError):
        eng.take_changed(-1)
    with pytest.raises(ValueError):
        eng.take_changed(0, None, refresh_every=-1)
