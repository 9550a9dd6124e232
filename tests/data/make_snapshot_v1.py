"""Writes ``snapshot_v1.msgpack`` + ``snapshot_v1_expected.json``: a version-1 channel snapshot as the
code at main 33f6279 wrote it (positional counters), and the window aggregates it restored to there.

Run once on that commit's code (``PYTHONPATH=<checkout of 33f6279> python tests/data/make_snapshot_v1.py``);
``tests/unit/test_snapshot_compat.py`` checks that today's code restores the same state from these bytes.
"""

import json
from pathlib import Path

import numpy as np

from pipeline.contracts import RequestEvent
from pipeline.engine import Engine
from pipeline.state.snapshot import decode_snapshot, export_channel, import_channel

HOUR = 3_600_000
T0 = 1_750_000_000_000 - 1_750_000_000_000 % HOUR
NOW = T0 + 3 * HOUR + 120_000 - 1  # 1 ms before a 30 s boundary: the 10 s and the 30 s latency rings span the same 5 min


def events() -> list[RequestEvent]:
    rng = np.random.default_rng(11)
    ts = np.sort(T0 + rng.integers(0, NOW - T0 - 5_000, 6_000))
    status = rng.choice(["ok", "error", "timeout", "rate_limited", "cancelled"], ts.size,
                        p=[0.9, 0.04, 0.02, 0.02, 0.02])
    out = []
    for i, (t, s) in enumerate(zip(ts.tolist(), status.tolist())):
        structured = s == "ok" and i % 3 == 0
        out.append(RequestEvent(event_id=f"v1-{i}", ts_ms=t, channel="snap/model@free", route="chat",
                                status=s, latency_ms=float(rng.lognormal(5.5, 0.5)), tier="free",
                                missing_fields=(["answer"] if i % 7 == 0 else []) if structured else None))
    return out


def main() -> None:
    here = Path(__file__).parent
    eng = Engine()
    evs = events()
    for k in range(0, len(evs), 500):
        eng.process(evs[k:k + 500])
    rng = np.random.default_rng(12)
    qts = [e.ts_ms for e in evs if e.status == "ok"][::4]
    eng.add_quality_scores(["snap/model@free"] * len(qts), qts, rng.beta(8, 2, len(qts)).tolist(), "q-v1")
    raw = export_channel(eng, 0)
    (here / "snapshot_v1.msgpack").write_bytes(raw)
    fresh = Engine()
    import_channel(fresh, decode_snapshot(raw))
    view = fresh.store.view(NOW)
    expected = {k: (np.asarray(v).tolist() if k != "now_ms" else v) for k, v in vars(view).items()}
    expected["machine"] = vars(fresh.machines[0])
    expected["seq"] = fresh.seq[0]
    expected["next_eval_ms"] = int(fresh.next_eval[0])
    (here / "snapshot_v1_expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True, default=str))


if __name__ == "__main__":
    main()
