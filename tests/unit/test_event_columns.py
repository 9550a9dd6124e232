"""EventColumns.column(): optional fields as float64 with NaN where absent, whatever the read path."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from pipeline.contracts import RequestEvent
from pipeline.windows.features import EventColumns


def _event(i: int, **extra: object) -> RequestEvent:
    return msgspec.convert({"event_id": f"e{i}", "ts_ms": 1_750_000_000_000 + i, "channel": "p/m@paid",
                            "route": "r", "status": "ok", "latency_ms": 100.0, **extra}, RequestEvent)


def _cols(events: list[RequestEvent]) -> EventColumns:
    z = np.zeros(len(events))
    return EventColumns(z, z, z, z, z, z, z, z, events=events)


@pytest.mark.parametrize("present", [
    [True] * 6,                              # every event has it: read straight into float64
    [True, True, True, True, True, False],   # absent at the end: the fallback re-reads
    [False, True, False, True, True, True],  # absent at the start: object conversion at once
    [False] * 6,
])
def test_column_values_and_nan(present: list[bool]) -> None:
    events = [_event(i, ttft_ms=10.0 * i, output_tokens=4_000_000_000 + i) if p else _event(i)
              for i, p in enumerate(present)]
    cols = _cols(events)
    ttft, tokens = cols.column("ttft_ms"), cols.column("output_tokens")
    want_ttft = np.array([10.0 * i if p else np.nan for i, p in enumerate(present)])
    want_tokens = np.array([float(4_000_000_000 + i) if p else np.nan for i, p in enumerate(present)])
    assert ttft.dtype == np.float64 and tokens.dtype == np.float64
    np.testing.assert_array_equal(ttft, want_ttft)
    np.testing.assert_array_equal(tokens, want_tokens)
    assert cols.column("ttft_ms") is ttft  # cached


def test_column_empty_and_unknown() -> None:
    cols = _cols([])
    assert cols.column("cost_usd").shape == (0,)
    with pytest.raises(KeyError):
        _cols([_event(0)]).column("latency")
