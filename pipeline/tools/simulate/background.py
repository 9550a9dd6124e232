"""Pieces every scenario module shares: the healthy background route and the "never bad" expectation."""

from __future__ import annotations

from .channels import ChannelProfile, RouteSpec
from .scenario import BAD_STATES


def never_bad(channel: str, to_s: float, from_s: float = 0) -> dict:
    """Expectation: ``channel`` is never in a bad state between ``from_s`` and ``to_s`` (scenario seconds)."""
    return {"channel": channel, "never_in": list(BAD_STATES), "from_s": from_s, "to_s": to_s}


def chat_8b(peak_rps: float, error_rate: float | None = None) -> tuple[RouteSpec, tuple[ChannelProfile, ...]]:
    """A background route ``chat-8b``: a paid and a free channel, healthy."""
    chans = (
        ChannelProfile("together/llama-8b@paid", "chat-8b", "paid", latency_source="together_7b",
                       latency_ms=900.0, error_rate=error_rate,
                       price_in_usd_per_mtok=0.18, price_out_usd_per_mtok=0.18),
        ChannelProfile("groq/llama-8b@free", "chat-8b", "free", latency_source="groq_70b",
                       latency_ms=450.0, error_rate=error_rate,
                       price_in_usd_per_mtok=0.05, price_out_usd_per_mtok=0.08),
    )
    return RouteSpec("chat-8b", peak_rps, {c.name: 0.5 for c in chans}), chans
