"""Synthetic gateway traffic for the throughput benchmark.

``n_channels`` channels (default 1,000) in routes of 5, a third of them on the
free tier, each with its own log-normal latency (median 150..1,500 ms), a
0.2 % failure rate and a small share of structured answers checked by the
gateway (``expected_fields`` + ``missing_fields``), so every detector has
work. Events are the same small JSON objects a gateway sends (about 260
bytes each), generated column-wise with numpy and encoded with msgspec.

The same events are published twice (:mod:`pipeline.tools.bench.fill`): in batch
envelopes ``{"events": [...]}`` of 500 and one event per message.

:func:`warmup_day` is a compact 24 h of history (``per_hour`` events per
channel and hour, packed into the first seconds of each hour) used to fill
every channel's 24 h latency baseline before measuring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

ROUTE_SIZE = 5
_STATUS = ("ok", "error", "timeout", "rate_limited", "cancelled")
_HTTP = (200, 502, 504, 429, 499)
_STATUS_P = np.array([0.9965, 0.001, 0.0005, 0.0005, 0.0015])
_GATEWAYS = ("gw-eu-1", "gw-eu-2", "gw-us-1")
_FIELDS = ["answer", "sources", "confidence"]


@dataclass(frozen=True)
class Channels:
    """Names, routes, tiers and latency medians of the synthetic channels."""

    names: list[str]
    routes: list[str]
    tiers: list[str]
    median_ms: np.ndarray

    @classmethod
    def make(cls, n: int, seed: int = 0) -> "Channels":
        """``n`` >= 1 channels, deterministic for a seed."""
        if n < 1:
            raise ValueError(f"need at least one channel, got {n}")
        rng = np.random.default_rng(seed)
        tiers = ["free" if i % 3 == 0 else "paid" for i in range(n)]
        names = [f"prov{i % 17}/model-{i:04d}@{tiers[i]}" for i in range(n)]
        routes = [f"route-{i // ROUTE_SIZE:03d}" for i in range(n)]
        return cls(names, routes, tiers, rng.uniform(150.0, 1500.0, n))

    def __len__(self) -> int:
        return len(self.names)


def _columns(ch: Channels, ts_ms: np.ndarray, chan: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    n = ts_ms.shape[0]
    status = rng.choice(len(_STATUS), size=n, p=_STATUS_P / _STATUS_P.sum())
    lat = ch.median_ms[chan] * np.exp(rng.normal(0.0, 0.35, n))
    lat = np.where(status == 0, lat, lat * 0.2)
    return {
        "status": status,
        "latency": np.round(lat, 1),
        "ttft": np.round(lat * 0.25, 1),
        "inp": rng.integers(20, 4000, n),
        "out": rng.integers(1, 800, n),
        "gw": rng.integers(0, len(_GATEWAYS), n),
        "structured": rng.random(n) < 0.1,
        "missing": rng.random(n) < 0.002,
    }


def events(ch: Channels, ts_ms: np.ndarray, chan: np.ndarray, seed: int, id_prefix: str,
           id_start: int = 0) -> list[dict]:
    """Event dicts (SPEC §3) for the given event times and channel indices (same length).

    ``event_id`` is ``f"{id_prefix}-{id_start + i:09d}"``.
    """
    rng = np.random.default_rng(seed)
    c = _columns(ch, ts_ms, chan, rng)
    names, routes, tiers = ch.names, ch.routes, ch.tiers
    out = []
    cols = zip(ts_ms.tolist(), chan.tolist(), c["status"].tolist(), c["latency"].tolist(), c["ttft"].tolist(),
               c["inp"].tolist(), c["out"].tolist(), c["gw"].tolist(), c["structured"].tolist(),
               c["missing"].tolist())
    for i, (ts, k, st, lat, ttft, inp, outp, gw, structured, missing) in enumerate(cols):
        e = {"event_id": f"{id_prefix}-{id_start + i:09d}", "ts_ms": ts, "channel": names[k], "route": routes[k],
             "status": _STATUS[st], "latency_ms": lat, "gateway_id": _GATEWAYS[gw], "tier": tiers[k],
             "http_status": _HTTP[st], "input_tokens": inp, "output_tokens": outp}
        if st == 0:
            e["ttft_ms"] = ttft
            e["cost_usd"] = round(inp * 1e-7 + outp * 4e-7, 8)
            if structured:
                e["expected_fields"] = _FIELDS
                e["missing_fields"] = ["sources"] if missing else []
        out.append(e)
    return out


def stream_chunks(ch: Channels, n_events: int, start_ms: int, rps_per_channel: float, seed: int = 1,
                  id_prefix: str = "bench", chunk: int = 100_000) -> Iterator[list[dict]]:
    """``n_events`` events from ``start_ms`` on, every channel at ``rps_per_channel`` on average
    (event time), time-ordered, in lists of up to ``chunk`` (so a million events never sit in memory
    as dicts at once)."""
    if rps_per_channel <= 0:
        raise ValueError("rps_per_channel must be > 0")
    rng = np.random.default_rng(seed)
    total_rps = rps_per_channel * len(ch)
    ts = start_ms + np.sort(rng.uniform(0.0, n_events / total_rps * 1000.0, n_events)).astype(np.int64)
    chan = rng.integers(0, len(ch), n_events)
    for i in range(0, n_events, chunk):
        yield events(ch, ts[i:i + chunk], chan[i:i + chunk], seed + 1 + i, id_prefix, id_start=i)


def stream(ch: Channels, n_events: int, start_ms: int, rps_per_channel: float, seed: int = 1,
           id_prefix: str = "bench") -> list[dict]:
    """All of :func:`stream_chunks` as one list."""
    return [e for part in stream_chunks(ch, n_events, start_ms, rps_per_channel, seed, id_prefix) for e in part]


def span_ms(n_events: int, n_channels: int, rps_per_channel: float) -> float:
    """Event time covered by ``n_events`` at ``rps_per_channel`` per channel, ms.

    >>> span_ms(1_000_000, 1000, 10.0)
    100000.0
    """
    return n_events / (rps_per_channel * n_channels) * 1000.0


def warmup_day(ch: Channels, end_ms: int, per_hour: int = 25, seed: int = 2,
               lead_in: int = 10) -> Iterator[list[dict]]:
    """The 24 complete hours before ``end_ms``'s hour, then a lead-in: 25 batches.

    Each hour holds ``per_hour`` events per channel in its first 20 s:
    enough ``ok`` samples (~600 per channel at the default) to give every
    channel a full 24 h baseline (the policy needs 500), at a fraction of a
    day's volume. The lead-in puts ``lead_in`` events per channel in the 60 s
    before ``end_ms`` (which must lie at least 60 s into its hour), so the
    measured traffic continues a live stream instead of waking every channel
    from an hour of silence.
    """
    n = len(ch)
    hour_now = end_ms // 3_600_000
    if end_ms - hour_now * 3_600_000 < 60_000:
        raise ValueError("end_ms must lie at least 60 s into its hour")
    for h in range(24, -1, -1):
        rng = np.random.default_rng(seed + h)
        k = per_hour if h else lead_in
        t0, width = ((hour_now - h) * 3_600_000, 20_000) if h else (end_ms - 60_000, 59_000)
        chan = rng.permutation(np.repeat(np.arange(n), k))
        ts = t0 + np.sort(rng.integers(0, width, n * k))
        yield events(ch, ts, chan, seed + 100 + h, f"warm{h:02d}")
