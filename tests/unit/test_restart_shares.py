"""A restart continues a route's traffic shares and the probe's baseline exactly (issue #15 item 2).

Guarantee checked: an engine restored from its channels' snapshots and fed the same calls as the engine
that never stopped publishes byte-identical verdicts (``route_share`` included) and ends with identical
channel state, for restarts all along a recovery ramp: at each round boundary between the two channels' calls, and after every fourth round on a two-channel route: the
growth bound of SPEC §4 (shares grow at most 1.5× per round, :func:`pipeline.policy.routes.bounded_shares`)
binds there, and the route's two channels reach each round boundary in different calls, so some restarts
fall inside a round in progress. Without the route's shares in the snapshots the first round after a
restart would start without the bound (a jump of the recovering channel's share); without the judged
requests since the last round the probe's pre-incident baseline would lose up to a round of requests.
"""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from pipeline.contracts import RequestEvent
from pipeline.engine import Engine
from pipeline.engine.state_io import machine_dict
from pipeline.ingest.structure import resolve_onto
from pipeline.state.channel_state import MAX_SAVED_ROUTE
from pipeline.policy.routes import MIN_GROWTH_ABS
from pipeline.state.snapshot import decode_snapshot, export_channel, import_channel

HOUR = 3_600_000
T0 = 1_750_000_000_000 - 1_750_000_000_000 % HOUR
TRIP_MS = T0 + 10 * 60_000  # x fails 12 times in a row from here: consecutive_failures opens it
_enc = msgspec.json.Encoder()


def _calls(seed: int = 5, minutes: int = 26) -> list[list[RequestEvent]]:
    """Per 30 s round, x's events in one call and y's in the next (both on route "r", 1 request/s each)."""
    rng = np.random.default_rng(seed)
    calls = []
    for span in range(minutes * 2):
        for ch, offset in (("x", 0), ("y", 400)):
            events = []
            for k in range(30):
                ts = T0 + span * 30_000 + k * 1_000 + offset
                failing = ch == "x" and TRIP_MS <= ts < TRIP_MS + 12_000
                events.append(RequestEvent(event_id=f"{ch}{ts}", ts_ms=ts, channel=ch, route="r",
                                           status="error" if failing else "ok",
                                           latency_ms=float(rng.lognormal(5.0, 0.3)), tier="paid"))
            resolve_onto(events)
            calls.append(events)
    return calls


def final_state(eng: Engine) -> dict:
    """Per channel: its machine (the probe's baseline included), ``seq``, the round's judged and failed
    requests, and its route's shares (without the version, which counts changes, not state)."""
    out = {}
    for name, i in eng.channel_rows.items():
        shares = eng.routes.export_route_shares(i)
        out[name] = (machine_dict(eng.machines[i]), eng.seq[i], float(eng.judged_since_eval[i]),
                     float(eng.fail_since_eval[i]),
                     None if shares is None else (shares.shares, shares.round_ms, shares.round_start))
    return out


@pytest.fixture(scope="module")
def reference():
    calls = _calls()
    eng = Engine()
    out, states = [], []
    for events in calls:
        out.append([_enc.encode(v) for v in eng.process(events, low_watermark_ms=0,
                                                        fields=eng.read_fields(events)).verdicts])
        states.append([export_channel(eng, i) for i in range(eng.store.n_channels)])
    return calls, out, states, final_state(eng)


def test_the_stream_ramps_x_back_under_the_growth_bound(reference):
    calls, out, _, _ = reference
    x = [msgspec.json.decode(b) for per_call in out for b in per_call if b"\"channel\":\"x\"" in b]
    states = [v["state"] for v in x]
    assert {"open", "half_open", "recovering", "healthy"} <= set(states)
    shares = [v["metrics"]["route_share"] for v in x if v["state"] == "recovering"]
    # the bound binds: a round raises x's share by the most it may (MIN_GROWTH_ABS above 1.5x here), short
    # of its target, which a later round reaches (0.2 / 1.2 at weights 0.2 and 1.0)
    held = [(a, b) for a, b in zip(shares, shares[1:]) if b == pytest.approx(max(1.5 * a, a + MIN_GROWTH_ABS))]
    assert held == [(pytest.approx(1 / 11), pytest.approx(1 / 11 + MIN_GROWTH_ABS))]
    assert pytest.approx(1 / 6) in shares


