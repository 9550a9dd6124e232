"""A chunk's channels and failure counts found by ``np.bincount`` (many events per channel) or by a sort
(few) give the same verdicts, bit for bit, on seeded streams with failure bursts and every batch size."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

import pipeline.engine.core as engine_module
from pipeline.contracts import RequestEvent
from pipeline.engine import Engine
from pipeline.tools.bench import workload as W


def _run(events: list[RequestEvent], sizes: list[int], dense_per_channel: int, monkeypatch) -> tuple[list, Engine]:
    monkeypatch.setattr(engine_module, "DENSE_EVENTS_PER_CHANNEL", dense_per_channel)
    eng = Engine()
    out, i = [], 0
    for size in sizes:
        out.extend(msgspec.json.encode(v) for v in eng.process(events[i:i + size], low_watermark_ms=0,
                                                               fields=eng.read_fields(events[i:i + size])).verdicts)
        i += size
    return out, eng


@pytest.mark.parametrize("seed", range(3))
def test_bincount_and_sort_paths_give_the_same_verdicts(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    ch = W.Channels.make(40, seed=seed)
    start = 1_767_000_000_000 - 1_767_000_000_000 % 3_600_000
    raw = W.stream(ch, 12_000, start, 5.0, seed=seed + 1, id_prefix="d")  # 60 s of event time
    for e in raw:  # bursts of failures on a few channels: pre-trips and non-zero failure counts
        if e["channel"] in ch.names[:4] and rng.random() < 0.6:
            e.pop("ttft_ms", None)
            e.pop("cost_usd", None)
            e["status"] = "error"
    events = [msgspec.convert(e, RequestEvent) for e in raw]
    sizes, left = [], len(events)
    while left:
        sizes.append(min(left, int(rng.choice([1, 3, 40, 400, 2000]))))
        left -= sizes[-1]
    dense, eng_d = _run(events, sizes, 10**9, monkeypatch)
    sparse, eng_s = _run(events, sizes, 0, monkeypatch)
    assert sum(b'"open"' in v for v in dense) >= 4  # the bursts opened circuits
    assert len(dense) > 40 and dense == sparse
    assert eng_d.fail_since_eval.tobytes() == eng_s.fail_since_eval.tobytes()
    assert eng_d.judged_since_eval.tobytes() == eng_s.judged_since_eval.tobytes()
