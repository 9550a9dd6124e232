"""A restart inside an ``open`` channel's re-admission success run continues the run (issue #33 leftovers,
:mod:`pipeline.policy.readmit`, SPEC §4.2).

Stream (tests/unit/test_readmit.py ``_outage(1410)``): route r, primary and backup at 4 req/s each; the
primary answers 503 from 900 s to 1410 s, the backup takes the route and sheds 429s (capped: a peer over
its ``max_share``); from 1410 s the primary's own requests succeed, and the 10th success in a row
(``readmit_success_run``) makes it ``half_open`` at 1412.25 s (+ its fixed offset).

Guarantee checked: an engine restored from every channel's snapshot at a cut inside that run (after 2, 7
or 9 of the 10 successes) and fed the rest of the stream publishes byte-identical verdicts to the engine
that never stopped (same re-admission instant, same shares) and ends with the same machines. On the code
before (main at 2238c9e: ``Engine.ok_runs`` in no snapshot) the restored run counted from zero, so the
primary went ``half_open`` 2, 7 or 9 requests (0.5-2.25 s) later: each of the three restarts fails there.
"""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from pipeline.engine import Engine
from pipeline.engine.replay import replay
from pipeline.engine.state_io import machine_dict
from pipeline.state.snapshot import ROUND_STATE, SnapshotError, decode_snapshot, export_channel, import_channel

from tests.unit.test_error_class_policy import T0
from tests.unit.test_readmit import _outage

PRIMARY, BACKUP = "p/m@paid", "b/m@paid"
#: The primary's fixed offset in the stream (ms): its events are at T0 + 250 ms * i + this.
OFFSET_MS = sum(map(ord, PRIMARY)) % 50
_enc = msgspec.json.Encoder()


def _split(cut_s: float) -> tuple[list[dict], list[dict]]:
    events = _outage(1410)
    cut = T0 + int(cut_s * 1000)
    return [e for e in events if e["ts_ms"] < cut], [e for e in events if e["ts_ms"] >= cut]


def _final(eng: Engine) -> dict:
    return {name: (machine_dict(eng.machines[i]), eng.seq[i]) for name, i in eng.channel_rows.items()}


@pytest.fixture(scope="module", params=[(1410.5, 2), (1411.75, 7), (1412.2, 9)], ids=["run2", "run7", "run9"])
def cut(request):
    """One cut inside the success run: the engine fed the stream up to it, the rest of the stream, the
    verdicts of the engine that never stopped after the cut and its final machines, and the run at the cut."""
    cut_s, run = request.param
    before, after = _split(cut_s)
    eng, _ = replay(before)
    _, rest = replay(after, engine=eng)
    # records taken at the cut, from a second engine fed the same first part (the reference kept going)
    at_cut, _ = replay(before)
    records = [export_channel(at_cut, i) for i in range(at_cut.store.n_channels)]
    return records, after, [_enc.encode(v) for v in rest], _final(eng), run


def test_the_record_at_the_cut_carries_the_run_and_only_the_open_channels(cut):
    records, _, _, _, run = cut
    saved = {(s := decode_snapshot(b)).channel: s.extensions.get(ROUND_STATE, {}) for b in records}
    assert np.frombuffer(saved[PRIMARY]["ok_run"][2], np.int64).tolist() == [run]
    assert "ok_run" not in saved[BACKUP]  # no run: the record is the one written before the field existed


def test_a_restart_inside_the_success_run_changes_no_verdict(cut):
    records, after, want, final, _ = cut
    restored = Engine()
    for blob in records:
        import_channel(restored, decode_snapshot(blob))
    assert restored.state.dropped_state == {}
    _, got = replay(after, engine=restored)
    assert [_enc.encode(v) for v in got] == want
    back = next(v for v in got if v.channel == PRIMARY and v.state != "open")
    assert (back.state, back.ts_ms) == ("half_open", T0 + 1_412_250 + OFFSET_MS)  # the 10th success
    assert _final(restored) == final


@pytest.mark.parametrize(("dtype", "value"), [
    ("<i8", np.array([-1], np.int64)),          # negative
    ("<i8", np.array([2**53 + 1], np.int64)),   # past 2**53
    ("<i8", np.array([3, 3], np.int64)),        # wrong shape
    ("<f8", np.array([3.0])),                   # wrong dtype
    ("|b1", np.array([True])),
])
def test_a_hostile_run_is_refused(cut, dtype, value):
    records, _, _, _, _ = cut
    snap = next(s for b in records if (s := decode_snapshot(b)).channel == PRIMARY)
    packed = snap.extensions[ROUND_STATE]
    bad = {**snap.extensions, ROUND_STATE: {**packed, "ok_run": (dtype, list(value.shape), value.tobytes())}}
    eng = Engine()
    with pytest.raises(SnapshotError, match="ok_run|success run"):
        import_channel(eng, msgspec.structs.replace(snap, extensions=bad))
    assert eng.ok_runs == {}