def test_a_restart_between_any_two_calls_of_the_ramp_changes_nothing(reference):
    calls, out, states, final = reference
    n_calls = len(calls)
    # each x call reaches a round boundary (x's round: the route's round in progress until y's call)
    rounds = [k for k in range(n_calls) if TRIP_MS + 2 * 60_000 <= calls[k][0].ts_ms < TRIP_MS + 16 * 60_000
              and calls[k][0].channel == "x"]
    assert len(rounds) == 28 and all(calls[k][0].ts_ms % 30_000 == 0 for k in rounds)
    # inside each round in progress (x stepped, y not yet), and after every fourth round
    for cut in sorted([k + 1 for k in rounds] + [k + 2 for k in rounds[::4]]):
        restored = Engine()
        for blob in states[cut - 1]:
            import_channel(restored, decode_snapshot(blob))
        got = [[_enc.encode(v) for v in restored.process(events, low_watermark_ms=0,
                                                         fields=restored.read_fields(events)).verdicts]
               for events in calls[cut:]]
        assert got == out[cut:], f"restart after call {cut}"
        assert final_state(restored) == final, f"restart after call {cut}"


def test_a_change_of_the_shares_flags_every_channel_of_the_route_for_its_snapshot():
    """A capture of changed channels only must re-save y's record when x's round moves the route's shares,
    though y had no event (else a restart would find only y's older shares)."""
    calls = _calls()
    k = next(i for i, c in enumerate(calls) if c[0].channel == "x" and c[0].ts_ms == TRIP_MS + 330_000)
    eng = Engine()
    for events in calls[:k]:
        eng.process(events, low_watermark_ms=0, fields=eng.read_fields(events))
    eng.take_changed()
    before = eng.routes.export_route_shares(1)
    eng.process(calls[k], low_watermark_ms=0,
                fields=eng.read_fields(calls[k]))  # x's round at 15.5 min: its share grows under the bound
    assert eng.take_changed().tolist() == [0, 1]
    after = eng.routes.export_route_shares(1)
    assert after.version == before.version + 1 and after.shares["x"] == pytest.approx(1 / 11 + MIN_GROWTH_ABS)
    eng.process(calls[k + 1], low_watermark_ms=0,
                fields=eng.read_fields(calls[k + 1]))  # y's round at the same boundary: the same shares
    assert eng.take_changed().tolist() == [1] and eng.routes.export_route_shares(0) == after


def test_the_newest_of_the_route_records_wins_on_restore(reference):
    calls, _, states, _ = reference
    k = next(i for i, c in enumerate(calls) if c[0].channel == "x" and c[0].ts_ms == TRIP_MS + 330_000)
    old_y, new_x = states[k - 1][1], states[k][0]  # y saved before x's round moved the shares, x after it
    assert decode_snapshot(old_y).route_shares.version + 1 == decode_snapshot(new_x).route_shares.version
    for order in ((old_y, new_x), (new_x, old_y)):
        eng = Engine()
        rows = {import_channel(eng, decode_snapshot(blob)) for blob in order}
        assert rows == {0, 1}
        assert eng.routes.export_route_shares(0) == eng.routes.export_route_shares(1)
        assert eng.routes.export_route_shares(0).version == decode_snapshot(new_x).route_shares.version


def test_a_route_larger_than_the_saved_limit_is_not_in_the_records():
    eng = Engine()
    n = MAX_SAVED_ROUTE + 1
    events = [RequestEvent(event_id=f"e{k}", ts_ms=T0 + k, channel=f"c{k}", route="big", status="ok",
                           latency_ms=100.0, tier="paid") for k in range(n)]
    eng.process(events, low_watermark_ms=0, fields=eng.read_fields(events))
    eng.routes.after_round(np.arange(n), T0 + 30_000)
    assert len(eng.routes.prev_shares["big"]) == n and eng.routes.export_route_shares(0) is None
    small = Engine()
    small.process(events[:MAX_SAVED_ROUTE], low_watermark_ms=0, fields=small.read_fields(events[:MAX_SAVED_ROUTE]))
    small.routes.after_round(np.arange(MAX_SAVED_ROUTE), T0 + 30_000)
    assert len(small.routes.export_route_shares(0).shares) == MAX_SAVED_ROUTE
