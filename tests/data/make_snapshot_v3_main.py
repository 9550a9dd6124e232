"""Writes ``snapshot_v3_main.msgpack`` and ``snapshot_v3_main_expected.json``: version-3 snapshots of two
channels as main c047104 wrote them, the last code that kept the latency histograms, failure runs and
quality rings built into the window store (issue #31: they became signal windows).

Run once on that commit's code (``PYTHONPATH=<checkout of c047104> python tests/data/make_snapshot_v3_main.py``).
The engine sees 26 h of seeded traffic on two channels (latency, a quota level, TTFT and stream gaps,
costs, quality scores; one channel ends in a failure run); the record holds each channel's snapshot
bytes, the expected JSON every view feature at the end. ``tests/unit/test_snapshot_compat.py`` checks that
today's code restores the same features from these bytes and writes them back byte for byte.
"""

import json
from pathlib import Path

import msgspec
import numpy as np

from pipeline.contracts import RequestEvent
from pipeline.engine import Engine
from pipeline.state.snapshot import export_channel

HERE = Path(__file__).parent
HOUR = 3_600_000
T0 = 1_750_000_000_000 - 1_750_000_000_000 % HOUR
NAMES = ("fix/a@paid", "fix/b@free")
#: Event time of the view the expected features are read at (just after the last event).
END_MS = T0 + 26 * HOUR


def events() -> list[RequestEvent]:
    """26 h of traffic, one event per channel every 15 s; channel b's last 6 requests fail."""
    rng = np.random.default_rng(31)
    out = []
    n = 26 * HOUR // 15_000
    for k in range(n):
        ts = T0 + k * 15_000 + 7
        for j, name in enumerate(NAMES):
            fail = j == 1 and k >= n - 6
            out.append(RequestEvent(
                event_id=f"{name}-{k}", ts_ms=ts, channel=name, route="fix/route", tier="free" if j else "paid",
                status="error" if fail else "ok", http_status=500 if fail else 200,
                latency_ms=float(rng.lognormal(np.log(800 + 400 * j), 0.3)),
                ttft_ms=float(rng.lognormal(np.log(200), 0.2)), max_stream_gap_ms=float(rng.lognormal(np.log(50), 0.3)),
                output_tokens=int(rng.integers(50, 500)), cost_usd=float(rng.uniform(1e-4, 1e-3)),
                quota_remaining=max(0.0, 1.0 - k / n), account=f"acct-{j}"))
    return out


def main() -> None:
    """Replay the traffic, add quality scores, write both channels' snapshots and the expected view."""
    engine = Engine()
    evs = events()
    for s in range(0, len(evs), 2_000):
        engine.process(evs[s:s + 2_000])
    rng = np.random.default_rng(32)
    ts = [T0 + k * 60_000 for k in range(26 * 60)]
    for name in NAMES:
        engine.add_quality_scores([name] * len(ts), ts, rng.uniform(0.6, 0.9, len(ts)).tolist(), "fixture-v1")
    raws = [export_channel(engine, engine.channel_rows[name]) for name in NAMES]
    (HERE / "snapshot_v3_main.msgpack").write_bytes(msgspec.msgpack.encode(raws))
    view = engine.store.view(END_MS)
    fields = {k: getattr(view, k) for k in view.__dataclass_fields__ if k not in ("now_ms", "extra")}
    fields.update(view.extra)
    want = {k: [None if np.isnan(x) else float(x) for x in np.asarray(v, np.float64)] for k, v in fields.items()}
    (HERE / "snapshot_v3_main_expected.json").write_text(json.dumps({"now_ms": END_MS, "names": list(NAMES),
                                                                     "features": want}, indent=0) + "\n")


if __name__ == "__main__":
    main()
